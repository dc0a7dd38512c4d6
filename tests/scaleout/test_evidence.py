"""The accumulating detector scaled out (monitor/scaleout/evidence.py), without a broker: real
replicas' publishers and the reducer's real merge table. The reducer's detector is fed each closed
sub-window once, its bag is the reference's held-out counts plus the region counts of every row
fed, and the detector's log-evidence is the same with one replica or two; a shift adds up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.decoding.records import EmbeddingBatch
from monitor.drift.component import DriftComponent
from monitor.drift.export import CycleResult
from monitor.scaleout.evidence import SubwindowEvidence
from monitor.scaleout.reducer import Reducer
from tests.support import daemons
from tests.support.scaleout import T0, WIDTH, Replica, reducer

DIM, CLUSTERS = 16, 4
CENTRES = 4.0 * np.random.default_rng(0).standard_normal((CLUSTERS, DIM))


def draw(rng: np.random.Generator, n: int, shares: np.ndarray) -> np.ndarray:
    picked = rng.choice(CLUSTERS, n, p=shares)
    return (CENTRES[picked] + rng.standard_normal((n, DIM))).astype(np.float32)


def run(tmp_path: Path, replicas: int, ticks: int, shift_at: int = 10**9) -> tuple[list[CycleResult], Reducer]:
    """``ticks`` sub-windows of 80 records spread over ``replicas`` replicas; a drift cycle every
    sub-window after the reducer fed its detector (from tick ``shift_at``, cluster 0 rises from 25% to 55%)."""
    rng = np.random.default_rng(3)
    reference = tmp_path / f"reference-{replicas}.npy"
    np.save(reference, draw(rng, 400, np.full(CLUSTERS, 0.25)))
    now = [T0 + WIDTH / 2]
    daemon = reducer(tmp_path / f"d{replicas}", now, reference={"path": str(reference)}, interval_seconds=WIDTH,
                     false_alarm_every="1d")
    drift = next(c for c in daemon.components if isinstance(c, DriftComponent))
    evidence = next(c for c in daemon.components if isinstance(c, SubwindowEvidence))
    nodes = [Replica(f"r{i}", now) for i in range(replicas)]
    results = []
    for tick in range(ticks):
        shares = np.r_[0.55, np.full(CLUSTERS - 1, 0.15)] if tick >= shift_at else np.full(CLUSTERS, 0.25)
        block = draw(rng, 80, shares)
        for node, part in zip(nodes, np.array_split(block, replicas), strict=True):
            node.registry.apply(EmbeddingBatch("m", "s", part), now[0])
            node.publish(daemon)
        evidence.feed()
        daemon.refresh()
        cycle = drift.run_cycle().get(("m", "s"))
        if cycle is not None and cycle.computed_at == now[0]:
            results.append(cycle)
        now[0] += WIDTH
    return results, daemon


def test_the_merged_detector_does_not_depend_on_the_replica_count(tmp_path: Path) -> None:
    one, first = run(tmp_path, 1, ticks=10)
    two, second = run(tmp_path, 2, ticks=10)
    with daemons.stopped_after(first), daemons.stopped_after(second):
        bets = [r.evidence for r in one if r.evidence is not None]
        assert len(bets) >= 6 and all(b.rows == 80 for b in bets)  # each closed sub-window once, every row
        assert [r.evidence for r in one] == [r.evidence for r in two]  # the same log-evidence, bet by bet
        feeds = [d.evidence_feed("m", "s") for d in (next(c for c in x.components if isinstance(c, DriftComponent))
                                                   for x in (first, second))]
        assert feeds[0] is not None and feeds[1] is not None
        np.testing.assert_array_equal(feeds[0].detector.bag, feeds[1].detector.bag)
        # the bag: the reference's held-out counts plus the region counts of every row fed
        assert feeds[0].detector.bag.sum() == feeds[0].regions.reference_rows + 80 * len(bets)


@pytest.mark.slow
def test_a_shift_adds_up_on_the_reducer(tmp_path: Path) -> None:
    """Cluster 0 from 25% to 55% of 80 records a sub-window (measured: the alarm 5 cycles after)."""
    results, daemon = run(tmp_path, 2, ticks=16, shift_at=6)
    with daemons.stopped_after(daemon):
        alarms = [i for i, r in enumerate(results) if r.evidence is not None and r.evidence.alarmed]
        before = [r for r in results[:4] if r.evidence is not None]
        assert before and not any(r.evidence.alarmed for r in before)
        assert alarms, [(r.report.detected, r.evidence) for r in results]
