"""The staged cycle's screen: run the costly tests only when the cheap ones see something.

On a quiet window, the common case, every test must run to certify that none rejects, so the
cost of a cycle is the cost of all four tests. The staged cycle asks less of a quiet window. The
cheap tests (KS on the pooled principal axes, the centroid's analytic null) run first, beside a
scale screen on the same axes (:func:`scale_screen_p_value`); the costly ones (the domain
classifier and the held-out MMD, together about 60 % of a cycle at n = 1,000, d = 384) run only
when the smallest of those p-values is at most ``drift.screen_level``. Otherwise they are
*screened*: left out of the cycle, counted as ``p = 1`` like a test the deadline skipped.

**The false-alarm bound does not move.** The verdict is still "some test's p-value is at most its
Holm threshold", over the same planned family of four. A screened test can only turn a rejection
into a non-rejection, never the reverse, so the probability of a false alarm is at most that of
the unstaged cycle, which is at most ``cycle_alpha`` (Bonferroni's union bound, any dependence).
Nothing about the screen's own p-value needs to be exact for that: it only decides what runs.

**What it costs in power.** A shift that the costly tests see at the cycle's tiny per-test alpha
(3 × 10⁻⁶ at a 60 s cycle and a false alarm a week) but that leaves every cheap p-value above the
screen level (0.01) goes unseen while it stays that small. The three screens cover what the
costly tests add: the centroid sees a turn of the mean in every dimension (the classifier's
linear part), KS sees a changed marginal along the top pooled axes (the MMD's largest
directions), and the scale screen sees a changed spread along the leading axes (the classifier's
squared components: an anisotropy change the other two barely notice). ``screen_level: 1`` runs
every test every cycle.

**What it saves.** Under no drift the costly tests run in about ``screen_level`` times the number
of screens of the cycles (at most 3 %, fewer since the screens are positively dependent), so a
quiet cycle costs about what the cheap tests cost.

The scale screen: the rows' squared distances from the pooled mean along each of the ``k``
leading pooled axes, window against reference, two-sided Mann–Whitney per axis (normal
approximation), Bonferroni over the axes. The axes and the mean are symmetric functions of the
pooled rows, so under no drift the labels stay exchangeable and each axis's rank test has its
null.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from scipy import special

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
    return min(found)


def scale_screen_p_value(x: np.ndarray, y: np.ndarray, pooled: PooledScatter, axes: int = SCALE_AXES) -> float:
    """Has the spread along one of the ``axes`` leading pooled axes changed between ``x`` (window) and ``y``?

    The Bonferroni-adjusted smallest of the per-axis two-sided Mann–Whitney p-values of the rows'
    squared centred projections (module docstring).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> y = rng.normal(size=(500, 8)) * [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    >>> x = rng.normal(size=(500, 8)) * [3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    >>> scale_screen_p_value(x, y, PooledScatter(x, y), axes=4) > 0.05
    True
    >>> wider = x * [1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # the leading axis 50 % wider
    >>> scale_screen_p_value(wider, y, PooledScatter(wider, y), axes=4) < 1e-6
    True
    """
    m, n = len(x), len(y)
    axes = min(axes, np.shape(x)[1])
    if m < 1 or n < 1 or axes < 1:
        return 1.0
    leading = pooled.leading_axes(axes)
    centre = pooled.mean @ leading
    squares = np.empty((m + n, axes))
    np.matmul(np.asarray(x, dtype=np.float64), leading, out=squares[:m])
    np.matmul(np.asarray(y, dtype=np.float64), leading, out=squares[m:])
    squares -= centre
    np.square(squares, out=squares)
    # ordinal ranks: one argsort per axis (rows tied exactly, a re-sent row, split their ranks by position,
    # which moves U by at most the tied pairs' count; a screen needs no more)
    order = np.argsort(squares, axis=0)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, m + n + 1)[:, None], axis=0)
    u = ranks[:m].sum(axis=0) - m * (m + 1) / 2.0
    z = (u - m * n / 2.0) / math.sqrt(m * n * (m + n + 1) / 12.0)
    smallest = float(2.0 * special.ndtr(-np.abs(z).max()))
    return min(1.0, axes * smallest)
