"""How sure we are of a retrieval metric: bootstrap intervals, paired tests, FDR control, slices.

A mean over a few hundred queries moves by several points from one query sample to the next,
so every number the ``evaluate`` command or a probe reports comes with a confidence interval,
and every "B is better than A" with a p-value corrected for testing many metrics at once.

All resampling is over queries (the unit that was sampled) and vectorised: one block of the
(B, Q) resampling matrix is drawn at a time, turned into per-query counts (or signs) and applied to
every metric at once with one matrix product. Randomness comes only from the ``seed`` argument
(an int or a ``numpy.random.Generator``), so a report is reproducible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from monitor.multiple_testing import benjamini_hochberg

__all__ = [
    "ConfidenceInterval",
    "PairedComparison",
    "SliceReport",
    "SliceWarning",
    "benjamini_hochberg",
    "bootstrap_ci",
    "compare_paired",
    "fold_slices",
    "slice_report",
]

Seed = int | np.random.Generator

# Elements of one block of the (B, Q) resampling matrix (~32 MB as float64): bounds memory for
# large Q while keeping each block big enough for one efficient matrix product.
_BLOCK_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class ConfidenceInterval:
    """A mean over queries with its percentile-bootstrap interval."""

    mean: float
    lower: float
    upper: float
    n_queries: int
    confidence: float


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """System B against system A on the same queries; ``difference`` is of mean(B − A)."""

    metric: str
    mean_a: float
    mean_b: float
    difference: ConfidenceInterval
    p_value: float
    p_value_adjusted: float
    significant: bool


@dataclass(frozen=True, slots=True)
class SliceWarning:
    """Something a reader of per-slice numbers must know, as data (for logs, JSON, metrics)."""

    kind: Literal["small_slice", "folded_slices"]
    slice: str
    n_queries: int
    message: str


@dataclass(frozen=True, slots=True)
class SliceReport:
    """Per-slice intervals: ``intervals[slice][metric]``; ``folded`` lists labels merged into ``other``."""

    intervals: dict[str, dict[str, ConfidenceInterval]]
    n_queries: dict[str, int]
    folded: tuple[str, ...]
    warnings: tuple[SliceWarning, ...]


def bootstrap_ci(
    per_query: Mapping[str, np.ndarray],
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: Seed = 0,
) -> dict[str, ConfidenceInterval]:
    """Percentile-bootstrap interval of each metric's mean, resampling queries with replacement.

    The same resampled query sets serve every metric, so intervals of related metrics are
    consistent with each other.

    >>> values = {"ndcg@10": np.linspace(0.0, 1.0, 101)}
    >>> ci = bootstrap_ci(values, resamples=2000, seed=7)["ndcg@10"]
    >>> round(ci.mean, 3), round(ci.lower, 2), round(ci.upper, 2), ci.n_queries
    (0.5, 0.45, 0.56, 101)
    """
    names, values = _metric_matrix(per_query)
    _check_resampling(resamples, confidence)
    means = _bootstrap_means(values, resamples, np.random.default_rng(seed))
    lower, upper = _percentiles(means, confidence)
    point = values.mean(axis=0)
    return {
        name: ConfidenceInterval(float(point[j]), float(lower[j]), float(upper[j]), values.shape[0], confidence)
        for j, name in enumerate(names)
    }


def compare_paired(
    system_a: Mapping[str, np.ndarray],
    system_b: Mapping[str, np.ndarray],
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    alpha: float | None = None,
    seed: Seed = 0,
) -> dict[str, PairedComparison]:
    """Is B different from A? Paired over queries, for each metric both systems report.

    The p-value is a two-sided paired randomisation test: under "no difference" each query's
    B − A could have had either sign, so the observed |mean difference| is ranked among
    ``resamples`` random sign flips; p = (1 + #{|flipped| >= |observed|}) / (resamples + 1),
    never 0. The interval of the difference is a paired bootstrap (the same queries resampled
    for both systems). p-values are Benjamini–Hochberg adjusted across the metrics compared;
    ``significant`` is adjusted p <= ``alpha`` (default 1 − ``confidence``).

    >>> rng = np.random.default_rng(3)
    >>> a = {"mrr@10": rng.uniform(size=200), "recall@10": rng.uniform(size=200)}
    >>> b = {"mrr@10": a["mrr@10"] + 0.1, "recall@10": a["recall@10"].copy()}
    >>> result = compare_paired(a, b, seed=1)
    >>> result["mrr@10"].p_value, result["mrr@10"].significant
    (0.000999000999000999, True)
    >>> result["recall@10"].p_value, result["recall@10"].significant
    (1.0, False)
    """
    names, a_values = _metric_matrix(system_a)
    b_names, b_values = _metric_matrix({name: system_b[name] for name in names if name in system_b})
    if b_names != names:
        raise ValueError(f"system B lacks metrics {sorted(set(names) - set(b_names))}")
    if a_values.shape != b_values.shape:
        raise ValueError(
            f"systems have {a_values.shape[0]} and {b_values.shape[0]} queries; "
            "a paired test needs the same queries"
        )
    _check_resampling(resamples, confidence)
    alpha = 1.0 - confidence if alpha is None else alpha
    rng = np.random.default_rng(seed)
    differences = b_values - a_values
    lower, upper = _percentiles(_bootstrap_means(differences, resamples, rng), confidence)
    p_values = _sign_flip_p_values(differences, resamples, rng)
    adjusted = benjamini_hochberg(p_values)
    mean_a, mean_b, mean_diff = a_values.mean(axis=0), b_values.mean(axis=0), differences.mean(axis=0)
    n = a_values.shape[0]
    return {
        name: PairedComparison(
            metric=name,
            mean_a=float(mean_a[j]),
            mean_b=float(mean_b[j]),
            difference=ConfidenceInterval(float(mean_diff[j]), float(lower[j]), float(upper[j]), n, confidence),
            p_value=float(p_values[j]),
            p_value_adjusted=float(adjusted[j]),
            significant=bool(adjusted[j] <= alpha),
        )
        for j, name in enumerate(names)
    }


def fold_slices(
    labels: Sequence[Hashable | None], *, max_slices: int = 20, other: str = "other"
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Cap the number of distinct slice labels (they become metric labels, so they must stay bounded).

    With more than ``max_slices`` distinct labels, the ``max_slices − 1`` most frequent are kept
    (ties by name) and the rest become ``other``. ``None`` becomes ``"unlabelled"``. Returns the
    folded labels and the labels that were folded away.

    >>> folded, dropped = fold_slices(["head"] * 3 + ["tail"] * 2 + ["rare", "odd"], max_slices=3)
    >>> folded.tolist(), dropped
    (['head', 'head', 'head', 'tail', 'tail', 'other', 'other'], ('odd', 'rare'))
    """
    if max_slices < 1:
        raise ValueError(f"max_slices must be >= 1, got {max_slices}")
    names = ["unlabelled" if label is None else str(label) for label in labels]
    counts = Counter(names)
    if len(counts) <= max_slices:
        return np.asarray(names, dtype=object), ()
    ranked = sorted(counts, key=lambda name: (-counts[name], name))
    kept = set(ranked[: max_slices - 1])
    folded = tuple(sorted(set(ranked[max_slices - 1 :])))
    return np.asarray([name if name in kept else other for name in names], dtype=object), folded


def slice_report(
    per_query: Mapping[str, np.ndarray],
    labels: Sequence[Hashable | None],
    *,
    max_slices: int = 20,
    min_queries: int = 30,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: Seed = 0,
) -> SliceReport:
    """Bootstrap intervals per slice (head/tail, exact/semantic, …), with warnings as data.

    A slice with fewer than ``min_queries`` queries gets a ``small_slice`` warning: its interval
    is wide and its mean moves with a handful of queries. Folding past ``max_slices`` gets a
    ``folded_slices`` warning naming how many queries went to ``other``.
    """
    names, values = _metric_matrix(per_query)
    if len(labels) != values.shape[0]:
        raise ValueError(f"{len(labels)} slice labels for {values.shape[0]} queries")
    other = "other"
    folded_labels, folded = fold_slices(labels, max_slices=max_slices, other=other)
    rng = np.random.default_rng(seed)
    intervals: dict[str, dict[str, ConfidenceInterval]] = {}
    sizes: dict[str, int] = {}
    warnings: list[SliceWarning] = []
    if folded:
        n_folded = int(np.count_nonzero(folded_labels == other))
        warnings.append(
            SliceWarning(
                "folded_slices",
                other,
                n_folded,
                f"{len(folded)} slices beyond the cap of {max_slices} folded into {other!r} ({n_folded} queries)",
            )
        )
    for name in sorted(set(folded_labels.tolist())):
        members = folded_labels == name
        sizes[name] = int(np.count_nonzero(members))
        subset = {metric: values[members, j] for j, metric in enumerate(names)}
        intervals[name] = bootstrap_ci(subset, resamples=resamples, confidence=confidence, seed=rng)
        if sizes[name] < min_queries:
            warnings.append(
                SliceWarning(
                    "small_slice",
                    name,
                    sizes[name],
                    f"slice {name!r} has {sizes[name]} queries (< {min_queries}); its numbers are too noisy to act on",
                )
            )
    return SliceReport(intervals, sizes, folded, tuple(warnings))


def _metric_matrix(per_query: Mapping[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """(Q, M) float64 matrix of the per-query values, metrics in mapping order."""
    names = list(per_query)
    if not names:
        raise ValueError("no metrics given")
    columns = [np.asarray(per_query[name], dtype=np.float64) for name in names]
    n = columns[0].shape
    for name, column in zip(names, columns, strict=True):
        if column.ndim != 1 or column.shape != n:
            raise ValueError(f"metric {name!r} has shape {column.shape}; expected one value per query {n}")
        if not np.isfinite(column).all():
            raise ValueError(f"metric {name!r} has non-finite values")
    if n[0] == 0:
        raise ValueError("no queries to resample")
    return names, np.column_stack(columns)


def _check_resampling(resamples: int, confidence: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _blocks(resamples: int, n_queries: int) -> list[int]:
    rows = max(1, _BLOCK_ELEMENTS // n_queries)
    return [min(rows, resamples - start) for start in range(0, resamples, rows)]


def _bootstrap_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(B, M) means of the metrics over B resampled query sets: counts (B, Q) @ values (Q, M) / Q."""
    n = values.shape[0]
    means = []
    for rows in _blocks(resamples, n):
        picks = rng.integers(0, n, size=(rows, n))
        offsets = (np.arange(rows) * n)[:, None]
        counts = np.bincount((picks + offsets).ravel(), minlength=rows * n).reshape(rows, n)
        means.append(counts.astype(np.float64) @ values / n)
    return np.concatenate(means)


def _sign_flip_p_values(differences: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Two-sided paired randomisation test of mean difference 0, for every column at once."""
    n = differences.shape[0]
    observed = np.abs(differences.mean(axis=0))
    # Flipped sums add the same numbers in another order: forgive rounding when they tie.
    tolerance = 1e-9 * np.abs(differences).mean(axis=0)
    at_least_as_extreme = np.zeros(differences.shape[1])
    for rows in _blocks(resamples, n):
        signs = rng.integers(0, 2, size=(rows, n)).astype(np.float64) * 2.0 - 1.0
        flipped = np.abs(signs @ differences / n)
        at_least_as_extreme += np.count_nonzero(flipped >= observed - tolerance, axis=0)
    return (1.0 + at_least_as_extreme) / (resamples + 1.0)


def _percentiles(means: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    tail = (1.0 - confidence) / 2.0
    lower, upper = np.quantile(means, [tail, 1.0 - tail], axis=0)
    return lower, upper
