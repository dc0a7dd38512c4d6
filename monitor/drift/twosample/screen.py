"""The staged cycle's screen: run the costly tests only when the cheap ones see something.

On a quiet window, the common case, every test must run to certify that none rejects, so the
cost of a cycle is the cost of all four tests. The staged cycle asks less of a quiet window. The
cheap tests (KS on the pooled principal axes, the centroid test) run first, then the screens on
the same pooled scatter: the scale screen (:func:`scale_screen_p_value`) and, when the centroid
test uses a null other than its analytic one, the location screen (that analytic null's test of
the distance between the means). The costly tests (the domain classifier and the held-out MMD,
about two thirds of a cycle at n = 1,000, d = 384) run only when the smallest of these p-values is
at most the level (:func:`screen_level`: ``drift.screen_level``, at least ``MARGIN`` per-test
alphas). Otherwise they are *screened*: left out of the cycle, counted as ``p = 1`` like a test the
deadline skipped.

**The false-alarm bound does not move.** The verdict is still "some test's p-value is at most its
Holm threshold", over the same planned family of four. A screened test can only turn a rejection
into a non-rejection, never the reverse, so the probability of a false alarm is at most that of
the unstaged cycle, which is at most ``cycle_alpha`` (Bonferroni's union bound, any dependence).
Nothing about the screen's own p-value needs to be exact for that: it only decides what runs.

**What it costs in power.** A shift that the costly tests see at the cycle's tiny per-test alpha
(3 × 10⁻⁶ at a 60 s cycle and a false alarm a week) but that leaves every cheap p-value above the
level (0.01) goes unseen while it stays that small. The screens are there to make that rare: the
centroid, or the location screen, sees a moved mean in every dimension (the classifier's linear
part); KS sees a changed marginal along the top pooled axes (the MMD's largest directions); the
scale screen sees a changed spread along the leading axes (the classifier's squared components:
an anisotropy the other two barely notice) and in all directions together (a change confined to
the many small directions, which the MMD sees through the rows' distances). A change of shape
that keeps every marginal, the mean and the spread (a correlation within a plane of equal
variances, a bimodal split that keeps a direction's mean and variance) is the MMD's alone, and
is screened out while it is that pure. ``screen_level: 1`` runs every test every cycle.

**What it saves.** Under no drift the costly tests run in at most about ``screen_level`` times the
number of screened p-values of the cycles (fewer: they are positively dependent), so a quiet
cycle costs about what the cheap tests cost.

The scale screen: the rows' squared distances from the pooled mean along each of the ``k``
leading pooled axes and in all (their squared distance from the pooled mean: a change of spread
in the many small directions, which moves no leading axis but moves the MMD), window against
reference, two-sided Mann–Whitney per column (normal approximation, mid-ranks and the tie
correction where there are ties), Bonferroni over the ``k + 1`` columns. The axes and the mean
are symmetric functions of the pooled rows, so under no drift the labels stay exchangeable and
each column's rank test has its null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from scipy import special, stats

from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.centroid import SPECTRUM_COMPONENTS, mean_distance_test
from monitor.drift.twosample.spectrum import PooledScatter

SCREENING_TESTS = ("ks", "centroid")  # the cheap stage: its p-values and the screens gate the costly one
COSTLY_TESTS = ("classifier", "mmd")
SCALE_AXES = 16  # the classifier's squared components (its default), from the same pooled axes
MARGIN = 100  # the level is never below this many per-test alphas: a costly test near rejecting gets to run


def screen_level(configured: float, test_alpha: float) -> float:
    """The level the cycle screens at: ``drift.screen_level``, raised to ``MARGIN`` times the per-test
    alpha where that is larger (a budget of an alarm an hour at 60 s cycles asks 0.002 of each test:
    there a cheap p-value of 0.02 is no sign that the costly tests would not reject).

    Examples
    --------
    >>> screen_level(0.01, 3.1e-6), screen_level(0.01, 0.002), screen_level(0.01, 0.025)
    (0.01, 0.2, 1.0)
    """
    return min(1.0, max(configured, MARGIN * test_alpha))


def screen_p_value(
    cheap: Mapping[str, TestResult], x: np.ndarray, y: np.ndarray, pooled: Callable[[], PooledScatter],
    spectrum_components: int = SPECTRUM_COMPONENTS,
) -> float | None:
    """The smallest of the cheap tests' p-values (``cheap``: KS and centroid), the location screen's
    and the scale screen's (``pooled``: the cycle's pooled scatter, built on first use); None when a
    cheap test has no result (it raised or the deadline cut it: what it would have said is unknown,
    and an error must not hide a shift, so everything runs).

    The location screen is the centroid's analytic null (the squared distance between the means,
    every dimension), computed here when the centroid test used another null: the cosine of the
    means (its permutation null) barely moves when data centred near the origin shift, which the
    classifier's linear part sees at once.
    """
    if not all(t in cheap for t in SCREENING_TESTS):
        return None
    found = [cheap[t].p_value for t in SCREENING_TESTS]
    if cheap["centroid"].extra.get("null") != "analytic":
        x_mean = np.asarray(x, dtype=np.float64).mean(axis=0)
        y_mean = np.asarray(y, dtype=np.float64).mean(axis=0)
        found.append(mean_distance_test(x_mean, y_mean, len(x), len(y), pooled(), spectrum_components)[1])
    found.append(scale_screen_p_value(x, y, pooled()))
    if not all(np.isfinite(found)):  # a NaN would be skipped by min(): run everything instead
        return None
    return min(found)


def scale_screen_p_value(x: np.ndarray, y: np.ndarray, pooled: PooledScatter, axes: int = SCALE_AXES) -> float:
    """Has the spread changed between ``x`` (window) and ``y``: along one of the ``axes`` leading pooled
    axes, or in all (the squared distance from the pooled mean)?

    The Bonferroni-adjusted smallest of ``axes + 1`` two-sided Mann–Whitney p-values: the rows'
    squared centred projections on each axis, and their squared distances from the pooled mean
    (module docstring).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> spread = np.r_[3.0, 2.0, np.ones(6)]
    >>> x, y = rng.normal(size=(500, 8)) * spread, rng.normal(size=(500, 8)) * spread
    >>> scale_screen_p_value(x, y, PooledScatter(x, y), axes=4) > 0.05
    True
    >>> wider = x * np.r_[1.5, np.ones(7)]  # the leading axis 50 % wider
    >>> scale_screen_p_value(wider, y, PooledScatter(wider, y), axes=4) < 1e-6
    True
    >>> spread = np.r_[3.0, 2.0, np.ones(38)]
    >>> x, y = rng.normal(size=(500, 40)) * spread, rng.normal(size=(500, 40)) * spread
    >>> narrower = x * np.r_[1.0, 1.0, np.full(38, 0.8)]  # only the 38 small directions, none of the 2 axes
    >>> scale_screen_p_value(narrower, y, PooledScatter(narrower, y), axes=2) < 1e-6
    True
    """
    m, n = len(x), len(y)
    axes = min(axes, np.shape(x)[1])
    if m < 1 or n < 1 or axes < 1:
        return 1.0
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x_proj, y_proj = pooled.projected(x, y, axes)  # the KS test's coordinates when it ran on these arrays
    squares = np.empty((m + n, axes + 1))
    np.square(x_proj, out=squares[:m, :axes])
    np.square(y_proj, out=squares[m:, :axes])
    mean = pooled.mean
    for rows, out in ((x, squares[:m, axes]), (y, squares[m:, axes])):  # |z - mean|² = |z|² - 2 z·mean + |mean|²
        np.einsum("ij,ij->i", rows, rows, out=out)
        out -= 2.0 * (rows @ mean)
        out += mean @ mean
    p_values = rank_p_values(squares, m)
    return min(1.0, len(p_values) * float(p_values.min()))


def rank_p_values(values: np.ndarray, m: int) -> np.ndarray:
    """Two-sided Mann–Whitney p-values of each column of ``values`` (N, k), its first ``m`` rows against the rest.

    The normal approximation. A column without ties takes its ranks from one argsort; a column
    with ties (a re-sent row, a constant direction) goes to ``scipy.stats.mannwhitneyu``, whose
    mid-ranks and tie-corrected variance keep the level: ranked by position, half the rows being
    one repeated row put every window copy first and gave p ≈ 10⁻⁹ under no drift.
    """
    total, n = len(values), len(values) - m
    order = np.argsort(values, axis=0)
    ordered = np.take_along_axis(values, order, axis=0)
    tied = np.any(ordered[1:] == ordered[:-1], axis=0)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, total + 1)[:, None], axis=0)
    u = ranks[:m].sum(axis=0) - m * (m + 1) / 2.0
    z = (u - m * n / 2.0) / math.sqrt(m * n * (total + 1) / 12.0)
    p_values = 2.0 * special.ndtr(-np.abs(z))
    for column in np.flatnonzero(tied):
        found = stats.mannwhitneyu(values[:m, column], values[m:, column], alternative="two-sided",
                                   method="asymptotic").pvalue
        p_values[column] = float(found) if np.isfinite(found) else 1.0
    return np.minimum(p_values, 1.0)
