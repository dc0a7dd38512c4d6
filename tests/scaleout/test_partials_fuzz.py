"""Fuzzing the partials decoder as the embeddings decoder is fuzzed (tests/decoding/test_fuzz_fields.py):
arbitrary bytes, and structured mutations of real partials records (their keys, headers, container
trees and manifests, re-signed or not). Whatever arrives, only a counted refusal comes out of the
reducer's table, and the merge of the genuine replicas' publications that follow stays exact."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout import signing
from monitor.scaleout.partials import KIND_HEADER, MANIFEST, PartialError
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.table import MergeTable
from monitor.state.registry import StateRegistry
from monitor.storage import checkpoint_format as ckpt
from tests.support.scaleout import MemoryProducer, feed

T0 = 2_000_000.0
NOW = T0 + 250
DIM = 6
KEY = "k" * 40
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))  # fmt: skip
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
WEIRD = (math.inf, -math.inf, math.nan, -1, 2**40, 2**63, 2**64 - 1, -(2**70), 0, 1.5, True, None, "x", "", [], {},
         [1, 2], "\udcff", 10**6)


def _settings(key_file: Path, replica: str = "reducer"):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "scale_out": {"replica_id": replica, "max_record_bytes": 16_384, "partials_key_file": str(key_file)},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 60}, "drift": {"window_sample_size": 20},
    })


def _publication(key_file: Path, replica: str, stream: str, single: StateRegistry | None, seed: int) -> list[Record]:
    registry = StateRegistry(_settings(key_file, replica))
    producer = MemoryProducer()
    publisher = PartialsPublisher(_settings(key_file, replica), producer_factory=lambda: producer, clock=lambda: NOW)
    rng = np.random.default_rng(seed)
    for t in np.arange(0.0, 250.0, 50.0):
        batch = EmbeddingBatch("m", stream, rng.standard_normal((12, DIM)).astype(np.float32) + seed,
                               ids=[f"{replica}-{t}-{i}" for i in range(12)],
                               pair_ids=[f"p{i // 2}" for i in range(12)])
        registry.apply(batch, T0 + t)
        if single is not None:
            single.apply(batch, T0 + t)
    publisher.stage(publisher.epochs.next(), {("embeddings", seed): 100 * seed}, registry.state_dict()["streams"])
    assert publisher.flush()
    return [(k, v, list(h)) for k, v, h in producer.take()]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    key_file = tmp_path_factory.mktemp("keys") / "partials.key"
    key_file.write_text(KEY + "\n")
    single = StateRegistry(_settings(key_file))
    genuine = [_publication(key_file, f"g{i}", "s", single, i + 1) for i in range(2)]
    victim = _publication(key_file, "r0", "fuzz", None, 9)  # what the mutations start from
    return {"key_file": key_file, "single": single, "genuine": genuine, "victim": victim,
            "settings": _settings(key_file)}


def _leaves(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(tree, list) and tree and len(tree) <= 8:
        return [p for i, v in enumerate(tree) for p in _leaves(v, (*path, i))]
    return [path]


def _replace(tree: Any, path: tuple[Any, ...], value: Any) -> None:
    for step in path[:-1]:
        tree = tree[step]
    if path:
        tree[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn, victim: list[Record]) -> Record:
    """One record: arbitrary bytes, or a real one with a byte, header, tree leaf or manifest field changed;
    re-signed (so the decoder behind the signature sees it) or not."""
    key, value, headers = draw(st.sampled_from(victim))
    how = draw(st.sampled_from(("bytes", "flip", "headers", "tree", "manifest", "key")))
    if how == "bytes":
        key = draw(st.one_of(st.none(), st.binary(max_size=64), st.sampled_from([key])))
        value = draw(st.one_of(st.none(), st.binary(max_size=512)))
        headers = draw(st.lists(st.tuples(st.sampled_from(["embmon-kind", "embmon-epoch", "embmon-chunk", "x"]),
                                          st.binary(max_size=24)), max_size=5))
    elif how == "flip" and value:
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + bytes([value[at] ^ draw(st.integers(1, 255))]) + value[at + 1:]
    elif how == "headers":
        name = draw(st.sampled_from(["embmon-kind", "embmon-epoch", "embmon-chunk"]))
        raw = draw(st.one_of(st.binary(max_size=24), st.sampled_from(
            [b"1/0", b"0/99999999999", b"-1/2", b"\xd9\xa3", b"inf", str(2**64).encode(), b"0/1/2", b""])))
        headers = [(n, raw if n == name else v) for n, v in headers]
    elif how == "tree" and value is not None and dict(headers).get(KIND_HEADER) != MANIFEST.encode():
        try:
            arrays: list[np.ndarray] = []
            flat = ckpt.flatten(ckpt.decode(value), arrays)
        except ckpt.CheckpointError:
            flat = None
        if flat is not None:
            _replace(flat, draw(st.sampled_from(_leaves(flat))), draw(st.sampled_from(WEIRD)))
            value = ckpt.encode(flat, arrays)
    elif how == "manifest" and value is not None and dict(headers).get(KIND_HEADER) == MANIFEST.encode():
        data = orjson.loads(value)
        _replace(data, draw(st.sampled_from(_leaves(data))), draw(st.sampled_from(WEIRD)))
        value = json.dumps(data).encode()  # NaN, Infinity and integers of any size as JSON text
    elif how == "key" and key is not None:
        parts = orjson.loads(key)
        parts[draw(st.integers(0, len(parts) - 1))] = draw(st.sampled_from(WEIRD[3:]))
        key = json.dumps(parts).encode()
    if draw(st.booleans()):
        headers = list(signing.sign((KEY.encode(),), key, value, headers))
    return key, value, headers


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_the_partials_decoder_refuses_and_counts_whatever_arrives_and_the_merge_stays_exact(world: dict[str, Any]
                                                                                         ) -> None:
    refusals = []

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        table = MergeTable(world["settings"], clock=lambda: NOW)
        records = data.draw(st.lists(mutated(world["victim"]), min_size=1, max_size=8))
        refused = 0
        for offset, (key, value, headers) in enumerate(records):
            try:
                table.offer_record(key, value, headers, ("partials", 0, offset))
            except PartialError:  # nothing else may come out
                refused += 1
        ignored = table.status(NOW).ignored
        assert sum(ignored.values()) >= refused
        for publication in world["genuine"]:
            feed(table, publication, first_offset=100)
        merged, alone = table.snapshot_windows(NOW)[("m", "s")], world["single"].snapshot_windows(NOW)[("m", "s")]
        assert merged.records == alone.records and merged.alignment_pairs == alone.alignment_pairs
        np.testing.assert_allclose(merged.stats.gram, alone.stats.gram, rtol=1e-12)
        assert {r.replica for r in table.status(NOW).replicas} >= {"g0", "g1"}
        refusals.append(refused)

    run()
    assert sum(refusals) > 300  # the mutations reach the refusals (most examples hold several)
