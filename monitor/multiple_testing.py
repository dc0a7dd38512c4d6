"""Benjamini–Hochberg adjusted p-values: false discovery rate control when many things are tested at once.

Used by the KS drift test (across principal components, :mod:`monitor.drift.ks`) and by the
retrieval comparisons (across metrics, :mod:`monitor.retrieval.stats`). numpy only. The drift
cycle's family-wise corrections across its tests (Bonferroni, Holm) are in
:mod:`monitor.drift.calibration`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def benjamini_hochberg(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values (step-up; reject where adjusted <= FDR level), in input order.

    adjusted p₍ᵢ₎ = min over j >= i of p₍ⱼ₎·m/j, capped at 1, for the sorted p-values
    p₍₁₎ <= … <= p₍ₘ₎ (ties keep their input order).

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
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    step_up = np.minimum.accumulate(scaled[::-1])[::-1]
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(step_up, 1.0)
    return adjusted
