"""Drift that fires at any cycle length: real MiniLM embeddings at 5 s, 60 s and 900 s cycles.

The knob is the production one (one false alarm a month), so the per-test alpha runs from
4.8e-7 (5 s) to 8.7e-5 (900 s): far below what a permutation test could reach at 5 s and 60 s,
where the MMD and centroid tests use their held-out nulls. Through the drift component with a
real state registry and an injected clock: records arrive at a steady rate (1,500 per cycle),
the window spans two cycles, and the change starts half-way through a cycle, so the first cycle
after it sees a quarter of the window changed and the second three quarters. The two changes:

- a topic shift of 3,000 records: the stream's sentences come from two help topics the reference
  never had (the debugger's commands, the format-string mini-language) for the two cycles;
- a model swap: a rotated copy of the model (a random orthogonal rotation of the same real
  embeddings, ``realdata.random_rotation``): every norm, angle and spectrum stays, every vector
  moves.

Both must be flagged within 2 cycles at each interval; the null false-alarm rate must stay
within its binomial bound (tests/drift/test_null_rate.py measures it where it can be counted).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import run_drift_suite
from tests.support import topics
from tests.support.drift import TopicStream

INTERVALS = (5.0, 60.0, 900.0)


@pytest.mark.slow
@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("change", ["topic_shift", "model_swap"])
def test_a_topic_shift_and_a_model_swap_are_flagged_within_two_cycles(
    tmp_path: Path, interval: float, change: str
) -> None:
    stream = TopicStream(tmp_path / "state", interval)
    try:
        before, after = stream.until_changed(change)
    finally:
        stream.close()
    assert [c.report.detected for c in before] == [False, False, False]
    assert any(c.report.detected for c in after), f"{change} not flagged within 2 cycles of {interval:g}s"


# 900 s: with half the month's budget to the accumulating detector (evidence_share), a test's alpha
# needs 23,040 permutations, beyond max_permutations: MMD's held-out null and the centroid's analytic
# one; an hour needs 5,760
@pytest.mark.parametrize(("interval", "null"), [(5.0, "heldout"), (60.0, "heldout"), (900.0, "heldout"),
                                                (3600.0, "permutation")])
def test_the_knob_picks_a_null_that_reaches_the_per_test_alpha(interval: float, null: str) -> None:
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d")
    assert settings.null_for("mmd") == null
    assert settings.null_for("centroid") == ("analytic" if null == "heldout" else null)
    if null == "permutation":
        assert 1 / (1 + settings.permutations_for("mmd")) <= settings.test_alpha


def binomial_bound(cycles: int, alpha: float, confidence: float = 0.999) -> int:
    """The most false alarms ``cycles`` null cycles at ``alpha`` give, at ``confidence``."""
    return int(stats.binom.ppf(confidence, cycles, alpha))


@pytest.mark.slow
@pytest.mark.parametrize("interval", INTERVALS)
def test_no_false_alarm_on_null_splits_at_each_interval(interval: float) -> None:
    """40 null cycles per interval: at alphas of 2e-6 to 3.5e-4 the bound is 0 or 1 false alarm."""
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=300,
                             reference_sample_size=300, threads=1)
    vectors = topics.embeddings()
    cycles = 40
    alarms = 0
    for seed in range(cycles):
        rng = np.random.default_rng(1000 + seed)
        report = run_drift_suite(vectors[topics.draw(rng, 300)], vectors[topics.draw(rng, 300)], settings, seed=seed)
        alarms += report.detected
    assert alarms <= binomial_bound(cycles, settings.cycle_alpha) <= 1
    assert math.isclose(settings.cycle_alpha, interval / 2_592_000 / 2)  # the suite's half of the budget
