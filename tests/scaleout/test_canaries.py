"""Canaries scaled out, without a broker: replicas forward arrivals in their sub-window partials, the
reducer compares each exactly once with its pins (monitor/scaleout/canaries.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.canary.component import REPIN_PATH
from monitor.component import MonitorContext
from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout.canaries import ARRIVALS, CanaryArrivals, ReducerCanaries, with_arrivals
from monitor.scaleout.canary_rows import CanaryRows
from monitor.scaleout.partials import PartialError, decode_subwindow, encode_subwindow
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.reducer import Reducer
from monitor.state.registry import StateRegistry
from tests.support import daemons
from tests.support.scaleout import T0, MemoryProducer, feed, reducer

DIM = 8
CANARIES = {"m": ["c0", "c1"]}
WINDOW = {"seconds": 600, "subwindows": 6, "reservoir_size": 600}


class Replica:
    """A replica's state, canary forwarder and publisher, driven by hand on the test's clock."""

    def __init__(self, name: str, tmp_path: Path, now: list[float]):
        self.settings = load_settings(overrides={
            "scale_out": {"replica_id": name, "full_publish_seconds": 1}, "window": WINDOW,
            "canaries": {"ids": CANARIES}, "state_dir": str(tmp_path / name)})
        self.registry = StateRegistry(self.settings)
        self.arrivals = CanaryArrivals(MonitorContext(self.settings, self.registry, lambda: now[0],
                                                      tmp_path / name, lambda: {}))
        self.producer = MemoryProducer()
        self.publisher = PartialsPublisher(self.settings, producer_factory=lambda: self.producer,
                                           clock=lambda: now[0])

    def ingest(self, ids: list[str], vectors: np.ndarray, now: float) -> None:
        batch = EmbeddingBatch("m", "default", vectors.astype(np.float32), ids=tuple(ids))
        self.registry.apply(batch, now)
        self.arrivals.on_embeddings(batch, now)

    def publish(self, table: object) -> list[tuple[bytes, bytes | None, object]]:
        streams = with_arrivals(self.registry.state_dict()["streams"], self.arrivals.state_dict())
        self.publisher.stage(self.publisher.epochs.next(), {}, streams)
        assert self.publisher.flush()
        sent = self.producer.take()
        feed(table, sent)  # type: ignore[arg-type]
        return sent


def canaries_of(daemon: Reducer) -> ReducerCanaries:
    return next(c for c in daemon.components if isinstance(c, ReducerCanaries))


def vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, DIM))


def test_each_arrival_is_compared_once_whatever_is_published_again(tmp_path: Path) -> None:
    now = [T0]
    rng = np.random.default_rng(0)
    pinned = vectors(rng, 2)
    rotated = pinned @ np.linalg.qr(rng.standard_normal((DIM, DIM)))[0]  # a swapped model: same norms
    with daemons.stopped_after(reducer(tmp_path, now, {"canaries": {"ids": CANARIES}}, enabled=False)) as daemon:
        canaries = canaries_of(daemon)
        a, b = Replica("a", tmp_path, now), Replica("b", tmp_path, now)
        a.ingest(["doc-1", "c0", "doc-2"], np.vstack([vectors(rng, 1), pinned[:1], vectors(rng, 1)]), T0 + 1)
        b.ingest(["c1"], pinned[1:], T0 + 2)
        a.publish(daemon.table)
        sent_b = b.publish(daemon.table)
        assert canaries.feed() == 2  # first sightings: pinned, not compared
        snap = canaries.publish()
        assert snap.pins["m"] == 2 and snap.checked["m"] == 0
        # the same canaries again on the other replicas (their partitions moved), unchanged model
        a.ingest(["c1"], pinned[1:], T0 + 3)
        b.ingest(["c0"], pinned[:1], T0 + 4)
        a.publish(daemon.table)
        b.publish(daemon.table)
        feed(daemon.table, sent_b, partition=1)  # a publication read twice changes nothing
        snap = canaries.publish()
        assert snap.checked["m"] == 2 and snap.mismatches["m"] == 0 and snap.cosine_min["m"] == pytest.approx(1.0)
        # the model changes: every arrival counted once, even re-sent in a full publication later
        a.ingest(["c0", "c1"], rotated, T0 + 5)
        a.publish(daemon.table)
        now[0] += 2  # a full publication is due: every sub-window (and its canaries) is sent again
        assert len(a.publish(daemon.table)) > 1
        snap = canaries.publish()
        assert snap.checked["m"] == 4 and snap.mismatches["m"] == 2
        worst = min(float(np.dot(r / np.linalg.norm(r), p / np.linalg.norm(p))) for r, p in zip(
            rotated.astype(np.float32).astype(np.float64), pinned.astype(np.float32).astype(np.float64), strict=True))
        assert snap.cosine_min["m"] == pytest.approx(worst, abs=1e-6)
        assert canaries.publish().checked["m"] == 4  # nothing new: nothing compared


def test_the_reducer_restart_neither_recounts_nor_skips(tmp_path: Path) -> None:
    now = [T0 + 10]
    rng = np.random.default_rng(1)
    pinned = vectors(rng, 1)
    with daemons.stopped_after(reducer(tmp_path, now, {"canaries": {"ids": CANARIES}}, enabled=False)) as daemon:
        replica = Replica("a", tmp_path, now)
        for t in range(3):
            replica.ingest(["c0"], pinned, T0 + t)
        sent = replica.publish(daemon.table)
        assert canaries_of(daemon).publish().checked["m"] == 2
        assert daemon.checkpointer.checkpoint(reason="test")
    with daemons.stopped_after(reducer(tmp_path, now, {"canaries": {"ids": CANARIES}}, enabled=False)) as again:
        assert again.checkpointer.restore()
        feed(again.table, sent)  # what the restarted reducer reads again
        replica.ingest(["c0"], pinned * 2, T0 + 4)  # the same direction: cosine 1
        replica.publish(again.table)
        snap = canaries_of(again).publish()
        assert snap.checked["m"] == 3 and snap.mismatches["m"] == 0 and snap.pins["m"] == 1


def test_a_repin_through_the_reducer_takes_the_latest_arrival_of_any_replica(tmp_path: Path) -> None:
    now = [T0 + 10]
    rng = np.random.default_rng(2)
    old, new = vectors(rng, 2), vectors(rng, 2)
    with daemons.stopped_after(reducer(tmp_path, now, {"canaries": {"ids": CANARIES}}, enabled=False)) as daemon:
        canaries = canaries_of(daemon)
        a, b = Replica("a", tmp_path, now), Replica("b", tmp_path, now)
        a.ingest(["c0", "c1"], old, T0 + 1)
        a.publish(daemon.table)
        canaries.feed()
        b.ingest(["c0", "c1"], new, T0 + 2)
        b.publish(daemon.table)  # not fed yet: the re-pin compares it first
        assert canaries.repin("m") == {"model": "m", "repinned": ["c0", "c1"], "unpinned": []}
        snap = canaries.snapshot
        assert snap.mismatches["m"] == 2 and "m" not in snap.cosine_min  # the re-pin dropped the window's cosines
        a.ingest(["c0"], new[:1], T0 + 3)
        a.publish(daemon.table)
        snap = canaries.publish()
        assert snap.mismatches["m"] == 2 and snap.cosine_min["m"] == pytest.approx(1.0)
        assert REPIN_PATH in daemon.http._routes  # the reducer serves the re-pin


def test_arrivals_travel_in_their_sub_window_partial_and_bad_ones_are_refused(tmp_path: Path) -> None:
    now = [T0]
    replica = Replica("a", tmp_path, now)
    rng = np.random.default_rng(3)
    replica.ingest(["doc", "c0"], vectors(rng, 2), T0 + 1)
    replica.ingest(["c1"], vectors(rng, 1), T0 + 200)  # another sub-window (100 s each)
    state = replica.arrivals.state_dict()
    streams = with_arrivals(replica.registry.state_dict()["streams"], state)
    by_index = {int(sub["index"]): sub.get("canaries") for sub in streams[0]["window"]["live"]}
    assert sorted(len(rows["ids"]) for rows in by_index.values()) == [1, 1]
    sub = next(s for s in streams[0]["window"]["live"] if s["canaries"]["ids"] == ["c0"])
    [record] = encode_subwindow("a", "m", "default", 7, sub, 1 << 20)
    assert record.value is not None
    partial = decode_subwindow(record.value)
    assert partial.canaries is not None and partial.canaries.ids == ("c0",)
    assert partial.canaries.vectors.dtype == np.float32 and partial.canaries.vectors.shape == (1, DIM)
    # a replica restored from its checkpoint forwards the same arrivals
    twin = CanaryArrivals(MonitorContext(replica.settings, replica.registry, lambda: now[0], tmp_path, lambda: {}))
    twin.load_state_dict(state)
    assert twin.state_dict()["seq"] == state["seq"] and len(twin.state_dict()["rows"]) == 2
    # what a replica could not have written is refused as a corrupt partial
    bad = dict(sub["canaries"], vectors=np.zeros((1, DIM), np.float32))
    [record] = encode_subwindow("a", "m", "default", 8, {**sub, "canaries": bad}, 1 << 20)
    assert record.value is not None
    with pytest.raises(PartialError, match="zero"):
        decode_subwindow(record.value)
    with pytest.raises(ValueError, match="increasing"):
        CanaryRows.from_state_dict({**sub["canaries"], "seq": np.array([3, 3]), "ids": ["c0", "c1"],
                                    "times": np.zeros(2), "vectors": np.ones((2, DIM), np.float32)}, DIM)
    assert replica.arrivals.name == ARRIVALS  # its key in a replica's checkpoint


def test_a_stream_taken_over_from_another_reducer_has_its_older_arrivals_compared(tmp_path: Path) -> None:
    """In a group of reducers, a stream this reducer takes over carries a replica's arrival numbers
    below those it already counted for that replica on its own streams: they are counted per
    (replica, model, stream), so they are compared, not skipped. A checkpoint written before the
    split (one high-water mark per replica) still holds as a floor."""
    now = [T0 + 10]
    rng = np.random.default_rng(3)
    pinned = vectors(rng, 1)[0]
    turned = pinned[::-1].copy()  # a changed model: the same canary, another direction
    with daemons.stopped_after(reducer(tmp_path, now, {"canaries": {"ids": CANARIES}}, enabled=False)) as daemon:
        canaries = canaries_of(daemon)
        arrivals = [("a", "m", "owned", CanaryRows.of([(5, T0 + 5, "c0", pinned)], DIM))]
        canaries._arrivals = lambda: list(arrivals)  # type: ignore[method-assign]
        assert canaries.feed() == 1  # a first sighting: pinned
        arrivals.append(("a", "m", "taken-over", CanaryRows.of([(3, T0 + 3, "c0", turned)], DIM)))
        assert canaries.feed() == 1  # number 3 < 5, on another stream: compared all the same
        snap = canaries.publish()
        assert snap.checked["m"] == 1 and snap.mismatches["m"] == 1
        assert canaries.feed() == 0  # and only once
        state = canaries.state_dict()
        assert ["a", "m", "taken-over", 3] in state["counted_streams"]
        old = {**state, "counted": {"a": 9}}
        del old["counted_streams"]
        canaries.load_state_dict(old)
        arrivals.append(("a", "m", "third", CanaryRows.of([(8, T0 + 8, "c0", turned), (11, T0 + 9, "c0", turned)],
                                                         DIM)))
        assert canaries.feed() == 1  # only number 11 is above the old checkpoint's mark
