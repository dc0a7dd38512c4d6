"""The analytic null of a squared distance between means: a weighted sum of χ²₁ variables.

When the rows of two samples (``m`` and ``n`` of them) are independent draws from one
distribution with covariance ``Σ``, the difference of their means is close to normal with
covariance ``Σ (1/m + 1/n)`` (the central limit theorem), and its squared length
``T = ‖x̄ - ȳ‖²`` is distributed as ``Σ λᵢ Zᵢ²``: ``λᵢ`` the eigenvalues of that covariance,
``Zᵢ`` independent standard normals. :func:`weighted_chi2_sf` gives ``P(T ≥ t)``. Only the top of
the spectrum need be known one by one: the many small weights of the rest enter as one scaled χ²
with their sum and sum of squares (Satterthwaite's two moments: a sum of many small terms is
close to it, and its weights are all below the top ones, so the tail stays the top's).

The upper tail, where a drift test decides, comes from the saddlepoint approximation of
Lugannani and Rice (1980) on the cumulant generating function ``K(s) = -½ Σ log(1 - 2 s λᵢ)``:
with ``K'(ŝ) = t``, ``w = sign(ŝ) √(2 (ŝ t - K(ŝ)))`` and ``u = ŝ √K''(ŝ)``,
``P(T ≥ t) ≈ 1 - Φ(w) + φ(w) (1/u - 1/w)`` (Kuonen 1999 for quadratic forms: relative errors
of a few per cent down to the far tail, 6 % for a single χ²₁; tested against the exact
distribution). At the mean itself ``ŝ = 0`` and the formula is 0/0: within :data:`AT_MEAN` of it
the value just beside it stands in (those p-values are near 0.5 and decide nothing).

scipy only.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

AT_MEAN = 1e-4  # relative distance from the mean below which the value beside it stands in
RELATIVE_FLOOR = 1e-12  # weights below this share of the largest are rounding (a rank-deficient covariance)


def weighted_chi2_sf(t: float, weights: np.ndarray, rest: tuple[float, float] = (0.0, 0.0)) -> float:
    """``P(Σ wᵢ Zᵢ² + R ≥ t)`` for independent standard normals ``Zᵢ``, weights ``wᵢ ≥ 0``, and ``R``
    a scaled χ² with ``rest = (sum, sum of squares)`` of the remaining weights (module docstring).

    Examples
    --------
    >>> round(weighted_chi2_sf(3.841459, np.array([1.0])), 4)  # chi-squared with 1 degree of freedom: 0.05
    0.0502
    >>> from scipy import stats
    >>> exact = stats.chi2.sf(40.0, 10)  # ten equal weights: chi-squared with 10 degrees of freedom
    >>> bool(abs(weighted_chi2_sf(40.0, np.ones(10)) / exact - 1) < 0.02)
    True
    >>> bool(abs(weighted_chi2_sf(40.0, np.ones(4), rest=(6.0, 6.0)) / exact - 1) < 0.02)  # six of them as the rest
    True
    """
    w = np.asarray(weights, dtype=np.float64).ravel()
    rest_sum, rest_squares = (float(v) for v in rest)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or not (rest_sum >= 0 and rest_squares >= 0):
        raise ValueError("weights must be finite values >= 0")
    if not (math.isfinite(rest_sum) and math.isfinite(rest_squares)):
        raise ValueError("weights must be finite values >= 0")
    # the rest as h degrees of freedom of scale g (none when it is rounding beside the top weights)
    live = rest_sum > RELATIVE_FLOOR * float(w.sum()) and rest_squares > 0
    scale = rest_squares / rest_sum if live else 0.0
    degrees = rest_sum / scale if scale > 0 else 0.0
    top = max(float(w.max()) if w.size else 0.0, scale)
    if not top > 0:
        return 0.0 if t > 0 else 1.0
    if t <= 0:
        return 1.0
    w = w[w > top * RELATIVE_FLOOR]
    mean = float(w.sum()) + degrees * scale
    if abs(t - mean) < AT_MEAN * mean:
        t = mean * (1.0 + AT_MEAN)

    def slope(s: float) -> float:  # K'(s): increasing on (-inf, 1 / (2 top)), from 0 to +inf
        return float(np.sum(w / (1.0 - 2.0 * s * w))) + degrees * scale / (1.0 - 2.0 * s * scale)

    pole = 0.5 / top
    if t > mean:  # K'(s) >= top / (1 - 2 s top) for a largest weight: the root is left of where that is 2t
        low, high = 0.0, pole * (1.0 - 0.5 * top / t)
        while slope(high) < t and high < pole:  # the largest is the rest's, with under one degree of freedom
            high = pole - 0.25 * (pole - high)
    else:  # K'(s) <= (terms) / (-2 s) for s < 0: the root is right of where that is t / 2
        low, high = -(w.size + degrees) / t, 0.0
    s = optimize.brentq(lambda v: slope(v) - t, low, high, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=200)
    one_minus = 1.0 - 2.0 * s * w
    rest_one_minus = 1.0 - 2.0 * s * scale
    cumulant = -0.5 * float(np.sum(np.log(one_minus))) - 0.5 * degrees * math.log(rest_one_minus)
    curvature = float(np.sum(2.0 * w * w / (one_minus * one_minus))) + 2.0 * degrees * scale**2 / rest_one_minus**2
    root = math.copysign(math.sqrt(max(2.0 * (s * t - cumulant), 0.0)), s)
    u = s * math.sqrt(curvature)
    density = math.exp(-0.5 * root * root) / math.sqrt(2.0 * math.pi)
    return float(min(1.0, max(0.0, special.ndtr(-root) + density * (1.0 / u - 1.0 / root))))
