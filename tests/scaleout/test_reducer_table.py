"""The reducer's merge table: exactly one daemon's window over everything, whatever the delivery.

Condition for equality with one daemon (stated in docs/deployment.md): every record sits in the
same live sub-windows in both (here: the same processing times), and positive pairs complete on
one replica (both halves in its partitions).
"""

from __future__ import annotations

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.quality.intrinsic import report_from_snapshot
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.table import MergeTable
from monitor.state.registry import StateRegistry
from monitor.storage import checkpoint_format as ckpt
from tests.support.scaleout import MemoryProducer, feed

T0 = 2_000_000.0
DIM = 10
EXACT = ("partition_isotropy", "effective_dimension", "effective_dimension_ratio", "top10_variance_ratio",
         "mean_cosine_similarity", "vector_norm_mean", "vector_norm_stddev", "effective_rank", "stable_rank",
         "alignment")


def settings(replica: str = "reducer", **scale: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "scale_out": {"replica_id": replica, **scale},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 300},
        "drift": {"window_sample_size": 100},  # below reservoir_size: the window sample is 300 rows
    })


class Replica:
    """A registry plus its publisher, as a replica holds them (without Kafka)."""

    def __init__(self, name: str, now: list[float]):
        self.registry = StateRegistry(settings(name))
        self.producer = MemoryProducer()
        self.publisher = PartialsPublisher(settings(name), producer_factory=lambda: self.producer,
                                           clock=lambda: now[0])

    def publish(self, offsets: dict | None = None) -> list:  # type: ignore[type-arg]
        self.publisher.stage(self.publisher.epochs.next(), offsets or {}, self.registry.state_dict()["streams"])
        assert self.publisher.flush()
        return self.producer.take()


def batch(rng: np.random.Generator, shift: float, scale: float, n: int, pairs: str) -> EmbeddingBatch:
    x = (rng.standard_normal((n, DIM)) * scale + shift).astype(np.float32)
    pair_ids = [f"{pairs}-{i // 2}" for i in range(n)]  # consecutive rows are positive pairs
    return EmbeddingBatch("m", "s", x, ids=[f"{pairs}-{i}" for i in range(n)], pair_ids=pair_ids)


def scenario(now: list[float], replicas: int = 3) -> tuple[list[Replica], StateRegistry]:
    """Each replica sees its own distribution (keyed partitions); one registry sees everything."""
    rng = np.random.default_rng(7)
    single = StateRegistry(settings())
    fleet = [Replica(f"r{i}", now) for i in range(replicas)]
    for step, t in enumerate(np.arange(0.0, 350.0, 7.0)):
        for i, replica in enumerate(fleet):
            b = batch(rng, shift=1.5 * i, scale=1.0 + i, n=20 + 10 * i, pairs=f"r{i}-{step}")
            replica.registry.apply(b, T0 + t)
            single.apply(b, T0 + t)
    return fleet, single


def merged(fleet: list[Replica], now: list[float], **scale: object) -> MergeTable:
    """A reducer's table that read one publication of every replica."""
    table = MergeTable(settings(**scale), clock=lambda: now[0])
    for replica in fleet:
        feed(table, replica.publish())
    return table


def assert_same_window(table: MergeTable, single: StateRegistry, at: float) -> None:
    merged = table.snapshot_windows(at)[("m", "s")]
    alone = single.snapshot_windows(at)[("m", "s")]
    assert merged.records == alone.records and merged.live_subwindows == alone.live_subwindows
    np.testing.assert_allclose(merged.stats.gram, alone.stats.gram, rtol=1e-12)
    np.testing.assert_allclose(merged.stats.vector_sum, alone.stats.vector_sum, rtol=1e-12, atol=1e-9)
    assert merged.alignment_pairs == alone.alignment_pairs
    quality = load_settings().quality
    a, b = report_from_snapshot(merged, quality), report_from_snapshot(alone, quality)
    for name in EXACT:
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9), name
    assert a.dead_dimensions == b.dead_dimensions and a.collapse_detected == b.collapse_detected


def test_the_merged_window_equals_one_window_over_every_record() -> None:
    now = [T0 + 350]
    fleet, single = scenario(now)
    table = merged(fleet, now)
    assert_same_window(table, single, now[0])
    window = table.snapshot_windows(now[0])[("m", "s")]
    assert len(window.sample) == 300  # the single daemon's sample size, not three reservoirs' worth
    # every record had the same chance: each replica's share of the sample is its share of records
    shares = np.array([sum(i.startswith(f"r{k}-") for i in window.sample_ids) for k in range(3)]) / 300
    counts = np.array([r.registry.snapshot_windows(now[0])[("m", "s")].records for r in fleet], dtype=float)
    np.testing.assert_allclose(shares, counts / counts.sum(), atol=0.06)


def test_redelivered_and_older_publications_change_nothing() -> None:
    now = [T0 + 350]
    fleet, single = scenario(now)
    table = MergeTable(settings(), clock=lambda: now[0])
    firsts = [replica.publish() for replica in fleet]
    fleet[0].registry.apply(batch(np.random.default_rng(1), 0.0, 1.0, 4, "late"), T0 + 349)
    single.apply(batch(np.random.default_rng(1), 0.0, 1.0, 4, "late"), T0 + 349)
    second = fleet[0].publish()
    for records in (*firsts, second, *firsts, second, firsts[0]):  # repeats, and an old one last
        feed(table, records)
    assert_same_window(table, single, now[0])
    ignored = table.status(now[0]).ignored
    assert ignored.get("duplicate", 0) > 0 and ignored.get("superseded", 0) > 0 and "missing" not in ignored


def test_a_replica_switches_only_when_its_manifest_arrives() -> None:
    now = [T0 + 350]
    fleet, _ = scenario(now, replicas=1)
    table = MergeTable(settings(), clock=lambda: now[0])
    feed(table, fleet[0].publish())
    before = table.snapshot_windows(now[0])[("m", "s")].records
    fleet[0].registry.apply(batch(np.random.default_rng(2), 0.0, 1.0, 6, "x"), T0 + 349)
    records = fleet[0].publish()
    feed(table, records[:-1])  # the partials, not yet the manifest
    assert table.snapshot_windows(now[0])[("m", "s")].records == before
    feed(table, records[-1:])
    assert table.snapshot_windows(now[0])[("m", "s")].records == before + 6


def test_a_restarted_replica_replaces_a_newer_publication_of_its_own() -> None:
    """A replica restored an older checkpoint (the newer one was never committed): its restart
    publication must replace what it published after that checkpoint, records and sub-windows."""
    now = [T0 + 350]
    fleet, _ = scenario(now, replicas=1)
    replica = fleet[0]
    table = MergeTable(settings(), clock=lambda: now[0])
    older = replica.registry.state_dict()
    feed(table, replica.publish())
    kept = table.snapshot_windows(now[0])[("m", "s")].records
    replica.registry.apply(batch(np.random.default_rng(3), 0.0, 1.0, 8, "lost"), T0 + 420)  # a new sub-window too
    now[0] = T0 + 421
    feed(table, replica.publish())
    assert table.snapshot_windows(now[0])[("m", "s")].records == kept + 8
    restarted = PartialsPublisher(settings("r0"), producer_factory=lambda: replica.producer, clock=lambda: now[0])
    restarted.epochs.advance_past(replica.publisher.sent.epoch)  # type: ignore[union-attr]
    restarted.stage(restarted.epochs.next(), {}, older["streams"])
    assert restarted.flush()
    feed(table, replica.producer.take())
    assert table.snapshot_windows(now[0])[("m", "s")].records == kept


def test_a_partial_that_never_arrived_is_counted_missing_and_left_out() -> None:
    now = [T0 + 350]
    fleet, _ = scenario(now, replicas=1)
    table = MergeTable(settings(), clock=lambda: now[0])
    records = fleet[0].publish()
    feed(table, records[1:])  # the first chunk was lost
    assert table.status(now[0]).ignored["missing"] == 1
    assert 0 < table.snapshot_windows(now[0])[("m", "s")].records


def test_stale_replicas_stay_merged_and_expired_subwindows_leave() -> None:
    now = [T0 + 350]
    fleet, single = scenario(now, replicas=2)
    table = merged(fleet, now, stale_after_seconds=60)
    now[0] += 61
    status = table.status(now[0])
    assert [r.stale for r in status.replicas] == [True, True]
    assert_same_window(table, single, now[0])  # stale, still exact
    now[0] = T0 + 2000  # every sub-window left the window
    table.forget_expired()
    assert table.snapshot_windows(now[0]) == {}
    assert [r.window_records for r in table.status(now[0]).replicas] == [0, 0]


def test_the_replica_budget_and_foreign_window_settings_are_refused() -> None:
    now = [T0 + 350]
    fleet, _ = scenario(now, replicas=3)
    table = merged(fleet, now, max_replicas=2)
    assert [r.replica for r in table.status(now[0]).replicas] == ["r0", "r1"]
    assert table.status(now[0]).ignored["replica_limit"] > 0
    other = load_settings(overrides={"window": {"seconds": 300, "subwindows": 6, "reservoir_size": 300}})
    foreign = MergeTable(other, clock=lambda: now[0])
    feed(foreign, fleet[0].publish())
    assert foreign.status(now[0]).ignored["window_mismatch"] == 1 and foreign.snapshot_windows(now[0]) == {}


def test_the_table_survives_a_checkpoint_round_trip() -> None:
    now = [T0 + 350]
    fleet, single = scenario(now)
    table = merged(fleet, now)
    pending = fleet[0]
    pending.registry.apply(batch(np.random.default_rng(4), 0.0, 1.0, 2, "p"), T0 + 349)
    feed(table, pending.publish()[:-1])  # partials pending, manifest not yet read
    arrays: list = []  # type: ignore[type-arg]
    data = ckpt.encode(ckpt.flatten(table.state_dict(), arrays), arrays)
    restored = MergeTable(settings(), clock=lambda: now[0])
    restored.load_state_dict(ckpt.decode(data))
    assert_same_window(restored, single, now[0])
    before = restored.snapshot_windows(now[0])[("m", "s")]
    after = table.snapshot_windows(now[0])[("m", "s")]
    np.testing.assert_array_equal(before.sample, after.sample)
