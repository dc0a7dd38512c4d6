"""The false-alarm rate on null splits of real MiniLM embeddings, where it can be counted.

At the knob's own alphas (2e-6 to 3.5e-4 per cycle for 5 s to 900 s cycles and one false alarm a
month) a few hundred null cycles can only show "no false alarm" (tests/drift/test_intervals.py).
The rate itself is counted here at a per-cycle alpha of 0.05, for each null the knob can pick:
the permutation tests and the held-out tests, plus the region test the explanation uses. Null
splits: window and reference drawn independently from the same real sentences (records repeat,
as in a stream), so under no drift they are exchangeable; a false alarm is a cycle whose verdict
is "drift". bench/drift_eval.py --calibration measures more cycles on larger samples.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from monitor.drift.attribution.region_shares import compare_regions
from monitor.drift.attribution.regions import fit_regions
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import run_drift_suite
from tests.support import topics

CYCLES = 150
ROWS = 300


def bounds(cycles: int, alpha: float) -> tuple[int, int]:
    """The 99.9% two-sided binomial range of false alarms (the lower end shows the test is not dead)."""
    return int(stats.binom.ppf(0.0005, cycles, alpha)), int(stats.binom.ppf(0.9995, cycles, alpha))


@pytest.mark.slow
@pytest.mark.parametrize("null", ["heldout", "permutation", "analytic"])
def test_the_suite_false_alarm_rate_is_within_its_bound(null: str) -> None:
    # 60 s cycles, a false alarm every 20 minutes: alpha 0.05 per cycle, 0.0125 per test
    settings = DriftSettings(  # "analytic" is the centroid's alone: MMD's held-out null beside it
        interval_seconds=60, false_alarm_every="20m", window_sample_size=ROWS, reference_sample_size=ROWS,
        threads=1, mmd={"null": "heldout" if null == "analytic" else null}, centroid={"null": null},
    )
    vectors = topics.embeddings()
    alarms, per_test = 0, dict.fromkeys(settings.enabled_tests, 0)
    for seed in range(CYCLES):
        rng = np.random.default_rng(seed)
        report = run_drift_suite(vectors[topics.draw(rng, ROWS)], vectors[topics.draw(rng, ROWS)], settings, seed=seed)
        alarms += report.detected
        for result in report.results:
            per_test[result.test] += result.p_value <= settings.cycle_alpha
    # the suite: at most alpha (Holm is conservative when the tests agree, so no lower bound)
    assert alarms <= bounds(CYCLES, settings.cycle_alpha)[1], alarms
    low, high = bounds(CYCLES, settings.cycle_alpha)
    for test, count in per_test.items():  # each test alone at 0.05
        assert low <= count <= high, (test, count)


@pytest.mark.slow
def test_the_region_test_names_a_region_of_unchanged_data_at_most_at_its_rate() -> None:
    vectors = topics.embeddings()
    alpha, splits = 0.05, 200
    named, novel = 0, []
    for seed in range(splits):
        rng = np.random.default_rng(10_000 + seed)
        reference = vectors[topics.draw(rng, 2 * ROWS)]
        report = compare_regions(fit_regions(reference, seed=seed), vectors[topics.draw(rng, ROWS)], None,
                                 reference, alpha)
        named += bool(report.shifted) or report.novel_shifted
        novel.append(report.novel_share)
    assert named <= bounds(splits, alpha)[1], named
    assert np.mean(novel) == pytest.approx(0.01, abs=0.005)


@pytest.mark.slow
def test_behind_a_chance_verdict_the_explanation_names_something_at_most_at_q() -> None:
    """500 null cycles at a per-cycle alpha of 0.2, so that chance verdicts happen: nothing is named
    without a verdict, and behind the chance verdicts something is named in at most about ``q`` of
    them (under no drift every naming is false, so this is the explanation's FDR)."""
    settings = DriftSettings(
        interval_seconds=60, false_alarm_every="5m", window_sample_size=ROWS, reference_sample_size=ROWS, threads=1,
        mmd={"null": "heldout"}, centroid={"null": "heldout"}, regions={"fdr_q": 0.05},
    )
    vectors = topics.embeddings()
    verdicts = named_with = named_without = 0
    for seed in range(500):
        rng = np.random.default_rng(20_000 + seed)
        reference = vectors[topics.draw(rng, 2 * ROWS)]
        report = run_drift_suite(vectors[topics.draw(rng, ROWS)], reference, settings, seed=seed,
                                 regions=fit_regions(reference, seed=seed))
        assert report.regions is not None
        named = bool(report.regions.shifted) or report.regions.novel_shifted
        verdicts += report.detected
        named_with += named and report.detected
        named_without += named and not report.detected
    print(f"\n500 null cycles at alpha {settings.cycle_alpha}: {verdicts} chance verdicts, "
          f"something named behind {named_with} of them")
    assert named_without == 0
    assert verdicts > 0 and named_with <= bounds(verdicts, 0.05)[1]
