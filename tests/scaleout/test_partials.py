"""The partials topic's records and a replica's publisher: exact round trips, chunks, what is re-sent."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout.marker import CommitIntent, MarkerState, PublishedMarker, commit_happened
from monitor.scaleout.partials import (
    Chunk,
    ChunkAssembler,
    Manifest,
    PartialError,
    Tombstone,
    decode_subwindow,
    encode_subwindow,
    parse_record,
)
from monitor.scaleout.publisher import PartialsPublisher
from monitor.state.registry import StateRegistry
from tests.support.scaleout import MemoryProducer

T0 = 1_000_000.0
DIM = 12


def settings(replica: str = "r0", **scale: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "scale_out": {"role": "replica", "replica_id": replica, "max_record_bytes": 16_384, **scale},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 120},
    })


def filled_registry(seed: int = 0, until: float = 250.0) -> StateRegistry:
    registry = StateRegistry(settings())
    rng = np.random.default_rng(seed)
    for t in np.arange(0.0, until, 10.0):
        registry.apply(EmbeddingBatch("m", "s", rng.standard_normal((40, DIM)).astype(np.float32),
                                      ids=[f"d{seed}-{t}-{i}" for i in range(40)]), T0 + t)
    return registry


def kinds(records: list) -> list[str]:  # type: ignore[type-arg]
    out = []
    for key, value, headers in records:
        parsed = parse_record(key, value, headers)
        out.append(type(parsed).__name__)
    return out


def test_a_subwindow_round_trips_exactly_through_chunked_records() -> None:
    window_state = filled_registry().state_dict()["streams"][0]["window"]
    sub = window_state["live"][0]
    records = encode_subwindow("r0", "m", "s", 42, sub, max_record_bytes=512)
    assert len(records) > 3  # the sub-window needed several chunks
    assembler = ChunkAssembler()
    pieces = [parse_record(r.key, r.value, r.headers) for r in records]
    assert all(isinstance(p, Chunk) for p in pieces)
    out = [assembler.add(p, ("t", 0, i)) for i, p in enumerate(reversed(pieces))]  # any order
    assert out[:-1] == [None] * (len(pieces) - 1) and assembler.holds() == {}
    partial = decode_subwindow(out[-1])
    assert (partial.replica, partial.key, partial.epoch) == ("r0", ("m", "s", sub["index"]), 42)
    assert partial.stats.count == sub["stats"]["count"]
    np.testing.assert_array_equal(partial.stats.gram, _stats(sub).gram)  # bit-exact
    np.testing.assert_array_equal(partial.reservoir.vectors, sub["reservoir"]["vectors"])
    assert list(partial.reservoir.ids) == list(sub["reservoir"]["ids"])
    assert partial.reservoir.seen == sub["reservoir"]["seen"]


def _stats(sub):  # type: ignore[no-untyped-def]
    from monitor.state.stats import SufficientStats

    return SufficientStats.from_state_dict(sub["stats"])


def test_the_assembler_keeps_the_newest_epoch_and_holds_its_first_chunk() -> None:
    assembler = ChunkAssembler()
    key = ("m", "s", 3)
    assert assembler.add(Chunk("r", key, 5, 0, 2, b"old-"), ("t", 0, 7)) is None
    assert assembler.add(Chunk("r", key, 6, 0, 2, b"new-"), ("t", 0, 9)) is None  # newer epoch starts over
    assert assembler.holds() == {("t", 0): 9}
    assert assembler.add(Chunk("r", key, 5, 1, 2, b"late"), ("t", 0, 10)) is None  # superseded piece
    assert assembler.add(Chunk("r", key, 6, 1, 2, b"data"), ("t", 0, 11)) == b"new-data"
    assembler.add(Chunk("r", key, 7, 0, 2, b"x"), ("t", 1, 3))
    assembler.forget_before(4)
    assert assembler.holds() == {}


@pytest.mark.parametrize("value", [b"EMBMONCK" + b"\0" * 60, b"not a checkpoint at all"])
def test_corrupt_partials_are_refused(value: bytes) -> None:
    with pytest.raises(PartialError):
        decode_subwindow(value)


def test_unknown_keys_and_bad_headers_are_refused() -> None:
    with pytest.raises(PartialError):
        parse_record(b"hello", b"x", [])
    with pytest.raises(PartialError):
        parse_record(b'["subwindow","r","m","s",1,0]', b"x", [("embmon-epoch", b"1")])  # no chunk header
    assert isinstance(parse_record(b'["subwindow","r","m","s",1,0]', None, []), Tombstone)
    with pytest.raises(PartialError):
        parse_record(b'["manifest","r"]', b"{}", [])


def publisher(producer: MemoryProducer, now: list[float], **scale: object) -> PartialsPublisher:
    return PartialsPublisher(settings(**scale), producer_factory=lambda: producer, clock=lambda: now[0])


def test_a_publication_sends_changed_subwindows_then_its_manifest_last() -> None:
    producer, now = MemoryProducer(), [T0 + 250]
    pub = publisher(producer, now)
    registry = filled_registry()
    streams = registry.state_dict()["streams"]
    live = [sub["index"] for sub in streams[0]["window"]["live"]]
    pub.stage(pub.epochs.next(), {("emb", 0): 99}, streams)
    assert pub.pending and pub.flush() and not pub.pending
    first = producer.take()
    assert kinds(first)[-1] == "Manifest" and set(kinds(first)[:-1]) == {"Chunk"}
    manifest = parse_record(*first[-1])
    assert isinstance(manifest, Manifest)
    assert manifest.offsets == {("emb", 0): 99} and manifest.replica == "r0"
    assert [i for i, _, _ in manifest.streams[0].subwindows] == live
    assert pub.sent is not None and pub.sent.epoch == manifest.epoch

    # nothing changed: only a manifest (a heartbeat); its entries still name the first epoch
    pub.stage(pub.epochs.next(), {("emb", 0): 99}, registry.state_dict()["streams"])
    assert pub.flush()
    again = producer.take()
    assert kinds(again) == ["Manifest"]
    assert {e for _, e, _ in parse_record(*again[0]).streams[0].subwindows} == {manifest.epoch}

    # records in the newest sub-window only: only it is re-sent
    registry.apply(EmbeddingBatch("m", "s", np.ones((3, DIM), dtype=np.float32)), T0 + 255)
    pub.stage(pub.epochs.next(), {("emb", 0): 100}, registry.state_dict()["streams"])
    assert pub.flush()
    third = producer.take()
    chunks = [parse_record(*r) for r in third[:-1]]
    assert {c.key[2] for c in chunks} == {max(live)}


def test_subwindows_that_left_the_window_are_tombstoned() -> None:
    producer, now = MemoryProducer(), [T0 + 250]
    pub = publisher(producer, now)
    registry = filled_registry()
    pub.stage(pub.epochs.next(), {}, registry.state_dict()["streams"])
    pub.flush()
    producer.take()
    registry.apply(EmbeddingBatch("m", "s", np.ones((3, DIM), dtype=np.float32)), T0 + 900)  # all old ones expire
    pub.stage(pub.epochs.next(), {}, registry.state_dict()["streams"])
    pub.flush()
    parsed = [parse_record(*r) for r in producer.take()]
    assert {p.key[2] for p in parsed if isinstance(p, Tombstone)} == {0 + int(T0 // 100) + i for i in range(3)}


def test_a_full_publication_resends_everything_when_due() -> None:
    producer, now = MemoryProducer(), [T0 + 250]
    pub = publisher(producer, now, full_publish_seconds=60)
    streams = filled_registry().state_dict()["streams"]
    pub.stage(pub.epochs.next(), {}, streams)
    pub.flush()
    n_first = len(producer.take())
    now[0] += 30
    pub.stage(pub.epochs.next(), {}, streams)
    pub.flush()
    assert len(producer.take()) == 1  # manifest only
    now[0] += 31
    pub.stage(pub.epochs.next(), {}, streams)
    pub.flush()
    assert len(producer.take()) == n_first


def test_a_failed_send_stays_staged_and_the_next_publication_covers_it() -> None:
    producer, now = MemoryProducer(fail=True), [T0 + 250]
    pub = publisher(producer, now)
    registry = filled_registry()
    pub.stage(pub.epochs.next(), {("emb", 0): 10}, registry.state_dict()["streams"])
    assert not pub.flush() and pub.pending and pub.failures == 1 and pub.sent is None
    producer.fail = False
    pub.stage(pub.epochs.next(), {("emb", 0): 11}, registry.state_dict()["streams"])
    assert pub.flush()
    records = producer.take()
    assert kinds(records).count("Chunk") > 0  # everything, not just what changed since the failure
    assert pub.sent is not None and pub.sent.offsets == {("emb", 0): 11}


def test_the_published_marker_survives_a_reread(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = PublishedMarker(tmp_path)
    assert marker.read() is None
    marker.write("r0", 123)
    assert marker.read() is not None and marker.read().epoch == 123  # type: ignore[union-attr]
    (tmp_path / "partials-published.json").write_text("{broken")
    assert marker.read() is None


def test_the_marker_keeps_a_commit_intent_until_the_commit_is_marked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = PublishedMarker(tmp_path)
    intent = CommitIntent(9, {("emb", 0): 40, ("emb", 1): 12}, {("emb", 0): 31, ("emb", 1): None})
    marker.write("r0", 8, intent)
    back = marker.read()
    assert back is not None and (back.epoch, back.committing) == (8, intent)
    assert commit_happened(intent, {("emb", 0): 41, ("emb", 1): 13}) is True
    assert commit_happened(intent, {("emb", 0): 32, ("emb", 1): None}) is False
    assert commit_happened(intent, {("emb", 0): 41, ("emb", 1): None}) is None  # contradicting partitions
    marker.write("r0", 9)
    assert marker.read() == MarkerState("r0", 9)
