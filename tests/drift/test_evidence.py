"""The accumulating detector: exact conformal p-values, its false-alarm bound under no change, and its
delay on share shifts too small for one window."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from monitor.drift.online.evidence import EvidenceDetector, conformal_p_values, simulate_null_alarms, threshold_for


def _shifted(shares: np.ndarray, delta: float) -> np.ndarray:
    """``shares`` with region 0's share raised by ``delta`` (the others shrink in proportion)."""
    moved = shares * (1 - (shares[0] + delta)) / (1 - shares[0])
    moved[0] = shares[0] + delta
    return moved


def _null_alarms(cycles: int, streams: int, rows: int, k: int, threshold: float, seed: int) -> int:
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(k, 5.0))
    return simulate_null_alarms(rng.multinomial(400, shares), shares, rows, cycles, streams, threshold, seed=seed)


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


@pytest.mark.slow
def test_the_null_false_alarm_rate_over_a_hundred_thousand_cycles() -> None:
    """10^5 simulated cycles at two thresholds: the alarms stay under cycles / A (plus three standard deviations)."""
    for threshold, seed in ((50.0, 3), (1000.0, 4)):
        alarms = _null_alarms(1000, 100, rows=20, k=16, threshold=threshold, seed=seed)
        bound = 100_000 / threshold
        assert alarms <= bound + 3 * math.sqrt(bound), (threshold, alarms, bound)


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
    assert detector.update(np.array([], dtype=int)).log_e == 0.0
