"""The accumulating detector: exact conformal p-values, its false-alarm bound under no change, and its
delay on share shifts too small for one window."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from monitor.drift.online.evidence import (
    EvidenceCells,
    EvidenceDetector,
    conformal_p_values,
    simulate_null_alarms,
    threshold_for,
)


def _shifted(shares: np.ndarray, delta: float) -> np.ndarray:
    """``shares`` with region 0's share raised by ``delta`` (the others shrink in proportion)."""
    moved = shares * (1 - (shares[0] + delta)) / (1 - shares[0])
    moved[0] = shares[0] + delta
    return moved


def _null_alarms(cycles: int, streams: int, rows: int, k: int, threshold: float, seed: int,
                 sets: np.ndarray | None = None) -> int:
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(k, 5.0 if sets is None else 0.5))
    return simulate_null_alarms(rng.multinomial(400, shares), shares, rows, cycles, streams, threshold, sets=sets,
                                seed=seed)


def _product_sets(sizes: tuple[int, ...]) -> np.ndarray:
    """The sets :meth:`EvidenceCells.sets` bets on, for cells that are codes of partitions of ``sizes`` (the last
    one the far bit): one set per region of each partition, one for the far rows."""
    cells = np.arange(int(np.prod(sizes)))
    out, scale = [], 1
    for i, size in enumerate(sizes):
        part = (cells // scale) % size
        out += [part == 1] if i == len(sizes) - 1 else [part == b for b in range(size)]
        scale *= size
    return np.array(out)


def test_the_conformal_p_values_of_exchangeable_rows_are_uniform() -> None:
    rng = np.random.default_rng(0)
    shares = np.r_[0.5, 0.3, 0.15, 0.05]
    bag = rng.multinomial(60, shares)
    p = []
    for _ in range(300):  # each row against the bag and every row before it, as the detector scores them
        labels = rng.choice(4, 40, p=shares)
        p.append(conformal_p_values(labels, bag, rng))
        bag = bag + np.bincount(labels, minlength=4)
    values = np.concatenate(p)
    assert stats.kstest(values, "uniform").pvalue > 1e-3
    assert abs(values.mean() - 0.5) < 0.01


def test_the_null_false_alarm_rate_stays_under_its_bound() -> None:
    """Shiryaev–Roberts at threshold A: at most one false alarm per A cycles on average (10,000 cycles)."""
    cycles, streams, threshold = 500, 20, 50.0
    alarms = _null_alarms(cycles, streams, rows=20, k=8, threshold=threshold, seed=11)
    bound = cycles * streams / threshold
    assert alarms <= bound + 3 * math.sqrt(bound), (alarms, bound)


def test_the_null_false_alarm_rate_stays_under_its_bound_on_the_cells_of_several_partitions() -> None:
    """The mixture over one region of each of two partitions and the far rows: product cells, many of them rare
    (10,000 cycles)."""
    sets = _product_sets((4, 4, 2))
    cycles, streams, threshold = 500, 20, 50.0
    alarms = _null_alarms(cycles, streams, rows=20, k=32, threshold=threshold, seed=12, sets=sets)
    bound = cycles * streams / threshold
    assert alarms <= bound + 3 * math.sqrt(bound), (alarms, bound)


@pytest.mark.slow
def test_the_null_false_alarm_rate_over_a_hundred_thousand_cycles() -> None:
    """10^5 simulated cycles at two thresholds, each for the regions and for the cells of two partitions: the
    alarms stay under cycles / A (plus three standard deviations)."""
    for threshold, seed in ((50.0, 3), (1000.0, 4)):
        for sets, k in ((None, 16), (_product_sets((8, 8, 2)), 128)):
            alarms = _null_alarms(1000, 100, rows=20, k=k, threshold=threshold, seed=seed, sets=sets)
            bound = 100_000 / threshold
            assert alarms <= bound + 3 * math.sqrt(bound), (threshold, k, alarms, bound)


def test_the_cells_of_exchangeable_rows_give_uniform_p_values_and_the_sets_cover_each_partition() -> None:
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(6, 8)) * 3
    draw = lambda n: centres[rng.integers(0, 6, n)] + rng.normal(size=(n, 8))  # noqa: E731
    cells = EvidenceCells.fit(draw(600), regions=6, partitions=2, seed=1)
    assert cells.k == 6 * 6 * 2 and cells.reference_counts.sum() == 300
    sets = cells.sets()
    assert sets.shape == (6 + 6 + 1, cells.k)
    assert (sets[:6].sum(axis=0) == 1).all() and (sets[6:12].sum(axis=0) == 1).all()  # each partition tiles the cells
    bag = cells.reference_counts.copy()
    p = []
    for _ in range(100):
        labels = cells.assign(draw(50))
        p.append(conformal_p_values(labels, bag, rng))
        bag += np.bincount(labels, minlength=cells.k)
    assert stats.kstest(np.concatenate(p), "uniform").pvalue > 1e-3
    # about the far quantile of fresh rows lie beyond the radius
    assert 0.02 < (cells.assign(draw(4000)) >= 36).mean() < 0.12  # the far bit: codes from 6 · 6 on


def test_a_cluster_that_grows_is_found_on_cells_and_nothing_is_found_before() -> None:
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(16, 16)) * 2
    draw = lambda n, up=0.0: centres[np.where(rng.random(n) < up, 0, rng.integers(0, 16, n))] + rng.normal(  # noqa: E731
        size=(n, 16))
    cells = EvidenceCells.fit(draw(1000), regions=16, partitions=2, seed=0)
    detector = EvidenceDetector(cells.reference_counts, threshold_for(60 / (7 * 86400), 0.5), sets=cells.sets(),
                                seed=0)
    assert not any(detector.update(cells.assign(draw(500))).alarmed for _ in range(40))
    delay = next((t for t in range(1, 31) if detector.update(cells.assign(draw(500, up=0.05))).alarmed), None)
    assert delay is not None and delay <= 15, delay


def test_a_share_shift_too_small_for_one_window_is_found_within_a_few_cycles_at_a_week_budget() -> None:
    rng = np.random.default_rng(5)
    k, rows = 16, 500
    shares = np.full(k, 1 / k)
    threshold = threshold_for(60 / (7 * 86400), 0.5)
    delays = []
    for replicate in range(5):
        detector = EvidenceDetector(rng.multinomial(1000, shares), threshold, seed=replicate)
        for _ in range(10):
            assert not detector.update(rng.choice(k, rows, p=shares)).alarmed
        moved = _shifted(shares, 0.05)
        delays.append(next((t for t in range(1, 31) if detector.update(rng.choice(k, rows, p=moved)).alarmed), None))
    assert all(d is not None and d <= 12 for d in delays), delays


def test_bad_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="threshold"):
        EvidenceDetector(np.array([5, 5]), threshold=1.0)
    with pytest.raises(ValueError, match="reference_counts"):
        EvidenceDetector(np.array([5]), threshold=10.0)
    detector = EvidenceDetector(np.array([5, 5]), threshold=10.0)
    with pytest.raises(ValueError, match="region labels"):
        detector.update(np.array([0, 2]))
    assert detector.update(np.array([], dtype=int)).log_e == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="lambdas"):
        EvidenceDetector(np.array([5, 5]), threshold=10.0, lambdas=(0.5, 1.0))
    with pytest.raises(ValueError, match="sets"):
        EvidenceDetector(np.array([5, 5, 5]), threshold=10.0, sets=np.ones((2, 2), dtype=bool))
    with pytest.raises(ValueError, match="every set"):
        EvidenceDetector(np.array([5, 5, 5]), threshold=10.0, sets=np.array([[True, True, True]]))
    with pytest.raises(ValueError, match="regions"):
        EvidenceCells.fit(np.zeros((10, 3)), regions=16)
