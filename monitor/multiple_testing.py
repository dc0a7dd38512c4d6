"""Corrections for testing many things at once: Holm (family-wise error) and Benjamini–Hochberg (false discovery rate).

Holm decides the drift cycle across its tests (:func:`monitor.drift.twosample.suite.apply_multiplicity`).
Benjamini–Hochberg serves the KS drift test (across principal components,
:mod:`monitor.drift.twosample.ks`), the region shares and the retrieval comparisons (across metrics,
:mod:`monitor.retrieval.stats`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def benjamini_hochberg(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (step-up; reject where adjusted <= FDR level), in input order.

    adjusted p₍ᵢ₎ = min over j >= i of p₍ⱼ₎·m/j, capped at 1, for the sorted p-values
    p₍₁₎ <= … <= p₍ₘ₎: scipy's ``false_discovery_control`` (``method="bh"``) in its own arithmetic,
    behind the checks the callers rely on (one-dimensional, no NaN, an empty family allowed).

    >>> benjamini_hochberg([0.001, 0.02, 0.03, 0.04, 0.06, 0.15, 0.25]).round(3).tolist()
    [0.007, 0.07, 0.07, 0.07, 0.084, 0.175, 0.25]
    >>> benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.5])).round(3).tolist()
    [0.04, 0.053, 0.053, 0.5]
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError("p_values must be one-dimensional")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError("p-values must lie in [0, 1]")
    if p.size == 0:
        return p.copy()
    # scipy's arithmetic, step for step, without its array-API dispatch (0.7 ms a call, a drift
    # cycle's KS test makes one): tests/retrieval/test_stats.py holds the two equal to the bit
    order = np.argsort(p)
    adjusted = p[order] * (p.size / np.arange(1, p.size + 1, dtype=np.float64))
    np.minimum.accumulate(adjusted[::-1], out=adjusted[::-1])
    out = np.empty_like(adjusted)
    out[order] = adjusted
    return np.clip(out, 0.0, 1.0)


def _unequal_weights(size: int, weights: Sequence[float] | None) -> np.ndarray | None:
    """``weights`` as an array, checked; None when there are none or all are equal (plain Holm, whose
    arithmetic is kept exactly: equal weights decide what unweighted Holm decides, bit for bit)."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=float)
    if w.shape != (size,):
        raise ValueError(f"weights must match the p-values: {w.shape} against {(size,)}")
    if size and (not np.all(np.isfinite(w)) or (w <= 0).any()):
        raise ValueError("weights must be positive and finite")
    return None if size == 0 or np.all(w == w[0]) else w


Threshold = Callable[[float, float, float], float]  # (alpha, weight left, weight) -> a step's threshold


def _about(alpha: float, left: float, weight: float) -> float:
    return alpha * weight / left


def _weighted_steps(p: np.ndarray, w: np.ndarray, alpha: float,
                    threshold: Threshold = _about) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weighted Holm's step order, each step's adjusted p-value ``p · W_left / w`` (before the running
    maximum) and threshold ``alpha · w / W_left``. Sums are ``math.fsum`` (correctly rounded, whatever
    the order), and the order is by ``p · W / w`` itself, so the first step's adjusted p-value is
    exactly :func:`weighted_bonferroni_p_value`'s: the verdict and the cycle's p-value never disagree."""
    total = math.fsum(w)
    order = np.argsort(p * total / w, kind="stable")
    left = np.array([math.fsum(w[order[j:]]) for j in range(len(order))])
    thresholds = np.array([threshold(alpha, float(wl), float(wi)) for wl, wi in zip(left, w[order], strict=True)])
    return order, p[order] * left / w[order], thresholds


def weighted_bonferroni_p_value(p_values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """``min(1, min_i p_i · W / w_i)`` (``W``: the weights' sum; ``k · min p`` with equal weights): at
    most ``alpha`` exactly when weighted Holm (or weighted Bonferroni) rejects something at ``alpha``.
    With equal weights Holm decides ``p <= alpha / k``, and where ``k`` is not a power of two
    ``k · p`` can round across ``alpha`` by an ulp; the drift cycle's p-value
    (:attr:`monitor.drift.twosample.suite.DriftReport.adjusted_p_value`), which knows ``alpha``, settles that.

    >>> weighted_bonferroni_p_value([0.01, 0.04]), weighted_bonferroni_p_value([0.03, 0.01], [4, 1])
    (0.02, 0.0375)
    """
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return 1.0
    w = _unequal_weights(p.size, weights)
    if w is None:
        return min(1.0, p.size * float(p.min()))
    return min(1.0, float((p * math.fsum(w) / w).min()))


def weighted_bonferroni_reject(p_values: Sequence[float], alpha: float, weights: Sequence[float]) -> np.ndarray:
    """Weighted Bonferroni's decisions, ``p_i · W / w_i <= alpha``: the arithmetic of
    :func:`weighted_bonferroni_p_value`, so some test rejects exactly when that p-value is at most ``alpha``.

    >>> weighted_bonferroni_reject([0.03, 0.02], 0.05, [4, 1]).tolist()  # 0.03 · 5/4 = 0.0375; 0.02 · 5 = 0.1
    [True, False]
    """
    p = np.asarray(p_values, dtype=float)
    w = np.asarray(weights, dtype=float)
    return p * math.fsum(w) / w <= alpha


def holm_thresholds(p_values: Sequence[float], alpha: float, weights: Sequence[float] | None = None,
                    threshold: Threshold = _about) -> np.ndarray:
    """Holm's critical value for each test, in input order, and which of them reject.

    The test with the ``r``-th smallest p-value (rank 1..k) is compared with ``alpha / (k - r + 1)``,
    but only while every smaller p-value rejected; ties are ranked in input order.
    Returns an array of thresholds; a test is rejected when its p-value is at most its threshold
    *and* all smaller-ranked tests were rejected (see :func:`holm_reject`).

    ``weights`` (positive; default equal): weighted Holm (Holm 1979, section 5). The tests are
    stepped through in order of ``p_i / w_i``, and the test at a step is compared with
    ``alpha · w_i / W``, ``W`` the weight of the tests not yet rejected, itself included (decided as
    ``p_i · W / w_i <= alpha``: :func:`_weighted_steps`). ``threshold(alpha, W, w_i)`` computes a
    weighted step's threshold (default ``alpha · w_i / W``; the drift suite passes
    :func:`monitor.drift.twosample.calibration.largest_passing`, the largest p-value the step passes). Its first
    step is the weighted Bonferroni test (each test at ``alpha · w_i / Σ w``), so under any
    dependence the chance that some true null is rejected stays at most ``alpha``. Equal weights
    give plain Holm.

    >>> holm_thresholds([0.01, 0.04, 0.03], alpha=0.06).round(4).tolist()
    [0.02, 0.06, 0.03]
    >>> holm_thresholds([0.01, 0.04, 0.03], alpha=0.06, weights=[4, 1, 1]).round(4).tolist()
    [0.04, 0.06, 0.03]
    """
    p = np.asarray(p_values, dtype=float)
    w = _unequal_weights(p.size, weights)
    thresholds = np.empty(p.size)
    if w is None:
        order = np.argsort(p, kind="stable")
        thresholds[order] = alpha / (p.size - np.arange(p.size))
    else:
        order, _, steps = _weighted_steps(p, w, alpha, threshold)
        thresholds[order] = steps
    return thresholds


def holm_reject(p_values: Sequence[float], alpha: float, weights: Sequence[float] | None = None) -> np.ndarray:
    """Holm's step-down decisions, in input order (``weights``: :func:`holm_thresholds`).

    Examples
    --------
    >>> holm_reject([0.01, 0.04, 0.03], alpha=0.05).tolist()
    [True, False, False]
    >>> holm_reject([0.01, 0.02, 0.03], alpha=0.05).tolist()
    [True, True, True]
    >>> holm_reject([0.03, 0.01], alpha=0.05, weights=[4, 1]).tolist()  # 0.03 <= 0.05 * 4/5, then 0.01 <= 0.05
    [True, True]
    """
    p = np.asarray(p_values, dtype=float)
    w = _unequal_weights(p.size, weights)
    if w is None:
        order = np.argsort(p, kind="stable")
        passed = p[order] <= alpha / (p.size - np.arange(p.size))
    else:  # by adjusted p-values, in the same arithmetic as weighted_bonferroni_p_value
        order, adjusted, _ = _weighted_steps(p, w, alpha)
        passed = adjusted <= alpha
    # step-down: stop at the first non-rejection
    steps = np.cumprod(passed).astype(bool)
    reject = np.zeros(p.size, dtype=bool)
    reject[order] = steps
    return reject
