"""Bootstrap intervals, the paired randomisation test, Benjamini–Hochberg and per-slice reports."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from monitor.retrieval.stats import (
    benjamini_hochberg,
    bootstrap_ci,
    compare_paired,
    fold_slices,
    slice_report,
)

# --- Benjamini–Hochberg --------------------------------------------------------------------------------


def test_bh_hand_example_from_seed_000():
    # Seed 000 §21.5.3: seven metrics, alpha 0.05; BH keeps only NDCG@10 (p = 0.001).
    p = [0.001, 0.02, 0.03, 0.04, 0.06, 0.15, 0.25]
    # By hand: p·m/rank = .007, .07, .07, .07, .084, .175, .25; already non-decreasing.
    expected = [0.007, 0.07, 0.07, 0.07, 0.084, 0.175, 0.25]
    adjusted = benjamini_hochberg(p)
    assert adjusted == pytest.approx(expected, abs=1e-12)
    assert (adjusted <= 0.05).tolist() == [True, False, False, False, False, False, False]


def test_bh_step_up_takes_the_minimum_from_above():
    # p·m/rank = 0.04, 0.05, 0.0333…: the last rank's value caps the first two.
    assert benjamini_hochberg([0.02, 0.05, 0.025]).tolist() == pytest.approx([0.0375, 0.05, 0.0375])
    assert benjamini_hochberg([0.9, 0.95]).tolist() == pytest.approx([0.95, 0.95])
    assert benjamini_hochberg([]).tolist() == []


def test_bh_equals_scipy_false_discovery_control():
    rng = np.random.default_rng(11)
    for size in (1, 2, 3, 7, 20, 50, 100, 384):
        for _ in range(20):
            p = rng.uniform(size=size) ** rng.uniform(0.5, 4)
            p[rng.uniform(size=size) < 0.2] = 1.0  # ties at 1
            p[: size // 3] = np.round(p[: size // 3], 2)  # more ties
            expected = scipy_stats.false_discovery_control(p, method="bh")
            # to the bit: the KS test's p-values and the drift golden values ride on it
            assert benjamini_hochberg(p).tobytes() == np.asarray(expected, dtype=np.float64).tobytes()


@pytest.mark.parametrize("bad", [[0.1, 1.5], [-0.1], [np.nan], [[0.1, 0.2]]])
def test_bh_rejects_values_that_are_not_p_values(bad):
    with pytest.raises(ValueError):
        benjamini_hochberg(bad)


# --- bootstrap intervals -------------------------------------------------------------------------------


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(2024)
    true_mean = 8 / (8 + 2)  # Beta(8, 2), seed 000's skewed recall distribution
    repetitions = 200
    covered = 0
    for repetition in range(repetitions):
        sample = rng.beta(8, 2, size=200)
        ci = bootstrap_ci({"recall@10": sample}, resamples=1000, seed=repetition)["recall@10"]
        covered += ci.lower <= true_mean <= ci.upper
    # Central 99.9 % of Binomial(200, 0.95): a correct 95 % interval lands here; a 90 % or a 99 %
    # one would not (their expected counts, 180 and 198, are outside or at the edge).
    low, high = scipy_stats.binom.ppf([0.0005, 0.9995], repetitions, 0.95)
    assert low <= covered <= high, covered


def test_bootstrap_interval_width_follows_the_standard_error():
    rng = np.random.default_rng(5)
    sample = rng.normal(0.5, 0.2, size=2500)
    ci = bootstrap_ci({"m": sample}, resamples=2000, seed=1)["m"]
    standard_error = sample.std(ddof=1) / np.sqrt(sample.size)
    assert ci.upper - ci.lower == pytest.approx(2 * 1.96 * standard_error, rel=0.1)
    assert ci.mean == pytest.approx(sample.mean())
    assert ci.lower < ci.mean < ci.upper
    assert ci.n_queries == 2500 and ci.confidence == 0.95
    narrower = bootstrap_ci({"m": sample}, resamples=2000, confidence=0.5, seed=1)["m"]
    assert narrower.upper - narrower.lower < (ci.upper - ci.lower) / 2


def test_one_resampling_serves_every_metric_and_is_reproducible():
    rng = np.random.default_rng(9)
    values = rng.uniform(size=300)
    both = bootstrap_ci({"a": values, "b": 2 * values}, resamples=500, seed=3)
    # b = 2a on every query: with the same resampled query sets its interval is exactly twice a's.
    assert both["b"].lower == pytest.approx(2 * both["a"].lower, abs=1e-12)
    assert both["b"].upper == pytest.approx(2 * both["a"].upper, abs=1e-12)
    again = bootstrap_ci({"a": values}, resamples=500, seed=3)["a"]
    # (the same draws; a one-column matrix product may round the last bit differently)
    assert (again.lower, again.upper) == pytest.approx((both["a"].lower, both["a"].upper), abs=1e-14)
    other_seed = bootstrap_ci({"a": values}, resamples=500, seed=4)["a"]
    assert (other_seed.lower, other_seed.upper) != (again.lower, again.upper)


def test_bootstrap_accepts_a_generator_and_many_queries_in_blocks():
    values = np.random.default_rng(0).uniform(size=50_000)  # > 1 block of the (B, Q) matrix
    ci = bootstrap_ci({"m": values}, resamples=200, seed=np.random.default_rng(1))["m"]
    assert ci.lower < values.mean() < ci.upper


@pytest.mark.parametrize(
    ("per_query", "options", "message"),
    [
        ({}, {}, "no metrics"),
        ({"a": np.array([])}, {}, "no queries"),
        ({"a": np.ones(3), "b": np.ones(4)}, {}, "shape"),
        ({"a": np.array([np.nan])}, {}, "non-finite"),
        ({"a": np.ones(3)}, {"resamples": 0}, "resamples"),
        ({"a": np.ones(3)}, {"confidence": 1.0}, "confidence"),
    ],
)
def test_bootstrap_rejects_bad_input(per_query, options, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(per_query, **options)


# --- paired comparison ----------------------------------------------------------------------------------


def test_identical_systems_are_not_different():
    values = {"ndcg@10": np.random.default_rng(1).uniform(size=400), "mrr": np.linspace(0, 1, 400)}
    result = compare_paired(values, {name: v.copy() for name, v in values.items()}, seed=2)
    for comparison in result.values():
        assert comparison.p_value == 1.0
        assert comparison.p_value_adjusted == 1.0
        assert not comparison.significant
        assert comparison.difference.lower == comparison.difference.upper == 0.0


def test_a_clearly_better_system_is_significant():
    rng = np.random.default_rng(4)
    a = {"ndcg@10": rng.uniform(0, 0.8, size=300), "recall@100": rng.uniform(0, 0.8, size=300)}
    b = {name: np.clip(v + rng.normal(0.05, 0.05, size=300), 0, 1) for name, v in a.items()}
    result = compare_paired(a, b, resamples=1000, seed=0)
    for comparison in result.values():
        assert comparison.p_value == pytest.approx(1 / 1001)
        assert comparison.significant
        assert 0 < comparison.difference.lower < comparison.difference.mean < comparison.difference.upper
        assert comparison.mean_b > comparison.mean_a


def test_sign_flip_p_value_matches_exhaustive_enumeration():
    differences = np.array([0.3, -0.1, 0.25, 0.4, -0.05, 0.2])
    observed = abs(differences.mean())
    flips = np.array(list(itertools.product([-1.0, 1.0], repeat=differences.size)))
    exact = np.mean(np.abs(flips @ differences / differences.size) >= observed - 1e-12)
    a = {"m": np.zeros(differences.size)}
    result = compare_paired(a, {"m": differences}, resamples=40_000, seed=8)["m"]
    assert result.p_value == pytest.approx(exact, abs=0.01)
    # |sum| >= 1.0 when the flipped magnitudes sum to <= 0.15 ({}, {.1}, {.05}, {.1, .05}: the last
    # one ties exactly) or to >= 1.15 (their complements): 8 of 64 sign vectors.
    assert exact == pytest.approx(8 / 64)


def test_sign_flips_that_tie_the_observed_difference_count_despite_rounding():
    # Ten differences of ±0.1 (seven +, three −): a flip ties |observed| when it has 3 or 7
    # minus signs; summed in another order 0.1s round differently, and those ties must count.
    # Exact: #(minus signs <= 3 or >= 7) / 2^10 = 2 · (1 + 10 + 45 + 120) / 1024.
    differences = np.array([0.1] * 7 + [-0.1] * 3)
    result = compare_paired({"m": np.zeros(10)}, {"m": differences}, resamples=20_000, seed=1)["m"]
    assert result.p_value == pytest.approx(352 / 1024, abs=0.01)


def test_p_values_are_roughly_uniform_when_there_is_no_difference():
    rng = np.random.default_rng(12)
    repetitions = 200
    rejections = 0
    for repetition in range(repetitions):
        a = {"m": rng.uniform(size=60)}
        b = {"m": a["m"] + rng.normal(0, 0.1, size=60)}  # noise, no shift
        rejections += compare_paired(a, b, resamples=400, seed=repetition)["m"].p_value <= 0.05
    low, high = scipy_stats.binom.ppf([0.0005, 0.9995], repetitions, 0.05)
    assert low <= rejections <= high, rejections


def test_bh_adjusts_across_the_compared_metrics():
    rng = np.random.default_rng(21)
    a = {f"m{i}": rng.uniform(size=80) for i in range(5)}
    b = {name: v + rng.normal(0.02 * i, 0.1, size=80) for i, (name, v) in enumerate(a.items())}
    result = compare_paired(a, b, resamples=2000, seed=1)
    raw = np.array([c.p_value for c in result.values()])
    assert [c.p_value_adjusted for c in result.values()] == pytest.approx(benjamini_hochberg(raw).tolist())
    assert [c.significant for c in result.values()] == [c.p_value_adjusted <= 0.05 for c in result.values()]


def test_paired_comparison_needs_the_same_queries_and_metrics():
    with pytest.raises(ValueError, match="same queries"):
        compare_paired({"m": np.ones(3)}, {"m": np.ones(4)})
    with pytest.raises(ValueError, match="lacks"):
        compare_paired({"m": np.ones(3), "n": np.ones(3)}, {"m": np.ones(3)})


# --- slices ------------------------------------------------------------------------------------------------


def test_fold_slices_keeps_the_largest_and_counts_the_rest():
    labels = [f"s{i:02d}" for i in range(25) for _ in range(25 - i)] + [None, None]
    folded, dropped = fold_slices(labels, max_slices=20)
    assert len(set(folded.tolist())) == 20
    assert "other" in set(folded.tolist())
    assert dropped == tuple(f"s{i:02d}" for i in range(19, 25)) + ("unlabelled",)
    assert int(np.count_nonzero(folded == "other")) == sum(25 - i for i in range(19, 25)) + 2
    unchanged, nothing = fold_slices(["a", "b", None], max_slices=3)
    assert unchanged.tolist() == ["a", "b", "unlabelled"] and nothing == ()
    with pytest.raises(ValueError, match="max_slices"):
        fold_slices(["a"], max_slices=0)


def test_slice_report_intervals_sizes_and_warnings():
    rng = np.random.default_rng(3)
    labels = ["head"] * 120 + ["tail"] * 40 + ["exact"] * 12 + [f"rare{i}" for i in range(3)]
    values = {"ndcg@10": rng.uniform(size=len(labels)), "mrr": rng.uniform(size=len(labels))}
    report = slice_report(values, labels, max_slices=4, min_queries=30, resamples=300, seed=0)
    assert report.n_queries == {"exact": 12, "head": 120, "other": 3, "tail": 40}
    assert report.folded == ("rare0", "rare1", "rare2")
    kinds = {(w.kind, w.slice, w.n_queries) for w in report.warnings}
    assert kinds == {("folded_slices", "other", 3), ("small_slice", "exact", 12), ("small_slice", "other", 3)}
    assert all(w.message for w in report.warnings)
    head = np.asarray(labels) == "head"
    assert report.intervals["head"]["mrr"].mean == pytest.approx(values["mrr"][head].mean())
    assert report.intervals["head"]["ndcg@10"].n_queries == 120
    with pytest.raises(ValueError, match="slice labels"):
        slice_report(values, labels[:-1])


def test_slice_report_without_problems_has_no_warnings():
    labels = ["a"] * 40 + ["b"] * 35
    report = slice_report({"m": np.linspace(0, 1, 75)}, labels, resamples=100)
    assert report.warnings == ()
    assert set(report.intervals) == {"a", "b"}
