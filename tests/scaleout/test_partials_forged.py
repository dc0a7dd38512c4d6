"""Forged and poisoned records on the partials topic: each refused before anything
of it is held, counted by reason, and the merge stays exactly one daemon's window afterwards."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from kafka import TopicPartition

from monitor.config import ConfigError, load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout import signing
from monitor.scaleout.export import Ownership
from monitor.scaleout.partials import (
    EPOCH_HEADER,
    KIND_HEADER,
    MANIFEST,
    SUBWINDOW,
    EpochClock,
    Manifest,
    PartialError,
    StreamManifest,
    WindowGeometry,
)
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.resume import ManifestReader
from monitor.scaleout.table import MergeTable
from monitor.state.registry import StateRegistry
from tests.support import scaleout
from tests.support.scaleout import (
    MemoryProducer,
    chunk_record,
    feed,
    forged_partial,
    huge_capacity,
    infinite_index,
    nan_alignment,
)

T0 = 2_000_000.0
DIM = 8
WINDOW = {"seconds": 600, "subwindows": 6, "reservoir_size": 300}
GEOMETRY = WindowGeometry(600.0, 6, 300, load_settings().quality.alignment_alpha)
KEY_A, KEY_B = "a" * 40, "b" * 40
Record = tuple[bytes, "bytes | None", list[tuple[str, bytes]]]


def key_file(tmp_path: Path, *keys: str) -> str:
    path = tmp_path / f"partials-{len(list(tmp_path.glob('partials-*')))}.key"
    path.write_text("# partials keys, the first signs\n" + "\n".join(keys) + "\n")
    return str(path)


def settings(replica: str = "reducer", extra: dict[str, Any] | None = None, **scale: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "scale_out": {"replica_id": replica, "max_record_bytes": 16_384, **scale},
        "window": WINDOW, "drift": {"window_sample_size": 100}, **(extra or {}),
    })


class Replica:
    """A registry and its publisher without Kafka; ``single`` sees every record of every replica."""

    def __init__(self, name: str, now: list[float], **scale: object):
        self.registry = StateRegistry(settings(name, **scale))
        self.producer = MemoryProducer()
        self.publisher = PartialsPublisher(settings(name, **scale), producer_factory=lambda: self.producer,
                                           clock=lambda: now[0])

    def ingest(self, single: StateRegistry, seed: int, at: float, model: str = "m", stream: str = "s") -> None:
        rng = np.random.default_rng(seed)
        batch = EmbeddingBatch(model, stream, rng.standard_normal((30, DIM)).astype(np.float32) + seed,
                               ids=[f"{seed}-{i}" for i in range(30)])
        self.registry.apply(batch, at)
        single.apply(batch, at)

    def publish(self, offsets: dict | None = None) -> list[Record]:  # type: ignore[type-arg]
        self.publisher.stage(self.publisher.epochs.next(), offsets or {}, self.registry.state_dict()["streams"])
        assert self.publisher.flush()
        return self.producer.take()


def fleet(now: list[float], count: int = 2, **scale: object) -> tuple[list[Replica], StateRegistry]:
    single = StateRegistry(settings())
    replicas = [Replica(f"r{i}", now, **scale) for i in range(count)]
    for step, t in enumerate(np.arange(0.0, 250.0, 25.0)):
        for i, replica in enumerate(replicas):
            replica.ingest(single, 100 * i + step, T0 + t)
    return replicas, single


def assert_exact(table: MergeTable, single: StateRegistry, at: float, key: tuple[str, str] = ("m", "s")) -> None:
    merged, alone = table.snapshot_windows(at)[key], single.snapshot_windows(at)[key]
    assert merged.records == alone.records and merged.live_subwindows == alone.live_subwindows
    np.testing.assert_allclose(merged.stats.gram, alone.stats.gram, rtol=1e-12)
    assert merged.alignment_sum == pytest.approx(alone.alignment_sum, rel=1e-12)


def forged(records: list[Record], change: Any) -> Record:
    return forged_partial(records, change)


def chunk(replica: str, model: str, stream: str, index: int, epoch: int, value: bytes, piece: str = "0/1") -> Record:
    return chunk_record(replica, model, stream, index, epoch, value, piece)


def manifest_record(replica: str, epoch: int, streams: tuple[StreamManifest, ...] = (),
                    offsets: dict[tuple[str, int], int] | None = None, geometry: WindowGeometry = GEOMETRY) -> Record:
    return scaleout.manifest_record(replica, epoch, geometry, streams, offsets)


def refused(table: MergeTable, record: Record, partition: int = 0) -> str:
    with pytest.raises(PartialError) as caught:
        table.offer_record(*record, ("partials", partition, 0))
    return caught.value.reason


def _set_dim(tree: dict[str, Any]) -> None:
    tree["subwindow"]["stats"]["dim"] = 10**6


def _set_epoch(tree: dict[str, Any]) -> None:
    tree["epoch"] = 2**64 - 1


def _set_other_replica(tree: dict[str, Any]) -> None:
    tree["replica"] = "r1"


@pytest.mark.parametrize(("change", "reason"), [
    (infinite_index, "corrupt"),  # an Infinity index: int() raised OverflowError, which halted the partition
    (huge_capacity, "oversize"),  # a reservoir of 2^40 rows allocated before anything was compared
    (nan_alignment, "corrupt"),  # a NaN alignment_sum was merged
    (_set_dim, "oversize"),  # a dimension beyond limits.max_dimension
    (_set_epoch, "epoch_range"),  # 2^64 - 1: every later publication failed (orjson overflow)
    (_set_other_replica, "corrupt"),  # the tree says another replica than the key
])
def test_a_poisoned_partial_is_refused_by_reason_and_the_merge_stays_exact(change: Any, reason: str) -> None:
    now = [T0 + 250]
    (r0, r1), single = fleet(now)
    table = MergeTable(settings(), clock=lambda: now[0])
    first = r0.publish()
    bad = forged(first, change)
    if change is _set_epoch:  # the header says the same epoch: refused before the container is read
        bad = (bad[0], bad[1], [*bad[2][:1], (EPOCH_HEADER, str(2**64 - 1).encode()), bad[2][2]])
    assert refused(table, bad) == reason
    assert table.status(now[0]).ignored == {reason: 1}
    assert table.status(now[0]).replicas == ()  # nothing of it is held: no replica slot, no pending piece
    feed(table, first)
    feed(table, r1.publish())
    assert refused(table, bad) == reason  # read again after the genuine ones: still refused, nothing moves
    assert_exact(table, single, now[0])


def test_a_3kb_partial_claiming_a_huge_reservoir_costs_no_memory(tmp_path: Path) -> None:
    """The forged partial that pinned 380 MB (a reservoir capacity no geometry allows) is refused before
    anything of its size is allocated: the process' memory does not grow (a fresh process, so nothing
    else moves it). Before the fix: 380 MB mapped and 79 MB resident at once (the ids), the rest as
    soon as the merge read it."""
    now = [T0 + 250]
    (r0,), _ = fleet(now, count=1)

    def huge(tree: dict[str, Any]) -> None:
        reservoir = tree["subwindow"]["reservoir"]
        reservoir["seen"] = min(reservoir["seen"], reservoir["capacity"])  # the rows it holds: a consistent state
        reservoir["capacity"] = 9_500_000  # x (8 float32 + an 8-byte id) = 380 MB

    key, value, headers = forged(r0.publish(), huge)
    assert value is not None and len(value) < 16_384
    (tmp_path / "record.bin").write_bytes(orjson.dumps(
        [key.decode(), value.hex(), [[n, v.decode()] for n, v in headers], WINDOW, now[0]]))
    script = textwrap.dedent("""
        import os, sys, orjson
        from monitor.config import load_settings
        from monitor.scaleout.partials import PartialError
        from monitor.scaleout.table import MergeTable
        key, value, headers, window, now = orjson.loads(open(sys.argv[1], "rb").read())
        settings = load_settings(overrides={"window": window, "drift": {"window_sample_size": 100}})
        table = MergeTable(settings, clock=lambda: now)
        def resident():  # (virtual, resident) bytes
            return [int(x) * os.sysconf("SC_PAGE_SIZE") for x in open("/proc/self/statm").read().split()[:2]]
        before = resident()
        reasons = []
        for offset in range(3):
            try:
                table.offer_record(key.encode(), bytes.fromhex(value), [(n, v.encode()) for n, v in headers],
                                   ("partials", 0, offset))
            except PartialError as exc:
                reasons.append(getattr(exc, "reason", "?"))
        after = resident()
        print(orjson.dumps({"mapped": after[0] - before[0], "grew": after[1] - before[1],
                            "reasons": reasons}).decode())
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "record.bin")], capture_output=True,
                          text=True, timeout=120, env=env, check=True, cwd=tmp_path)
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["grew"] < 32 * 2**20 and result["mapped"] < 64 * 2**20, result
    assert result["reasons"] == ["oversize"] * 3


def test_far_future_and_negative_epochs_neither_erase_a_replica_nor_stop_its_publications() -> None:
    now = [T0 + 250]
    (r0, r1), single = fleet(now)
    table = MergeTable(settings(), clock=lambda: now[0])
    feed(table, r0.publish())
    feed(table, r1.publish())
    now[0] += 30
    streams = (StreamManifest("m", "s", DIM, (), partition=0),)
    # under a real replica's name, an hour ahead: it would have replaced r0's publication (listing nothing)
    ahead = manifest_record("r0", int((now[0] + 3600) * 1e9), streams)
    assert refused(table, ahead) == "epoch_range"
    assert refused(table, manifest_record("r0", 2**64 - 1, streams)) == "epoch_range"
    assert_exact(table, single, now[0])
    assert {r.replica: r.age_seconds for r in table.status(now[0]).replicas}["r0"] == pytest.approx(30)
    # a replica that read such an epoch back never stops publishing: its clock ignores it
    clock = EpochClock(now=lambda: now[0])
    clock.advance_past(2**64 - 1)
    assert clock.next() == int(now[0] * 1e9)


def test_far_future_chunks_are_not_held_and_incomplete_ones_leave_with_the_window() -> None:
    now = [T0 + 250]
    table = MergeTable(settings(), clock=lambda: now[0])
    head = math.floor(now[0] / 100)
    epoch = int(now[0] * 1e9)
    far = chunk("r0", "m", "s", head + 10**6, epoch, b"x" * 100, "0/2")
    table.offer_record(*far, ("partials", 0, 5))
    assert table.status(now[0]).ignored == {"clock_skew": 1}
    assert table.assembler.holds() == {}  # it never pins the reducer's checkpointed position
    live = chunk("r0", "m", "s", head, epoch, b"x" * 100, "0/2")
    table.offer_record(*live, ("partials", 0, 6))
    assert table.assembler.holds() == {("partials", 0): 6}  # incomplete: read again after a restart
    now[0] += 700  # its sub-window left the window: the chunk goes, the position moves on
    table.forget_expired()
    assert table.assembler.holds() == {}
    assert table.status(now[0]).replicas == ()
    # a chunk count no sub-window of this geometry needs is refused before anything is held
    assert refused(table, chunk("r0", "m", "s", head + 7, int(now[0] * 1e9), b"x", f"0/{10**9}")) == "oversize"


def test_signed_publications_merge_and_unsigned_or_tampered_ones_are_refused(tmp_path: Path) -> None:
    now = [T0 + 250]
    keys = key_file(tmp_path, KEY_A)
    (r0, r1), single = fleet(now, partials_key_file=keys)
    table = MergeTable(settings(partials_key_file=keys), clock=lambda: now[0])
    first, second = r0.publish(), r1.publish()
    assert all(signing.MAC_HEADER in dict(h) for _, _, h in first + second)
    key, value, headers = first[0]
    assert refused(table, (key, value, [h for h in headers if h[0] != signing.MAC_HEADER])) == "unsigned"
    assert value is not None
    assert refused(table, (key, value[:-1] + bytes([value[-1] ^ 1]), headers)) == "bad_signature"
    other_epoch = [(EPOCH_HEADER, b"1") if n == EPOCH_HEADER else (n, v) for n, v in headers]
    assert refused(table, (key, value, other_epoch)) == "bad_signature"
    twice = [*headers, (signing.MAC_HEADER, dict(headers)[signing.MAC_HEADER])]
    assert refused(table, (key, value, twice)) == "bad_signature"
    # a forged manifest (no key) under a genuine replica's name moves nothing
    assert refused(table, manifest_record("r0", int(now[0] * 1e9))) == "unsigned"
    feed(table, first)
    feed(table, second)
    assert_exact(table, single, now[0])
    assert table.status(now[0]).ignored == {"unsigned": 2, "bad_signature": 3}


def test_key_rotation_accepts_every_listed_key_and_signs_with_the_first(tmp_path: Path) -> None:
    now = [T0 + 250]
    (old,), single = fleet(now, count=1, partials_key_file=key_file(tmp_path, KEY_A))
    records = old.publish()
    rotating = MergeTable(settings(partials_key_file=key_file(tmp_path, KEY_B, KEY_A)), clock=lambda: now[0])
    feed(rotating, records)
    assert_exact(rotating, single, now[0])
    rotated = MergeTable(settings(partials_key_file=key_file(tmp_path, KEY_B)), clock=lambda: now[0])
    assert refused(rotated, records[0]) == "bad_signature"
    (new,), _ = fleet(now, count=1, partials_key_file=key_file(tmp_path, KEY_B, KEY_A))
    mac = dict(new.publish()[0][2])[signing.MAC_HEADER]
    record = new.publish()
    assert refused(MergeTable(settings(partials_key_file=key_file(tmp_path, KEY_A)), clock=lambda: now[0]),
                   record[-1]) == "bad_signature"  # signed with B, the first line
    assert mac != dict(records[0][2])[signing.MAC_HEADER]


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "holds no key"), (b"short-key\n", "at least 32"), (b"\xff" * 40, "not UTF-8"),
])
def test_an_unusable_key_file_exits_2_naming_the_setting_never_the_key(tmp_path: Path, content: bytes,
                                                                       problem: str) -> None:
    path = tmp_path / "partials.key"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides={"scale_out": {"partials_key_file": str(path)}})
    assert "scale_out.partials_key_file" in str(caught.value) and problem in str(caught.value)
    assert "short-key" not in str(caught.value)


def test_a_replica_outside_the_configured_replica_set_exits_2_naming_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides={"scale_out": {"role": "replica", "replica_id": "r9", "replicas": ["r0", "r1"]}})
    assert "scale_out" in str(caught.value) and "'r9' is not in replicas" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides={"scale_out": {"replicas": ["r0", "no spaces"]}})
    assert "label value" in str(caught.value)


def test_first_writer_state_cannot_be_seized_by_refused_records(tmp_path: Path) -> None:
    """A stream's dimension, the replica slots and a model's interaction-query dimension: none is
    taken by a record that fails a check (unsigned, an unknown replica, a declared dimension)."""
    now = [T0 + 250]
    keys = key_file(tmp_path, KEY_A)
    (r0, r1), single = fleet(now, partials_key_file=keys)
    table = MergeTable(settings(partials_key_file=keys, max_replicas=2), clock=lambda: now[0])
    epoch = int(now[0] * 1e9)
    seize = (StreamManifest("m", "s", 5, (), partition=0), StreamManifest("q", "s", 3, (), partition=0))
    for i in range(40):  # would have taken the dimension of m/s and every replica slot
        assert refused(table, manifest_record(f"ghost-{i}", epoch, seize)) == "unsigned"
    assert table.dim_of(("m", "s")) is None and table.status(now[0]).replicas == ()
    feed(table, r0.publish())
    feed(table, r1.publish())
    assert_exact(table, single, now[0])
    assert table.dim_of(("m", "s")) == DIM

    # without a key: only scale_out.replicas get a slot, and a declared dimension is the dimension
    trusting = MergeTable(settings(replicas=["r0", "r1"], max_replicas=2, extra={"models": {"m": {"dim": DIM}}}),
                          clock=lambda: now[0])
    assert refused(trusting, manifest_record("ghost", epoch, seize)) == "unknown_replica"
    assert refused(trusting, manifest_record("r0", epoch, seize)) == "dim_mismatch"
    assert trusting.status(now[0]).replicas == () and trusting.stream_partitions() == {}


def test_a_refused_manifest_sets_no_interaction_query_dimension(tmp_path: Path) -> None:
    now = [scaleout.T0]
    reducer = scaleout.reducer(tmp_path, now, extra={"scale_out": {"replicas": ["r0"]}})
    epoch = int(now[0] * 1e9)
    ghost = manifest_record("ghost", epoch, (StreamManifest("j", "s", 5, (), partition=0),))
    reducer.intake.apply({TopicPartition(reducer.intake.partials_topic, 0): [
        SimpleNamespace(key=ghost[0], value=ghost[1], headers=ghost[2], offset=0)]})
    assert "j" not in reducer.decoder.dims
    genuine = manifest_record("r0", epoch, (StreamManifest("j", "s", 7, (), partition=0),),
                              geometry=reducer.table.geometry)
    reducer.intake.apply({TopicPartition(reducer.intake.partials_topic, 0): [
        SimpleNamespace(key=genuine[0], value=genuine[1], headers=genuine[2], offset=1)]})
    assert reducer.decoder.dims["j"] == 7
    assert reducer.table.status(now[0]).ignored == {"unknown_replica": 1}


def test_refused_manifests_add_no_stream_partition_and_limits_hold_at_the_reducer() -> None:
    now = [T0 + 250]
    table = MergeTable(settings(replicas=["r0", "r1"], extra={"limits": {"max_models": 2}}), clock=lambda: now[0])
    epoch = int(now[0] * 1e9)
    many = tuple(StreamManifest(f"model-{i}", "s", DIM, (), partition=0) for i in range(50))
    assert refused(table, manifest_record("ghost", epoch, many[:3])) == "unknown_replica"
    other = WindowGeometry(60.0, 6, 300, GEOMETRY.alignment_alpha)
    table.offer_record(*manifest_record("r0", epoch, many[:3], geometry=other), ("partials", 0, 1))
    table.offer_record(*manifest_record("r0", epoch, many[:3]), ("partials", 0, 2))  # 3 models, 2 allowed
    assert table.stream_partitions() == {}
    assert table.status(now[0]).ignored == {"unknown_replica": 1, "window_mismatch": 1, "limit": 1}
    # more streams than limits allow in one manifest: refused before it is decoded further
    assert refused(table, manifest_record("r0", epoch, many)) == "limit"
    table.offer_record(*manifest_record("r0", epoch, many[:2]), ("partials", 0, 3))
    assert set(table.stream_partitions()) == {("model-0", "s"), ("model-1", "s")}
    # partials of a third model are not held either
    (r,), _ = fleet(now, count=1)
    r.ingest(StateRegistry(settings()), 7, now[0], model="model-9")
    for record in r.publish():
        if dict(record[2]).get(KIND_HEADER) == SUBWINDOW.encode() and b"model-9" in record[0]:
            table.offer_record(*record, ("partials", 0, 9))
    assert table.status(now[0]).ignored["limit"] >= 3
    assert {k[0] for k in table.stream_partitions()} == {"model-0", "model-1"}


def test_a_forged_stream_name_cannot_move_a_models_owner(tmp_path: Path) -> None:
    """A model's gauges are exported by the owner of its first stream by name: a refused manifest
    listing a stream named before every real one (on another partition) changes nobody's view."""
    now = [T0 + 250]
    keys = key_file(tmp_path, KEY_A)
    table = MergeTable(settings(partials_key_file=keys), clock=lambda: now[0])
    (r0,), _ = fleet(now, count=1, partials_key_file=keys)
    feed(table, r0.publish())
    ownership = Ownership(table, lambda: {0}, lambda: {0}, {})
    assert ownership.keep()({"model": "m"})  # m/s is on partition 0, owned here
    epoch = int(now[0] * 1e9)
    first = (StreamManifest("m", "!", DIM, (), partition=1), StreamManifest("m", "s", DIM, (), partition=0))
    assert refused(table, manifest_record("r0", epoch, first)) == "unsigned"
    assert table.stream_partitions() == {("m", "s"): 0}
    assert ownership.keep()({"model": "m"})


def test_a_replica_resumes_only_after_trusted_manifests(tmp_path: Path) -> None:
    """The forged manifest under a made-up replica name that made a restarted replica skip 500 of 800
    records, and one under its own name with epoch 2^64 - 1, move no position (read as the resume
    reader reads records; the broker-backed reader is tests/scaleout/test_resume.py)."""
    now = [T0 + 250]
    keys = key_file(tmp_path, KEY_A)
    offsets = {("embeddings", 0): 699}
    reader = ManifestReader(settings("r0", replicas=["r0", "r1"]), clock=lambda: now[0])
    signed = ManifestReader(settings("r0", partials_key_file=keys), clock=lambda: now[0])

    def read(manifests: ManifestReader, record: Record) -> Manifest | None:
        return manifests._manifest(SimpleNamespace(key=record[0], value=record[1], headers=record[2]))

    epoch = int(now[0] * 1e9)
    assert read(reader, manifest_record("ghost", epoch, offsets=offsets)) is None
    assert read(reader, manifest_record("r0", 2**64 - 1, offsets=offsets)) is None
    assert read(reader, manifest_record("r1", int((now[0] + 3600) * 1e9), offsets=offsets)) is None
    assert read(reader, (b'["manifest","r0"]', b'{"format":1,"epoch":Infinity}',
                         [(KIND_HEADER, MANIFEST.encode())])) is None
    genuine = read(reader, manifest_record("r1", epoch, offsets=offsets))
    assert genuine is not None and genuine.offsets == offsets
    assert reader.refused.snapshot() == {"unknown_replica": 1, "epoch_range": 2, "corrupt": 1}
    assert read(signed, manifest_record("r1", epoch, offsets=offsets)) is None
    record = manifest_record("r1", epoch, offsets=offsets)
    signed_headers = list(signing.sign((KEY_A.encode(),), record[0], record[1], record[2]))
    assert read(signed, (record[0], record[1], signed_headers)) is not None
    assert signed.refused.snapshot() == {"unsigned": 1}


def test_the_assembler_bounds_what_one_replica_holds_incomplete() -> None:
    from monitor.scaleout.partials import Chunk, ChunkAssembler

    assembler = ChunkAssembler(max_bytes=100, max_incomplete=3)
    with pytest.raises(PartialError) as caught:  # a sub-window larger than the geometry allows
        for piece in range(3):
            assembler.add(Chunk("r", ("m", "s", 1), 7, piece, 4, b"x" * 40), ("t", 0, piece))
    assert caught.value.reason == "oversize" and assembler.holds() == {}
    for index in range(10):  # incomplete sub-windows of one replica: the oldest go first
        assembler.add(Chunk("r", ("m", "s", index), 7, 0, 2, b"x"), ("t", 0, 100 + index))
    assembler.add(Chunk("other", ("m", "s", 0), 7, 0, 2, b"x"), ("t", 1, 5))
    assert assembler.holds() == {("t", 0): 107, ("t", 1): 5}
    assert assembler.add(Chunk("r", ("m", "s", 9), 7, 1, 2, b"y"), ("t", 0, 200)) == b"xy"
