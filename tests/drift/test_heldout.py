"""Held-out nulls: the Mann–Whitney tail they rely on, their level and their power.

A permutation p-value cannot go below ``1 / (1 + permutations)``; the held-out tests
(:mod:`monitor.drift.twosample.heldout`) reach any alpha because their null is the rank distribution of
held-out rows. That is only honest if the p-value used in the far tail is not smaller than the
exact one: checked against the exact Mann–Whitney distribution.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from monitor.drift.twosample.centroid import centroid_test
from monitor.drift.twosample.heldout import (
    direction_witness,
    heldout_rank_test,
    kernel_witness,
    merge_rounding_ties,
    rank_test,
    split_halves,
)
from monitor.drift.twosample.mmd import mmd_test


@pytest.mark.parametrize(("n", "slack"), [(30, 50.0), (100, 2.5)])
def test_the_normal_tail_of_mann_whitney_is_conservative_where_small_alphas_live(n: int, slack: float) -> None:
    """The p-values the held-out tests use are at least the exact ones, 3 to 5.5 sd out (and, from
    100 rows a side, at most 2.5 times them: conservative, not useless)."""
    reference = np.arange(n, dtype=float)
    sd = np.sqrt(n * n * (2 * n + 1) / 12)
    for z in (3.0, 4.0, 5.0, 5.5):
        u = int(n * n / 2 + z * sd)
        # distinct window scores (no ties) that beat exactly u reference scores in total
        wins = np.full(n, u // n)
        wins[: u % n] += 1
        window = wins - 0.5 + np.arange(n) * 1e-4
        used = rank_test(window, reference)
        exact = stats.mannwhitneyu(window, reference, alternative="greater", method="exact").pvalue
        assert used.auc == pytest.approx(u / (n * n))
        assert exact <= used.p_value <= slack * exact, (z, used.p_value, exact)


def test_held_out_halves_are_a_seeded_split_of_each_sample() -> None:
    x, y = np.arange(20.0)[:, None], 100 + np.arange(30.0)[:, None]
    halves = split_halves(x, y, np.random.default_rng(3))
    assert (len(halves.x_train), len(halves.x_test), len(halves.y_train), len(halves.y_test)) == (10, 10, 15, 15)
    assert sorted(np.r_[halves.x_train, halves.x_test].ravel()) == list(range(20))
    again = split_halves(x, y, np.random.default_rng(3))
    assert np.array_equal(again.y_test, halves.y_test)
    with pytest.raises(ValueError, match="too small to split"):
        split_halves(x[:3], y, np.random.default_rng(0))


@pytest.mark.parametrize("witness", ["kernel", "direction"])
def test_held_out_tests_hold_their_level_on_null_data(witness: str) -> None:
    """300 null draws at 0.05 and 0.01: within the 99.9% binomial bounds (expected 15 and 3)."""
    fit = kernel_witness(3.0) if witness == "kernel" else direction_witness
    p_values = []
    for seed in range(300):
        rng = np.random.default_rng(seed)
        x, y = rng.normal(0.5, 1.0, size=(120, 6)), rng.normal(0.5, 1.0, size=(120, 6))
        p_values.append(heldout_rank_test(split_halves(x, y, rng), fit).p_value)
    p = np.array(p_values)
    assert (p <= 0.05).sum() <= stats.binom.ppf(0.999, 300, 0.05)
    assert (p <= 0.01).sum() <= stats.binom.ppf(0.999, 300, 0.01)
    assert (p <= 0.5).sum() >= stats.binom.ppf(0.001, 300, 0.5)  # not stuck at 1 either


def test_held_out_mmd_and_centroid_reach_a_tiny_alpha_that_permutations_cannot() -> None:
    rng = np.random.default_rng(4)
    reference = rng.normal(0.3, 1.0, size=(600, 16)).astype(np.float32)
    turned = (rng.normal(0.3, 1.0, size=(600, 16)) + np.r_[0.5, np.zeros(15)]).astype(np.float32)
    alpha = 5e-7  # a 5-second cycle with one false alarm a month, per test
    permuted = mmd_test(turned, reference, alpha=alpha, permutations=2000, device="cpu")
    assert not permuted.detected and permuted.extra["p_value_floor"] == pytest.approx(1 / 2001)
    for result in (mmd_test(turned, reference, alpha=alpha, null="heldout", device="cpu"),
                   centroid_test(turned, reference, alpha=alpha, null="heldout")):
        assert result.detected and result.extra["null"] == "heldout" and result.extra["p_value_floor"] == 0.0
        assert result.extra["auc"] > 0.6
    quiet = mmd_test(rng.normal(0.3, 1.0, size=(600, 16)).astype(np.float32), reference, alpha=0.01,
                     null="heldout", device="cpu")
    assert not quiet.detected


def test_held_out_mmd_reports_the_witness_mean_difference_an_unbiased_estimate_of_mmd2() -> None:
    """The held-out statistic is ``mean w(x_test) - mean w(y_test)``: over the splits it averages to the
    whole samples' unbiased MMD² (the permutation test's statistic), and on its own split it is the
    witness's mean difference."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(200, 8)).astype(np.float32), rng.normal(0.2, 1, size=(200, 8)).astype(np.float32)
    permuted = mmd_test(x, y, bandwidth=2.0, permutations=20, device="cpu")
    held = np.array([mmd_test(x, y, bandwidth=2.0, null="heldout", device="cpu", seed=s).statistic for s in range(60)])
    assert abs(held.mean() - permuted.statistic) < 4 * held.std() / np.sqrt(len(held))
    assert permuted.statistic > 0.01 and held.mean() > 0.5 * permuted.statistic
    halves = split_halves(x.astype(np.float64), y.astype(np.float64), np.random.default_rng(0))
    witness = kernel_witness(2.0)(halves.x_train, halves.y_train)
    one = mmd_test(x, y, bandwidth=2.0, null="heldout", device="cpu", seed=0)
    assert one.statistic == pytest.approx(witness(halves.x_test).mean() - witness(halves.y_test).mean(), rel=1e-9)
    with pytest.raises(ValueError, match="null must be"):
        mmd_test(x, y, null="bootstrap", device="cpu")  # type: ignore[arg-type]


def test_a_row_in_both_samples_is_a_tie_whatever_its_last_bit() -> None:
    """The same document scored twice can differ in the last bit (BLAS kernel, row position); the
    rank test must give the same AUC and p whichever copy rounded up: both must count as a tie."""
    rng = np.random.default_rng(3)
    window, reference = rng.normal(size=60), rng.normal(size=80)
    shared = rng.normal(size=20)
    reference[:20] = shared
    outcomes = set()
    for sign in (-1.0, 0.0, 1.0):
        w = window.copy()
        w[:20] = shared + sign * np.abs(shared) * 4e-16  # one or two ulps either way
        outcome = rank_test(w, reference)
        outcomes.add((outcome.auc, outcome.p_value))
    assert len(outcomes) == 1
    # ...and without the merge the last bit would have decided 20 pairs, 20 / (60 * 80) of AUC apart
    unmerged = {stats.mannwhitneyu(shared + s * np.abs(shared) * 4e-16, shared).statistic for s in (-1.0, 1.0)}
    assert len(unmerged) == 2


def test_merging_ties_keeps_real_differences_and_the_order() -> None:
    scores = np.array([5.0, 1.0, 1.0 + 1e-15, 3.0, 1.0 + 1e-6, -2.0])
    merged = merge_rounding_ties(scores)
    assert merged.tolist() == [5.0, 1.0, 1.0, 3.0, 1.0 + 1e-6, -2.0]
    assert merge_rounding_ties(np.array([])).size == 0


def test_the_rank_test_gives_scipys_mann_whitney_after_merging_rounding_ties() -> None:
    """One sort gives the U statistic and the tie-corrected normal p-value; scipy's, to rounding."""
    rng = np.random.default_rng(4)
    for trial in range(60):
        m, n = (int(v) for v in rng.integers(9, 400, size=2))
        window, reference = rng.normal(size=m) + [0.0, 0.3, 1.0][trial % 3], rng.normal(size=n)
        if trial % 2:  # heavy ties, one of them a run across both samples
            window, reference = np.round(window, 1), np.round(reference, 1)
        merged = merge_rounding_ties(np.concatenate([window, reference]))
        expected = stats.mannwhitneyu(merged[:m], merged[m:], alternative="greater", method="asymptotic")
        used = rank_test(window, reference)
        assert used.auc * m * n == pytest.approx(expected.statistic, rel=1e-12)
        assert used.p_value == pytest.approx(expected.pvalue, rel=1e-9, abs=1e-300)
    small = rank_test(np.arange(5.0) + 0.5, np.arange(12.0))  # a side of at most 8: scipy's exact null
    assert small.p_value == stats.mannwhitneyu(np.arange(5.0) + 0.5, np.arange(12.0), alternative="greater",
                                               method="exact").pvalue


def test_the_held_out_mmd_with_its_subsampled_bandwidth_holds_its_level_on_null_data() -> None:
    """mmd_test(null="heldout") as the suite runs it (the cached reference, a bandwidth from a subsample
    of the training rows): its p-values on 300 null pairs are within the binomial range of uniform ones."""
    from monitor.drift.twosample.reference_cache import ReferenceCache

    rng = np.random.default_rng(12)
    p = []
    for seed in range(300):
        x = rng.normal(size=(160, 12)).astype(np.float32)
        y = rng.normal(size=(160, 12)).astype(np.float32)
        p.append(mmd_test(x, y, null="heldout", seed=seed, reference=ReferenceCache(y), bandwidth_points=60).p_value)
    for alpha in (0.01, 0.05, 0.1, 0.25, 0.5):
        low, high = stats.binom.ppf([0.001, 0.999], 300, alpha)
        assert low <= np.count_nonzero(np.array(p) <= alpha) <= high, alpha
