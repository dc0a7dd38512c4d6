"""Held-out rank tests: learn a witness on one half of the data, rank the other half, Mann–Whitney.

A permutation p-value can never go below ``1 / (1 + permutations)``, so a tiny per-test alpha
(a 5-second cycle with one false alarm a month asks for 5 × 10⁻⁷) would need millions of
relabellings. A held-out test needs none. Split both samples in two (seeded); fit a *witness*, a
function that scores rows so that window rows score high, on the first halves; score the second
halves with it. The witness never saw them, so under no drift the held-out window and reference
rows are exchangeable and so are their scores: the one-sided Mann–Whitney U test of "window
scores are higher" has its exact null whatever the witness is, and reaches any alpha. The price is
power: half of each sample trains, the other half tests.

The p-value is the normal approximation of U with continuity and tie corrections
(``scipy.stats.mannwhitneyu``; its exact distribution when a side has at most 8 rows). In the
upper tail it is conservative: the exact null of U has lighter tails than the normal, so the
approximation's p-value is larger than the exact one (measured against the exact distribution for
100 + 100 to 500 + 500 scores at 3 to 5.5 standard deviations: 1.01 to 2.0 times the exact
p-value; tested).

Scores equal in exact arithmetic are ties. A row that stands in both samples (a catalog document
re-sent) gets one score per copy, and the copies can differ in the last bit: BLAS computes each
row's dot product with a kernel, accumulation order and FMA use that depend on the CPU and on
where the row falls in its block. Ranked as they come, such a pair is a win on one CPU and a loss
on another, and the AUC moves by ``1 / (m n)`` between machines (the golden comparison failed on
an AVX2 CPU this way). So scores closer than :data:`TIE_TOLERANCE` of the largest score, far
above rounding (about ``d ε``) and far below the gap between distinct scores, are merged into
one tie before ranking (:func:`merge_rounding_ties`).

Three witnesses use this: the domain classifier (:mod:`monitor.drift.twosample.classifier`), the kernel
witness of MMD (:func:`kernel_witness`) and the mean-direction witness of the centroid test
(:func:`direction_witness`). numpy and scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

Witness = Callable[[np.ndarray], np.ndarray]
_KERNEL_ENTRIES = 2**22  # float64 kernel entries per block (32 MB)
# Relative gap below which two scores are one tie: a dot product over d <= 4096 terms rounds by
# at most ~d·ε ≈ 1e-12 of its terms' size, while m + n <= 10^4 distinct scores are rarely closer
# than 1e-9 of their range (and merging two such is a conservative tie, not an error).
TIE_TOLERANCE = 1e-9
EXACT_SIDE = 8  # at most this many scores on a side: scipy's exact U null


@dataclass(frozen=True)
class Halves:
    """Both samples split in two: ``*_train`` fit the witness, ``*_test`` are ranked."""

    x_train: np.ndarray
    x_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray


@dataclass(frozen=True)
class RankOutcome:
    """Held-out AUC (``U / (m n)``: 0.5 is indistinguishable, 1.0 fully separated) and its p-value."""

    auc: float
    p_value: float
    test_rows: int


def split_halves(
    x: np.ndarray, y: np.ndarray, rng: np.random.Generator, train_fraction: float = 0.5
) -> Halves:
    """Shuffle each sample (seeded) and cut it at ``train_fraction``; ValueError when a part has < 2 rows."""
    m_train, n_train = int(len(x) * train_fraction), int(len(y) * train_fraction)
    x_order, y_order = split_indices(len(x), len(y), rng, train_fraction)
    x, y = x[x_order], y[y_order]
    return Halves(x[:m_train], x[m_train:], y[:n_train], y[n_train:])


def split_indices(
    m: int, n: int, rng: np.random.Generator, train_fraction: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """The row orders :func:`split_halves` cuts (the first ``int(m · train_fraction)`` of the
    window's train), drawn from ``rng`` the same way."""
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    m_train, n_train = int(m * train_fraction), int(n * train_fraction)
    if min(m_train, n_train, m - m_train, n - n_train) < 2:
        raise ValueError(f"samples too small to split: {m} and {n} rows at train_fraction={train_fraction}")
    return rng.permutation(m), rng.permutation(n)


def rank_test(window_scores: np.ndarray, reference_scores: np.ndarray) -> RankOutcome:
    """One-sided Mann–Whitney test that held-out window rows score higher than reference rows.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> same = rank_test(rng.normal(size=300), rng.normal(size=300))
    >>> round(same.auc, 2), same.p_value > 0.05
    (0.49, True)
    >>> apart = rank_test(rng.normal(3.0, 1.0, size=300), rng.normal(size=300))
    >>> round(apart.auc, 3), apart.p_value < 1e-50
    (0.987, True)
    """
    m, n = len(window_scores), len(reference_scores)
    if min(m, n) <= EXACT_SIDE:  # scipy's exact null (its "auto" choice when a side is this small)
        merged = merge_rounding_ties(np.concatenate([window_scores, reference_scores]))
        u = stats.mannwhitneyu(merged[:m], merged[m:], alternative="greater", method="auto")
        return RankOutcome(float(u.statistic) / (m * n), float(u.pvalue), m + n)
    u1, p_value = _mann_whitney_greater(np.concatenate([window_scores, reference_scores]), m)
    return RankOutcome(u1 / (m * n), p_value, m + n)


def _mann_whitney_greater(scores: np.ndarray, m: int) -> tuple[float, float]:
    """``U`` of the first ``m`` scores and its one-sided p-value, from one sort of the scores.

    ``scipy.stats.mannwhitneyu(..., alternative="greater", method="asymptotic")`` after
    :func:`merge_rounding_ties`, written out: the scores sorted once give both the merged ties and
    their average ranks. The normal approximation with the tie-corrected variance and the
    continuity correction, as scipy's (the same p-value to rounding; tested).
    """
    scores = np.asarray(scores, dtype=np.float64)
    total = len(scores)
    n = total - m
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    gap = TIE_TOLERANCE * float(np.max(np.abs(ordered)))
    starts = np.flatnonzero(np.r_[True, np.diff(ordered) > gap])
    sizes = np.diff(np.r_[starts, total])
    average = starts + (sizes + 1) / 2.0  # 1-based average rank of each tie group
    ranks = np.empty(total)
    ranks[order] = np.repeat(average, sizes)
    u1 = float(ranks[:m].sum()) - m * (m + 1) / 2.0
    ties = sizes.astype(np.float64)
    spread = math.sqrt(m * n / 12.0 * ((total + 1) - float(np.sum(ties**3 - ties)) / (total * (total - 1))))
    z = (u1 - m * n / 2.0 - 0.5) / spread if spread > 0 else (math.inf if u1 - m * n / 2.0 - 0.5 > 0 else -math.inf)
    return u1, float(min(1.0, max(0.0, special.ndtr(-z))))


def merge_rounding_ties(scores: np.ndarray, tolerance: float = TIE_TOLERANCE) -> np.ndarray:
    """``scores`` with each run of values closer than ``tolerance · max|score|`` to its neighbour set to its smallest.

    The ranks then no longer depend on last-bit rounding, only on real differences.

    Examples
    --------
    >>> merge_rounding_ties(np.array([0.3, 0.1 + 0.2, 0.5, -1.0])).tolist()
    [0.3, 0.3, 0.5, -1.0]
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    gap = tolerance * float(np.max(np.abs(ordered)))
    starts = np.r_[True, np.diff(ordered) > gap]
    merged = np.empty_like(scores)
    merged[order] = ordered[starts][np.cumsum(starts) - 1]
    return merged


def heldout_rank_test(halves: Halves, fit: Callable[[np.ndarray, np.ndarray], Witness]) -> RankOutcome:
    """Fit a witness on the training halves, rank the test halves with it."""
    witness = fit(halves.x_train, halves.y_train)
    return rank_test(witness(halves.x_test), witness(halves.y_test))


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float64)."""
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def direction_witness(x_train: np.ndarray, y_train: np.ndarray) -> Witness:
    """``cos(z, mean x) - cos(z, mean y)``: how much more a row points along the window's mean direction.

    Like the centroid test, it sees a turn of the mean and ignores lengths (a uniform rescaling).
    """
    a = unit_rows(x_train.mean(axis=0, dtype=np.float64))
    b = unit_rows(y_train.mean(axis=0, dtype=np.float64))
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("a sample mean is the zero vector; its direction is undefined")
    direction = a - b
    return lambda rows: unit_rows(rows) @ direction


def kernel_witness(bandwidth: float) -> Callable[[np.ndarray, np.ndarray], Witness]:
    """The MMD witness ``mean_x k(z, x) - mean_y k(z, y)`` for the RBF kernel of ``bandwidth``.

    It is the function whose mean difference between the two samples *is* the (biased) MMD, so
    ranking held-out rows by it tests what the MMD tests, without permutations.
    """
    gamma = 1.0 / (2.0 * bandwidth * bandwidth)

    def fit(x_train: np.ndarray, y_train: np.ndarray) -> Witness:
        train = np.concatenate([x_train, y_train]).astype(np.float64)
        train_sq = (train * train).sum(axis=1)
        weights = np.r_[np.full(len(x_train), 1.0 / len(x_train)), np.full(len(y_train), -1.0 / len(y_train))]

        def witness(rows: np.ndarray) -> np.ndarray:
            rows = np.asarray(rows, dtype=np.float64)
            out = np.empty(len(rows))
            step = max(1, _KERNEL_ENTRIES // len(train))  # bounded memory: a kernel block at a time
            for start in range(0, len(rows), step):
                block = rows[start : start + step]
                d2 = (block * block).sum(axis=1)[:, None] + train_sq[None, :] - 2.0 * block @ train.T
                out[start : start + step] = np.exp(-gamma * np.clip(d2, 0.0, None)) @ weights
            return out

        return witness

    return fit
