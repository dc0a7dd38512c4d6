"""Calibration: the false-alarm knob, multiplicity, sustained alerts, and the suite's verdict
under no drift; plus the settings' validation and the reference profile's persistence."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from monitor.drift.references.profile import ReferenceProfile
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.calibration import (
    TestResult,
    cycle_alpha,
    cycle_alpha_for_sustained,
    parse_duration,
    permutations_needed,
    sustained_false_alarm_every,
    sustained_onset_probability,
)
from monitor.drift.twosample.permutation import sequential_p_value
from monitor.drift.twosample.suite import apply_multiplicity, run_drift_suite, thread_limit
from monitor.multiple_testing import holm_reject

NULL_WINDOWS = 300


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30d", 2_592_000.0), ("12h", 43_200.0), ("1h30m", 5_400.0), ("1w 2d", 777_600.0), ("0.5d", 43_200.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "", "5x", "-1d", "0s", "d"])
def test_parse_duration_rejects_ambiguous_or_empty_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_cycle_alpha_is_interval_over_the_mean_time_between_false_alarms() -> None:
    assert cycle_alpha(3600, parse_duration("30d")) == pytest.approx(1 / 720)
    with pytest.raises(ValueError, match="must be longer than the test interval"):
        cycle_alpha(3600, 3600)


def _holm_by_definition(p: list[float], alpha: float) -> list[bool]:
    k = len(p)
    reject = [False] * k
    for rank, index in enumerate(sorted(range(k), key=lambda i: (p[i], i))):
        if p[index] > alpha / (k - rank):
            break
        reject[index] = True
    return reject


def test_holm_matches_its_definition_and_gives_bonferronis_verdict() -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        p = (rng.uniform(size=rng.integers(1, 6)) ** 4).tolist()
        holm = holm_reject(p, 0.05)
        assert holm.tolist() == _holm_by_definition(p, 0.05)
        assert holm.any() == (min(p) <= 0.05 / len(p))  # same verdict as Bonferroni


def test_apply_multiplicity_redecides_each_test() -> None:
    results = [TestResult(name, 0.0, p, 0.05, True) for name, p in [("a", 0.01), ("b", 0.02), ("c", 0.2)]]
    bonferroni = apply_multiplicity(results, 0.06, "bonferroni")
    holm = apply_multiplicity(results, 0.06, "holm")
    assert [r.detected for r in bonferroni] == [True, True, False]
    assert [r.threshold for r in bonferroni] == pytest.approx([0.02, 0.02, 0.02])
    assert [r.detected for r in holm] == [True, True, False]
    assert [r.threshold for r in holm] == pytest.approx([0.02, 0.03, 0.06])
    with pytest.raises(ValueError, match="unknown multiplicity"):
        apply_multiplicity(results, 0.05, "sidak")  # type: ignore[arg-type]


@pytest.mark.parametrize(("alpha", "n", "m"), [(0.05, 1, 1), (0.1, 2, 3), (0.2, 3, 5)])
def test_sustained_onset_probability_matches_simulation(alpha: float, n: int, m: int) -> None:
    """Independent cycles, each detecting with probability alpha: count new sustained alerts."""
    cycles = 1_000_000
    detected = np.random.default_rng(1).random(cycles) < alpha
    counts = np.convolve(detected, np.ones(m, dtype=int))[m - 1 : cycles]  # detections in the last m
    firing = counts >= n
    onsets = int(np.count_nonzero(firing[1:] & ~firing[:-1]))
    expected = sustained_onset_probability(alpha, n, m) * (len(firing) - 1)
    assert abs(onsets - expected) < 4 * math.sqrt(expected)


def test_sustained_rule_buys_a_much_larger_cycle_alpha() -> None:
    every = parse_duration("30d")
    alpha = cycle_alpha_for_sustained(900, every, 2, 3)
    assert sustained_false_alarm_every(alpha, 2, 3, 900) == pytest.approx(every, rel=1e-9)
    assert alpha > 30 * cycle_alpha(900, every)
    assert cycle_alpha_for_sustained(900, every, 1, 1) == pytest.approx(
        cycle_alpha(900, every) / (1 - cycle_alpha(900, every)), rel=1e-3
    )


def test_sequential_p_value_is_valid_under_the_null() -> None:
    """Observed and null statistics exchangeable: P(p <= alpha) <= alpha, checked for several alpha."""
    rng = np.random.default_rng(2)
    trials, budget = 4000, 399
    ranks = rng.random((trials, budget + 1))
    exceeded = ranks[:, 1:] >= ranks[:, :1]
    p = np.array([sequential_p_value(row, stop_after=10)[0] for row in exceeded])
    for alpha in (0.01, 0.05, 0.1, 0.3):
        bound = stats.binom.ppf(0.999, trials, alpha)
        assert np.count_nonzero(p <= alpha) <= bound
    assert permutations_needed(1e-4) == 10_000
    assert 1 / (1 + permutations_needed(0.003)) < 0.003


def _null_pair(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    scales = np.linspace(2.0, 0.5, 8)
    return rng.normal(size=(size, 8)) * scales + 1.0, rng.normal(size=(size, 8)) * scales + 1.0


@pytest.fixture(scope="module")
def null_reports() -> list:
    """The whole suite on 300 independent null windows, at a cycle alpha of 0.1."""
    settings = DriftSettings(
        interval_seconds=6, false_alarm_every="1m", window_sample_size=60, reference_sample_size=60, threads=1,
        evidence_share=0,  # the suite with the whole budget
    )
    assert settings.cycle_alpha == pytest.approx(0.1)
    rng = np.random.default_rng(3)
    return [run_drift_suite(*_null_pair(rng, 60), settings, seed=i) for i in range(NULL_WINDOWS)]


def test_suite_false_alarm_rate_is_at_most_the_cycle_alpha(null_reports: list) -> None:
    false_alarms = sum(report.detected for report in null_reports)
    assert false_alarms <= stats.binom.ppf(0.999, NULL_WINDOWS, 0.1)
    assert all(not report.errors for report in null_reports)


# 2.2-2.4 s of CPU each but ks; the suite's own false-alarm rate stays in the fast tier
@pytest.mark.parametrize(
    "test", [*(pytest.param(name, marks=pytest.mark.slow) for name in ("mmd", "centroid", "classifier")), "ks"])
def test_each_test_holds_its_level_under_the_null(null_reports: list, test: str) -> None:
    """Each test's own p-values: about 10% at or below 0.1 (KS is conservative at n=60: no lower bound)."""
    p = np.array([report.result(test).p_value for report in null_reports])
    rejections = np.count_nonzero(p <= 0.1)
    low, high = stats.binom.ppf([0.001, 0.999], NULL_WINDOWS, 0.1)
    assert rejections <= high
    if test != "ks":
        assert rejections >= low


def test_suite_detects_a_shift_and_holm_only_adds_detections() -> None:
    rng = np.random.default_rng(4)
    window, reference = _null_pair(rng, 200)
    window[:, :3] += 0.4
    holm = DriftSettings(interval_seconds=60, false_alarm_every="1h", multiplicity="holm", threads=1)
    bonferroni = holm.model_copy(update={"multiplicity": "bonferroni"})
    by_holm = run_drift_suite(window, reference, holm, seed=0)
    by_bonferroni = run_drift_suite(window, reference, bonferroni, seed=0)
    assert by_holm.detected and by_bonferroni.detected
    assert set(by_bonferroni.detected_tests) <= set(by_holm.detected_tests)
    assert [r.p_value for r in by_holm.results] == [r.p_value for r in by_bonferroni.results]
    assert by_holm.cycle_alpha == pytest.approx(1 / 120)  # half of 1 / 60: the other half is evidence_share's


def test_suite_subsamples_runs_only_enabled_tests_and_survives_a_failing_one() -> None:
    rng = np.random.default_rng(5)
    settings = DriftSettings(
        interval_seconds=60, false_alarm_every="1h", window_sample_size=50, reference_sample_size=80,
        mmd={"enabled": False}, classifier={"enabled": False},
    )
    window = np.r_[np.ones((25, 2)), -np.ones((25, 2))]  # mean exactly zero: the centroid test fails
    report = run_drift_suite(window, rng.normal(size=(300, 2)), settings, seed=1)
    assert (report.window_size, report.reference_size) == (50, 80)
    assert [r.test for r in report.results] == ["ks"]
    assert "zero vector" in report.errors["centroid"]
    assert report.cycle_alpha == pytest.approx(1 / 120)
    with pytest.raises(KeyError, match="mmd"):
        report.result("mmd")
    with pytest.raises(ValueError, match="same dimension"):
        run_drift_suite(np.ones((5, 2)), np.ones((5, 3)), settings)


@pytest.mark.slow  # torch: its import costs each worker 3 s of CPU
def test_thread_limit_caps_torch_and_blas_then_restores_them() -> None:
    import torch
    from threadpoolctl import threadpool_info

    before = torch.get_num_threads()
    blas_before = [pool["num_threads"] for pool in threadpool_info()]
    with thread_limit(1):
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    assert torch.get_num_threads() == before
    assert [pool["num_threads"] for pool in threadpool_info()] == blas_before
    with thread_limit(None):
        assert torch.get_num_threads() == before


def test_settings_defaults_and_derived_values() -> None:
    settings = DriftSettings()
    assert settings.enabled_tests == ("mmd", "ks", "centroid", "classifier")
    # half the budget to the suite, half to the accumulating detector (evidence_share)
    assert settings.cycle_alpha == pytest.approx(900 / 2_592_000 / 2)
    assert settings.evidence_threshold == pytest.approx(2 * 2_592_000 / 900)
    # the centroid's auto weight, 6 of 9 (its analytic null): the strictest share is 1/9
    assert settings.test_alpha == pytest.approx(settings.cycle_alpha / 9)
    assert settings.permutations_for("mmd") == 51_840  # beyond max_permutations: the held-out null
    assert settings.null_for("mmd") == "heldout"
    whole = DriftSettings(evidence_share=0)
    assert whole.cycle_alpha == pytest.approx(900 / 2_592_000) and whole.permutations_for("mmd") == 11_520
    assert settings.reference.mode == "first_records"
    assert DriftSettings(reference={"path": "/tmp/ref.npz", "lagged_seconds": 60}).reference.mode == "pinned"
    sustained = DriftSettings(sustained={"detections": 2, "cycles": 3})
    assert sustained.permutations_for("mmd") == 426  # the larger cycle alpha needs few permutations
    assert sustained.cycle_alpha > 30 * settings.cycle_alpha


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"false_alarm_every": "30"}, "not a duration"),
        ({"false_alarm_every": "1h", "interval_seconds": 7200}, "must be longer than interval_seconds"),
        ({"mmd": {"permutations": 100}}, "mmd.permutations=100 can never detect"),
        ({"mmd": {"null": "analytic"}}, "'auto', 'permutation' or 'heldout'"),  # the analytic null is the centroid's
        ({"centroid": {"null": "exact"}}, "'auto', 'permutation', 'heldout' or 'analytic'"),
        ({"online": {"detectors": {"adwin": {"dlta": 0.1}}}}, r"adwin does not take \['dlta'\]"),
        ({"online": {"detectors": {"cusum": {}}}}, "'adwin', 'page_hinkley' or 'kswin'"),
        ({"sustained": {"detections": 3, "cycles": 2}}, "cannot exceed cycles"),
        ({"window_sampel_size": 10}, "Extra inputs are not permitted"),
        ({"device": "tpu"}, "'auto', 'cpu' or 'cuda'"),
        (
            {"mmd": {"enabled": False}, "ks": {"enabled": False}, "centroid": {"enabled": False},
             "classifier": {"enabled": False}},
            "every test is disabled",
        ),
    ],
)
def test_settings_reject_bad_values_with_a_clear_message(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DriftSettings(**overrides)


def test_reference_profile_round_trips_through_npz_atomically(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    profile = ReferenceProfile(
        sample=rng.normal(size=(100, 6)), centroid=rng.normal(size=6), count=5000,
        captured_at=1_700_000_000.5, source="first 5000 records",
    )
    path = tmp_path / "state" / "ref-model-stream.npz"
    profile.to_npz(path)
    restored = ReferenceProfile.from_npz(path)
    assert restored.sample.dtype == np.float32 and np.array_equal(restored.sample, profile.sample)
    assert np.array_equal(restored.centroid, profile.centroid)
    assert (restored.count, restored.captured_at, restored.source) == (5000, 1_700_000_000.5, "first 5000 records")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    baseline = restored.signal_baseline()
    assert baseline.centroid_unit == pytest.approx(profile.centroid / np.linalg.norm(profile.centroid))


def test_reference_profile_refuses_inconsistent_data(tmp_path: Path) -> None:
    sample = np.ones((10, 3))
    with pytest.raises(ValueError, match="centroid must have shape"):
        ReferenceProfile(sample=sample, centroid=np.ones(4), count=10, captured_at=0.0, source="x")
    with pytest.raises(ValueError, match="count"):
        ReferenceProfile(sample=sample, centroid=np.ones(3), count=5, captured_at=0.0, source="x")
    with pytest.raises(ValueError, match="non-finite"):
        ReferenceProfile.from_sample(np.full((10, 3), np.nan), captured_at=0.0, source="x")
    stale = tmp_path / "old.npz"
    np.savez(stale, format_version=np.int64(0), sample=sample)
    with pytest.raises(ValueError, match="unsupported reference format version 0"):
        ReferenceProfile.from_npz(stale)
