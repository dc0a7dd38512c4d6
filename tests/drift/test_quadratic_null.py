"""The centroid test's analytic null: the weighted χ² tail against exact values, and its false-alarm rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.centroid import centroid_test
from monitor.drift.twosample.quadratic_null import weighted_chi2_sf
from monitor.drift.twosample.reference_cache import reference_cache
from monitor.drift.twosample.spectrum import PooledScatter
from monitor.drift.twosample.suite import run_drift_suite
from tests.support import realdata


def imhof_sf(t: float, weights: np.ndarray) -> float:
    """``P(Σ wᵢ Zᵢ² ≥ t)`` by Imhof's (1961) inversion integral: numerical, exact to the quadrature's tolerance."""
    def integrand(u: float) -> float:
        theta = 0.5 * np.sum(np.arctan(weights * u)) - 0.5 * t * u
        rho = np.prod((1.0 + (weights * u) ** 2) ** 0.25)
        return float(np.sin(theta) / (u * rho))

    value, _ = integrate.quad(integrand, 0.0, np.inf, limit=2000, epsabs=1e-15, epsrel=1e-10)
    return 0.5 + value / math.pi


@pytest.mark.parametrize("degrees", [1, 5, 50, 384])
@pytest.mark.parametrize("p", [1e-2, 1e-4, 1e-6, 1e-9])
def test_equal_weights_give_the_chi_squared_tail_within_a_few_per_cent(degrees: int, p: float) -> None:
    t = stats.chi2.isf(p, degrees)
    # the saddlepoint's known error: 6-7 % for one degree of freedom, falling with more
    assert weighted_chi2_sf(t, np.ones(degrees)) == pytest.approx(p, rel=0.08 if degrees == 1 else 0.03)


def test_the_rest_as_one_scaled_chi_squared_keeps_the_tail() -> None:
    # 20 weights one by one and 300 small ones by their sum and sum of squares, against all 320 one by one
    rng = np.random.default_rng(0)
    weights = np.sort(np.r_[rng.uniform(0.5, 4.0, 20), rng.uniform(0.001, 0.05, 300)])[::-1]
    top, small = weights[:20], weights[20:]
    for p in (1e-3, 1e-6):
        t = imhof_or_saddlepoint_quantile(weights, p)
        together = weighted_chi2_sf(t, top, rest=(float(small.sum()), float(np.sum(small**2))))
        assert together == pytest.approx(weighted_chi2_sf(t, weights), rel=0.02)


def imhof_or_saddlepoint_quantile(weights: np.ndarray, p: float) -> float:
    low, high = float(weights.sum()), float(weights.sum()) * 100
    for _ in range(80):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if weighted_chi2_sf(middle, weights) > p else (low, middle)
    return high


def test_unequal_weights_match_the_exact_tail_where_the_test_decides() -> None:
    # a spiked spectrum as embeddings have: a few large directions over a long flat tail
    weights = np.r_[8.0, 4.0, 2.0, np.full(60, 0.1)]
    for t in (80.0, 120.0, 160.0):
        exact = imhof_sf(t, weights)
        assert 1e-8 < exact < 1e-2
        assert weighted_chi2_sf(t, weights) == pytest.approx(exact, rel=0.05)


def test_the_body_is_continuous_across_the_mean_and_matches_the_exact_values() -> None:
    weights = np.r_[3.0, np.full(40, 0.2)]
    mean = weights.sum()
    assert weighted_chi2_sf(0.0, weights) == 1.0
    for t in (0.5 * mean, 0.99 * mean, mean, 1.01 * mean, 2.0 * mean):
        assert weighted_chi2_sf(t, weights) == pytest.approx(imhof_sf(t, weights), abs=0.03)
    below, above = weighted_chi2_sf(mean * (1 - 1e-6), weights), weighted_chi2_sf(mean * (1 + 1e-6), weights)
    assert abs(below - above) < 1e-3


def test_degenerate_weights() -> None:
    assert weighted_chi2_sf(1.0, np.zeros(5)) == 0.0  # no variance: any distance is a change
    assert weighted_chi2_sf(1.0, np.r_[1.0, 1e-20, 0.0]) == pytest.approx(stats.chi2.sf(1.0, 1), rel=0.03)
    with pytest.raises(ValueError):
        weighted_chi2_sf(1.0, np.r_[1.0, -1.0])
    with pytest.raises(ValueError):
        weighted_chi2_sf(1.0, np.r_[1.0, np.nan])


def spiked(rng: np.random.Generator, rows: int, dim: int = 48) -> np.ndarray:
    """Rows with a few strong directions and a flat tail, skewed along the strongest (not normal)."""
    scales = np.r_[3.0, 2.0, 1.5, np.full(dim - 3, 0.4)]
    out = rng.normal(size=(rows, dim)) * scales
    out[:, 0] = rng.exponential(3.0, size=rows)  # skewed and bounded below
    return out


@pytest.mark.slow  # 3,000 null pairs: 3.8 s of CPU, 5.7 s of wall in the parallel fast tier
def test_the_null_false_alarm_rate_stays_within_its_bound() -> None:
    # 3,000 independent null pairs of skewed, strongly anisotropic rows, a fresh reference each; at
    # each level the count of p <= level must stay within the 99.9% binomial bound of its expectation
    rng = np.random.default_rng(20261129)
    levels = np.array([0.05, 0.01, 1e-3])
    pairs = 3000
    p_values = np.array([centroid_test(spiked(rng, 200), spiked(rng, 300), null="analytic").p_value
                         for _ in range(pairs)])
    for level in levels:
        bound = stats.binom.ppf(0.999, pairs, level)
        assert np.sum(p_values <= level) <= bound, (level, np.sum(p_values <= level), bound)
    assert np.sum(p_values <= 0.05) >= 0.5 * 0.05 * pairs  # and not uselessly conservative in the body


@pytest.mark.parametrize("rows", ["spiked", "topics"])
def test_the_tail_follows_the_exact_permutation_distribution_of_one_pool(rows: str) -> None:
    """The null is the normal approximation of the permutation distribution given the pooled rows:
    against that distribution itself (40,000 relabellings of one pool), the share of relabellings
    whose statistic reaches the analytic threshold of each level stays below the top of the level's
    99.9% binomial range (and above half the level). Sharper than fresh pairs, whose rate carries
    the exact test's own chance."""
    rng = np.random.default_rng(7)
    if rows == "spiked":
        pool, m = np.r_[spiked(rng, 300), spiked(rng, 500)], 300
    else:
        pool, m = mixture(rng, 800, np.full(16, 1 / 16)), 400
    n = len(pool) - m
    centred = pool - pool.mean(axis=0)
    factor = 1 / m + 1 / n
    weights = np.linalg.eigvalsh(np.cov(pool.T)) * factor
    relabellings, chunk = 40_000, 5_000
    scale = len(pool) / (m * n)  # x̄ - ȳ = N/(m n) × the sum of the window's centred rows
    statistics = []
    for _ in range(relabellings // chunk):
        keys = rng.random((chunk, len(pool)))
        window = keys <= np.partition(keys, m - 1, axis=1)[:, m - 1 : m]  # m rows each, uniformly
        differences = scale * (window @ centred)
        statistics.append(np.einsum("ij,ij->i", differences, differences))
    reached_by = np.concatenate(statistics)
    for level in (0.05, 0.01, 2e-3):
        threshold = optimize.brentq(lambda t, level=level: weighted_chi2_sf(t, weights) - level,
                                    1e-12, 100 * weights.sum())
        reached = int(np.sum(reached_by >= threshold))
        # never above the level's 99.9% binomial range; conservative allowed, but not uselessly so
        assert 0.5 * level * relabellings <= reached <= stats.binom.ppf(0.9995, relabellings, level), (level, reached)


def mixture(rng: np.random.Generator, rows: int, shares: np.ndarray) -> np.ndarray:
    """Unit rows from 16 topic clusters in 64 dimensions, drawn at ``shares``: the shape of real traffic."""
    centres = np.random.default_rng(99).normal(size=(16, 64)) / 8.0
    out = centres[rng.choice(16, rows, p=shares)] + 0.35 * rng.normal(size=(rows, 64))
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_a_topic_share_rise_is_seen_more_often_than_by_the_held_out_null() -> None:
    # one topic's share up by 20 points of traffic: the held-out null fits the mean direction on half
    # the rows and ranks the other half; the analytic one uses every row
    base = np.full(16, 1 / 16)
    risen = base * (1 - 0.2 / (1 - 1 / 16))
    risen[3] += 1 - risen.sum()
    analytic = heldout = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        reference, window = mixture(rng, 500, base), mixture(rng, 500, risen)
        result = centroid_test(window, reference, null="analytic")
        analytic += result.p_value <= 1e-4
        heldout += centroid_test(window, reference, null="heldout", seed=seed).p_value <= 1e-4
        assert result.extra["null"] == "analytic" and result.extra["mean_distance_squared"] > 0
    assert analytic >= 12 and analytic >= 2 * heldout, (analytic, heldout)  # 16 and 6 when written


def test_the_shared_pooled_scatter_gives_the_same_p_value() -> None:
    rng = np.random.default_rng(4)
    reference, window = spiked(rng, 400, dim=200), spiked(rng, 400, dim=200) + 0.05
    cached = reference_cache(reference)
    assert cached is not None
    pooled = PooledScatter(window, reference, cached)
    shared = centroid_test(window, reference, null="analytic", pooled=pooled).p_value
    assert shared == pytest.approx(centroid_test(window, reference, null="analytic").p_value, rel=1e-6)
    assert 50 in pooled._top  # the top eigenpairs the KS basis uses, computed once


@pytest.mark.slow
def test_on_real_sentences_null_splits_stay_quiet_and_a_week_budget_uses_it() -> None:
    rows = realdata.minilm_embeddings(1000).astype(np.float64)
    rng = np.random.default_rng(5)
    p_values = []
    for _ in range(200):
        order = rng.permutation(len(rows))
        p_values.append(centroid_test(rows[order[:400]], rows[order[400:]], null="analytic").p_value)
    # splits of one finite set are not independent draws, and the split makes them negatively
    # dependent; the rate at 0.05 must still be within the binomial bound
    assert sum(p <= 0.05 for p in p_values) <= stats.binom.ppf(0.999, 200, 0.05)
    settings = DriftSettings(interval_seconds=60, false_alarm_every="7d", window_sample_size=500,
                             reference_sample_size=500, threads=1)
    assert settings.null_for("centroid") == "analytic"
    report = run_drift_suite(rows[:500].astype(np.float32), rows[500:].astype(np.float32), settings)
    assert report.result("centroid").extra["null"] == "analytic"


@pytest.mark.parametrize("offset", [0.0, 1e4, 1e8])
def test_the_cached_reference_scatter_keeps_the_spread_of_a_column_far_from_the_origin(offset: float) -> None:
    """The pooled scatter from the reference's cached pieces equals the direct one, and so do the
    analytic p-values, also where a column sits far from the origin (the cached form once summed
    uncentred squares and lost such a column's spread to cancellation: p 0.63 against 0.83 at 10⁸)."""
    from monitor.drift.twosample.reference_cache import ReferenceCache

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((1000, 64)), rng.standard_normal((1000, 64))
    x[:, 1] += offset
    y[:, 1] += offset
    cache = ReferenceCache(y)
    direct, cached = PooledScatter(x, y), PooledScatter(x, y, cache)
    np.testing.assert_allclose(cached.scatter, direct.scatter, rtol=1e-9, atol=1e-6 * direct.scatter[0, 0])
    np.testing.assert_allclose(cached.mean, direct.mean, rtol=1e-12)
    with_cache = centroid_test(x, y, null="analytic", reference=cache).p_value
    assert with_cache == pytest.approx(centroid_test(x, y, null="analytic").p_value, rel=1e-6)
