"""The reducer's change detectors on the merged per-sub-window series (monitor/scaleout/detectors.py),
without a broker: the same records give the same series and change points with one replica or two,
a shift is caught within two sub-windows of the first full shifted one, and a restart feeds nothing twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.drift.component import DriftComponent
from monitor.scaleout.detectors import SubwindowDetectors
from monitor.scaleout.reducer import Reducer
from tests.support import daemons
from tests.support.scaleout import T0, WIDTH, Replica, reducer

DIM = 16
BASE = np.eye(DIM)[0]
SHIFTED = np.cos(np.radians(40)) * BASE + np.sin(np.radians(40)) * np.eye(DIM)[1]


def rows(rng: np.random.Generator, n: int, direction: np.ndarray) -> np.ndarray:
    x = direction + 0.4 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def detectors_of(daemon: Reducer) -> SubwindowDetectors:
    return next(c for c in daemon.components if isinstance(c, SubwindowDetectors))


def run(tmp_path: Path, replicas: int, shift_at: int, ticks: int) -> tuple[list[tuple[str, str, int, float]], Reducer]:
    """``ticks`` sub-windows of 240 records (around SHIFTED from tick ``shift_at``), spread over
    ``replicas`` replicas, merged by a reducer that feeds its detectors once per sub-window."""
    rng = np.random.default_rng(7)
    reference = tmp_path / f"reference-{replicas}.npy"
    np.save(reference, rows(rng, 400, BASE))
    now = [T0 + WIDTH / 2]
    daemon = reducer(tmp_path / f"d{replicas}", now, reference={"path": str(reference)}, online={"enabled": True})
    nodes = [Replica(f"r{i}", now) for i in range(replicas)]
    found = []
    for tick in range(ticks):
        block = rows(rng, 240, SHIFTED if tick >= shift_at else BASE)
        for node, part in zip(nodes, np.array_split(block, replicas), strict=True):
            node.registry.apply(EmbeddingBatch("m", "s", part), now[0])
            node.publish(daemon)
        if tick == 0:
            daemon.refresh()
            next(c for c in daemon.components if isinstance(c, DriftComponent)).run_cycle()  # the pinned reference
        found += [(c.signal, c.detector, c.record_index, c.timestamp) for c in detectors_of(daemon).feed()]
        now[0] += WIDTH
    return found, daemon


def test_the_series_and_its_change_points_do_not_depend_on_the_replica_count(tmp_path: Path) -> None:
    one, first = run(tmp_path, 1, shift_at=12, ticks=16)
    two, second = run(tmp_path, 2, shift_at=12, ticks=16)
    with daemons.stopped_after(first), daemons.stopped_after(second):
        assert one == two and one
        # nothing before the shift; caught within 3 updates from sub-window 12, the first shifted one
        # (the 40-degree turn moves each sub-window's standardised mean cosine by several sd)
        (signal, detector, index, at), *_ = sorted(one, key=lambda c: c[3])
        start = (int((T0 + WIDTH / 2) // WIDTH) + 12) * WIDTH  # sub-window 12's start
        assert start + WIDTH <= at <= start + 3 * WIDTH, (signal, detector)
        assert index == 240 * (12 + round((at - start) / WIDTH)) - 1  # the records fed since sub-window 0
        assert detectors_of(first).status() == detectors_of(second).status()
        # exported as one daemon's change points, a series per (signal, detector) once started
        names = {(f.name, tuple(s.labels.values()), s.value) for c in first.components if c.name == "drift"
                 for f in c.collect() if f.name == "embmon_drift_change_points" for s in f.samples}
        assert {(labels[2], labels[3]) for _, labels, _ in names} == {
            (s, d) for s in ("cosine", "norm") for d in ("page_hinkley", "adwin")}
        assert sum(v for _, labels, v in names if labels[2] == "cosine") >= 1


def test_a_restarted_reducer_feeds_no_sub_window_twice(tmp_path: Path) -> None:
    found, daemon = run(tmp_path, 2, shift_at=100, ticks=8)
    with daemons.stopped_after(daemon):
        assert found == []  # no shift: quiet
        fed = detectors_of(daemon).status()[("m", "s")]
        assert fed[0] >= 6 and fed[1] == fed[0] * 240
        assert daemon.checkpointer.checkpoint(reason="test")
        settings = daemon.settings
    again = Reducer(settings.model_copy(update={"drift": settings.drift.model_copy(
        update={"online": settings.drift.online.model_copy(update={"enabled": True})})}),
        clock=lambda: daemon.clock())
    with daemons.stopped_after(again):
        assert again.checkpointer.restore()
        assert detectors_of(again).status() == {("m", "s"): fed}
        assert detectors_of(again).feed() == [] and detectors_of(again).status()[("m", "s")] == fed


def test_the_detectors_follow_drift_online_enabled_and_check_their_parameters(tmp_path: Path) -> None:
    with daemons.stopped_after(reducer(tmp_path, [T0], online={"enabled": False})) as daemon:
        assert not any(isinstance(c, SubwindowDetectors) for c in daemon.components)
    with pytest.raises(ValueError, match="page_hinkley does not take"):
        load_settings(overrides={"scale_out": {"detectors": {"page_hinkley": {"clock": 1}}}})


def test_a_sub_window_waits_for_every_live_replica_to_publish_past_its_end(tmp_path: Path) -> None:
    now = [T0 + WIDTH / 2]  # in sub-window k
    k = int(now[0] // WIDTH)
    rng = np.random.default_rng(9)
    with daemons.stopped_after(reducer(tmp_path, now)) as daemon:
        a, b = Replica("a", now), Replica("b", now)
        for node in (a, b):
            node.registry.apply(EmbeddingBatch("m", "s", rows(rng, 10, BASE)), now[0])
            node.publish(daemon)
        now[0] += WIDTH  # k closed on the reducer's clock; only a has published since
        a.publish(daemon)
        assert daemon.table.complete_before(now[0]) == k  # b's records of k may still come
        b.publish(daemon)
        assert daemon.table.complete_before(now[0]) == k + 1
        [(index, count, _, _)] = daemon.table.subwindow_sums("m", "s", k, k + 1)
        assert (index, count) == (k, 20)
        now[0] += 2 * WIDTH  # b falls silent: stale after scale_out.stale_after_seconds (120 s)
        a.publish(daemon)
        assert daemon.table.complete_before(now[0]) == k + 3  # a stale replica does not hold the series back
