"""Hostile input: >= 100,000 generated messages through the decoders (hypothesis-generated and
mutation-fuzzed JSON, binary batches with random headers, interactions), plus a label-cardinality
attack through the whole daemon. Nothing may raise, every record is accounted for by a reason in
REASONS, and the number of exported series stays bounded."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.decoding.decoder import REASONS, Decoder, DecodeResult
from monitor.decoding.settings import LimitSettings
from monitor.sources.base import SourceMessage
from tests.support import daemons

LIMITS = LimitSettings(max_message_bytes=64 * 1024, max_dimension=512, max_rows_per_message=1000)
SEEN = Counter()

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=80),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=10), inner, max_size=6),
    max_leaves=25,
)
labels = st.one_of(st.sampled_from(["m1", "m2", "docs", "q"]), st.text(max_size=70))
vectors = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=20),
    st.lists(json_scalars, max_size=6),
    json_values,
)
events = st.fixed_dictionaries(
    {},
    optional={"id": st.one_of(st.text(max_size=20), st.integers(), json_values), "model": labels, "stream": labels,
              "vector": vectors, "ts": json_values, "slice": labels, "pair_id": json_values, "extra": json_values},
)


def as_bytes(doc: object) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


json_messages = st.one_of(
    events.map(as_bytes), st.lists(events, max_size=5).map(as_bytes), json_values.map(as_bytes), st.binary(max_size=300)
)
header_values = st.one_of(st.binary(max_size=12), st.sampled_from([b"m1", b"4", b"8", b"-1", b"99999999", b"x"]))
binary_messages = st.tuples(
    st.binary(max_size=400),
    st.lists(st.tuples(st.sampled_from(["model", "dim", "stream", "other"]), header_values), max_size=4),
)


def expected_min_records(value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """A lower bound of the records in one message: 1, except an empty JSON array (0 records)."""
    if value is None or len(value) > LIMITS.max_message_bytes or any(k == "dim" for k, _ in headers):
        return 1
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return 1
    return len(doc) if isinstance(doc, list) else 1


def check(
    decoder: Decoder, messages: list[tuple[bytes | None, list[tuple[str, bytes]]]], interactions: bool = False
) -> None:
    result: DecodeResult = (
        decoder.decode_interactions(messages) if interactions else decoder.decode_embeddings(messages)
    )
    assert set(reason for _, reason in result.rejected) <= set(REASONS)
    accepted = len(result.interactions) if interactions else sum(b.size for b in result.batches)
    # every record is either accepted or counted under a reason: nothing is silently dropped
    assert accepted + sum(result.rejected.values()) >= sum(expected_min_records(v, h) for v, h in messages)
    for batch in result.batches:
        assert batch.vectors.dtype == np.float32 and batch.vectors.shape[1] == decoder.dims[batch.model]
        assert np.isfinite(batch.vectors).all() and (batch.vectors != 0).any(axis=1).all()  # no overflowing sum
    SEEN["messages"] += len(messages)


def fresh_decoder() -> Decoder:
    return Decoder(LIMITS, declared_dims={"m2": 4})


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(json_messages, min_size=1, max_size=40), st.lists(binary_messages, max_size=20))
def test_hypothesis_messages_never_raise_and_are_all_accounted_for(json_batch: list[bytes], binary_batch: list) -> None:
    decoder = fresh_decoder()
    check(decoder, [(v, []) for v in json_batch])
    check(decoder, [(v, list(h)) for v, h in binary_batch])
    check(decoder, [(v, []) for v in json_batch], interactions=True)


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = rng.choice(
                [b"[", b"]", b"{", b"}", b",", b":", b'"', b"NaN", b"-1e999", b"\\u0000", b"null"]
            )
        elif op == 2:
            del data[pos : pos + rng.randint(1, 8)]
        elif op == 3:
            data = data[:pos]
        elif op == 4:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
        else:
            data = data + data[: rng.randint(0, 40)]
    return bytes(data)


def seeds(rng: np.random.Generator) -> list[bytes]:
    vec = rng.standard_normal(4).round(3).tolist()
    return [
        orjson.dumps({"id": "a", "model": "m1", "vector": vec, "stream": "docs", "slice": "s", "pair_id": "p"}),
        orjson.dumps([{"id": i, "model": "m2", "vector": vec, "ts": 1.5} for i in range(3)]),
        orjson.dumps({"model": "m1", "query_id": "q", "results": ["a", "b"], "clicks": ["a"], "relevance": {"a": 1},
                      "query_vector": vec, "slice": "s"}),
    ]


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_one_hundred_thousand_mutated_and_pathological_messages() -> None:
    rng, nprng = random.Random(7), np.random.default_rng(7)
    decoder = fresh_decoder()
    base = seeds(nprng)
    pathological: list[tuple[bytes | None, list[tuple[str, bytes]]]] = [
        (b"[" * 100_000 + b"]" * 100_000, []),  # deeply nested
        (b'{"a":' * 5000 + b"1" + b"}" * 5000, []),
        (b"x" * (LIMITS.max_message_bytes + 1), []),  # huge
        (orjson.dumps({"id": 1, "model": "m1", "vector": [0.5] * 100_000}), []),
        (orjson.dumps({"id": 1, "model": "m1", "vector": [0.5] * 4, "unknown": {"deep": [1, 2, {"x": None}]}}), []),
        (None, []),
        (np.ones((2000, 4), np.float32).tobytes(), [("model", b"m1"), ("dim", b"4")]),  # too many rows
        (np.ones((2, 4), np.float32).tobytes(), [("model", b"m1"), ("dim", b"4"), ("stream", "é".encode())]),
        (b"\xff\xfe\x00", [("model", b"\xff"), ("dim", b"\xff")]),
    ]
    check(decoder, pathological)
    total = 0
    while total < 100_000:
        poll: list[tuple[bytes | None, list[tuple[str, bytes]]]] = []
        for _ in range(200):
            kind = rng.randrange(3)
            if kind == 0:
                poll.append((mutate(rng, rng.choice(base)), []))
            else:
                rows = nprng.standard_normal((rng.randint(1, 4), 4)).astype(np.float32).tobytes()
                headers = [("model", rng.choice([b"m1", b"m2", b"bad model", b""])),
                           ("dim", rng.choice([b"4", b"3", b"0", b"-4", b"4.0", b"1e3"]))]
                if rng.random() < 0.3:
                    headers.append(("stream", rng.choice([b"s", b"x" * 80, b"\x00"])))
                poll.append((mutate(rng, rows) if kind == 2 else rows, headers))
        check(decoder, poll)
        check(decoder, [(v, []) for v, h in poll if not h], interactions=True)
        total += len(poll)
    assert SEEN["messages"] >= 100_000


def test_label_cardinality_attack_keeps_series_bounded(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={
            "source": "synthetic",
            "limits": {"max_models": 5, "max_streams_per_model": 3},
            "http": {"host": "127.0.0.1", "port": 0},
            "state_dir": str(tmp_path / "state"),
        }
    )
    vec = [0.1, 0.2, 0.3, 0.4]
    messages = []
    for i in range(3000):
        messages.append(SourceMessage(orjson.dumps({"id": i, "model": f"m{i}", "stream": f"s{i}", "slice": f"sl{i}",
                                                    "vector": vec}), (), "embeddings"))
        messages.append(SourceMessage(orjson.dumps({"model": f"m{i}", "stream": f"bad{i}"}), (), "embeddings"))
        messages.append(SourceMessage(orjson.dumps({"model": f"q{i}", "results": ["a"]}), (), "interactions"))
    # not started: records go straight through decode -> apply
    with daemons.stopped_after(Monitor(settings)) as monitor:
        for start in range(0, len(messages), 500):
            monitor.pipeline.apply_messages(messages[start : start + 500])
        monitor.refresh()
        text = generate_latest(monitor.metrics_registry).decode()
    series = [s for family in text_string_to_metric_families(text) for s in family.samples]
    models = {s.labels["model"] for s in series if "model" in s.labels}
    streams = {s.labels["stream"] for s in series if "stream" in s.labels}
    assert len(models) <= 5 and len(streams) <= 5 * 3 + 2  # + default stream and "_overflow"
    assert len(series) < 400
    invalid = monitor.status.invalid_counts()
    assert sum(invalid.values()) == 3000 * 3 - sum(s.records_total for s in monitor.registry) - sum(
        monitor.status.interaction_counts().values())
    assert invalid[("_overflow", "label_limit")] > 0 and invalid[("_overflow", "missing_field")] > 0
