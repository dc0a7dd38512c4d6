"""Per-component KS tests: agreement with scipy, ties, BH, the bases, the verdicts."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from monitor.drift.twosample.ks import ks_p_values, ks_statistics, ks_test, square_exact_p_values
from monitor.drift.twosample.spectrum import pca_basis, sketched_eigenvectors, top_eigenvectors
from monitor.multiple_testing import benjamini_hochberg


def test_statistics_and_p_values_match_scipy_column_by_column() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6))
    y = rng.normal(0.2, 1.1, size=(95, 6))
    x[:, 3] = np.round(x[:, 3])  # heavy ties, shared between the samples
    y[:, 3] = np.round(y[:, 3])
    d = ks_statistics(x, y)
    p = ks_p_values(d, 120, 95)
    for j in range(6):
        reference = stats.ks_2samp(x[:, j], y[:, j], method="asymp")
        assert d[j] == pytest.approx(reference.statistic, abs=1e-15)
        assert p[j] == pytest.approx(reference.pvalue, rel=1e-12)


def test_exact_method_is_scipys_exact() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 3)), rng.normal(0.8, 1.0, size=(25, 3))
    result = ks_test(x, y, basis="raw", method="exact")
    expected = [stats.ks_2samp(x[:, j], y[:, j], method="exact").pvalue for j in range(3)]
    assert result.extra["component_p_values_adjusted"] == pytest.approx(benjamini_hochberg(np.array(expected)))


@pytest.mark.parametrize("n", [3, 20, 257, 1000])
def test_equal_size_exact_p_values_are_scipys_for_every_statistic(n: int) -> None:
    """Every attainable statistic ``h / n``: the vectorised reflection formula is scipy's exact p-value."""
    h = np.arange(0, n + 1)
    ours = square_exact_p_values(h / n, n, max_terms=n)
    x = np.zeros((n, 1))
    for k in np.unique(np.r_[np.linspace(0, n, 40).astype(int), 1, n]):
        y = np.full((n, 1), 1.0)
        y[: n - k] = 0.0  # n - k ties with x: D = k / n
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            expected = stats.ks_2samp(x[:, 0], y[:, 0], method="exact").pvalue
        assert ks_statistics(x, y)[0] == pytest.approx(k / n)
        if caught:  # scipy's loop overflowed and it fell back to the asymptotic p-value: no exact one to compare
            assert 0.0 <= ours[k] <= 1.0
            continue
        assert ours[k] == pytest.approx(expected, rel=1e-10, abs=1e-300), k
    assert np.all(np.diff(ours) <= 1e-9) and ours[0] == 1.0  # non-increasing, to rounding near p = 1


def test_the_sketched_basis_spans_the_leading_axes_and_depends_on_the_scatter_alone() -> None:
    rng = np.random.default_rng(6)
    d = 384
    rows = rng.normal(size=(1500, d)) * (1.0 / np.sqrt(np.arange(1, d + 1)))  # a power-law spectrum
    scatter = rows.T @ rows
    sketched, exact = sketched_eigenvectors(scatter, 50), top_eigenvectors(scatter, 50)
    assert np.allclose(sketched.T @ sketched, np.eye(50), atol=1e-10)
    captured = np.trace(sketched.T @ scatter @ sketched) / np.trace(exact.T @ scatter @ exact)
    assert captured > 0.95
    assert np.abs(np.sum(sketched[:, :10] * exact[:, :10], axis=0)).min() > 0.99  # the leading axes
    assert np.array_equal(sketched_eigenvectors(scatter.copy(), 50), sketched)  # no state, no data-dependent draw


def test_benjamini_hochberg_is_the_step_up_definition() -> None:
    """adjusted p of the i-th smallest = min over j >= i of p_(j)·m/j, capped at 1 (written out by brute force)."""
    p = np.random.default_rng(2).uniform(size=40) ** 3
    ordered = np.sort(p)
    m = p.size
    by_rank = [min(1.0, min(ordered[j] * m / (j + 1) for j in range(i, m))) for i in range(m)]
    expected = np.array(by_rank)[np.argsort(np.argsort(p, kind="stable"), kind="stable")]
    assert benjamini_hochberg(p) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="must lie in"):
        benjamini_hochberg([0.1, float("nan")])
    assert benjamini_hochberg([]).size == 0


def test_pca_basis_finds_the_stretched_direction() -> None:
    rng = np.random.default_rng(3)
    direction = np.array([3.0, 4.0, 0.0, 0.0]) / 5.0
    sample = rng.normal(size=(2000, 4)) * 0.1 + rng.normal(size=(2000, 1)) * direction
    mean, axes = pca_basis(sample, 2)
    assert axes.shape == (4, 2)
    assert abs(axes[:, 0] @ direction) == pytest.approx(1.0, abs=1e-3)
    assert mean == pytest.approx(sample.mean(axis=0))


@pytest.mark.parametrize("basis", ["pca_pooled", "pca_reference", "raw"])
def test_flags_a_one_component_change_and_stays_quiet_on_the_null(basis: str) -> None:
    rng = np.random.default_rng(4)
    scales = np.r_[1.5, np.ones(29)]  # the reference's top PC is the first axis
    reference = rng.normal(size=(600, 30)) * scales
    quiet = ks_test(rng.normal(size=(600, 30)) * scales, reference, basis=basis, components=10, alpha=0.01)
    changed_rows = rng.normal(size=(600, 30)) * scales
    changed_rows[:, 0] *= 2.0  # that direction twice as spread out
    changed = ks_test(changed_rows, reference, basis=basis, components=10, alpha=0.01)
    assert not quiet.detected and quiet.extra["drifted_components_ratio"] == 0.0
    assert changed.detected and changed.p_value <= 0.01
    assert 0 < changed.extra["drifted_components_ratio"] <= 0.5
    assert changed.extra["components"] == (30 if basis == "raw" else 10)


def test_drifted_components_ratio_counts_the_shifted_dimensions() -> None:
    rng = np.random.default_rng(5)
    reference = rng.normal(size=(800, 20))
    shifted = rng.normal(size=(800, 20)) + np.r_[np.full(5, 0.5), np.zeros(15)]
    result = ks_test(shifted, reference, basis="raw", alpha=0.01)
    assert result.extra["drifted_components_ratio"] == 0.25
    assert result.extra["most_drifted_component"] < 5


def test_test_level_p_value_is_the_simes_combination() -> None:
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(200, 8)), rng.normal(0.1, 1.0, size=(200, 8))
    result = ks_test(x, y, basis="raw")
    p = np.array([stats.ks_2samp(x[:, j], y[:, j], method="exact").pvalue for j in range(8)])
    simes = np.min(np.sort(p) * 8 / np.arange(1, 9))
    assert result.p_value == pytest.approx(min(simes, 1.0))


@pytest.mark.parametrize(("n", "h"), [(250, 65), (500, 90), (1000, 120)])
def test_the_asymptotic_tail_is_anti_conservative_and_auto_is_exact(n: int, h: int) -> None:
    """At p ~ 1e-7 the asymptotic p-value is 10-25% below the exact one: not valid at a tiny alpha."""
    x = np.arange(n, dtype=float)[:, None]
    y = x + h - 0.5  # every reference value h ranks above its window twin: D = h / n exactly
    assert ks_statistics(x, y)[0] == pytest.approx(h / n)
    asymp = ks_p_values(ks_statistics(x, y), n, n)[0]
    exact = stats.ks_2samp(x[:, 0], y[:, 0], method="exact").pvalue
    assert 1e-9 < exact < 1e-5
    assert asymp < 0.92 * exact
    assert ks_test(x, y, basis="raw").p_value == pytest.approx(exact, rel=1e-12)
    assert ks_test(x, y, basis="raw", method="asymp").p_value == pytest.approx(asymp, rel=1e-12)


def test_pca_reference_fits_on_half_and_tests_the_other_half() -> None:
    rng = np.random.default_rng(7)
    result = ks_test(rng.normal(size=(100, 5)), rng.normal(size=(301, 5)), basis="pca_reference", seed=0)
    assert result.extra["reference_size"] == 151
    assert result.extra["window_size"] == 100


def test_components_are_capped_at_the_dimension_and_inputs_are_checked() -> None:
    rng = np.random.default_rng(8)
    assert ks_test(rng.normal(size=(50, 4)), rng.normal(size=(50, 4)), components=50).extra["components"] == 4
    with pytest.raises(ValueError, match="same dimension"):
        ks_test(np.ones((5, 3)), np.ones((5, 4)))
    with pytest.raises(ValueError, match="unknown basis"):
        ks_test(np.ones((5, 3)), np.ones((5, 3)), basis="ica")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="components"):
        ks_test(np.ones((5, 3)), np.ones((5, 3)), components=0)


def test_the_sketched_basis_with_exact_p_values_holds_its_level_on_null_data() -> None:
    """The test's Simes p-value and the leading component's exact p-value on 200 null pairs, with a
    basis the sketch computes (d = 96, 12 components): never above their levels."""
    rng = np.random.default_rng(11)
    scales = 1.0 / np.sqrt(np.arange(1, 97))
    test_p, leading = [], []
    for _ in range(200):
        result = ks_test(rng.normal(size=(120, 96)) * scales, rng.normal(size=(120, 96)) * scales, components=12)
        test_p.append(result.p_value)
        leading.append(result.extra["component_statistics"][0])
    first = square_exact_p_values(np.array(leading), 120)
    for alpha in (0.01, 0.05, 0.1, 0.25, 0.5):
        bound = stats.binom.ppf(0.999, 200, alpha)
        assert np.count_nonzero(np.array(test_p) <= alpha) <= bound, alpha
        assert np.count_nonzero(first <= alpha) <= bound, alpha
    assert np.count_nonzero(first <= 0.5) >= stats.binom.ppf(0.001, 200, 0.4)  # a live test (KS is discrete)
