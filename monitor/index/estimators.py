"""The index probe's estimators, as pure functions (docs/index.md states their guarantees).

Recall against the engine's own exact answer
--------------------------------------------
For a query q with filter f, ``E`` is the exact top k under f and ``S`` the served answer under f.

* recall(q) = |S ∩ E| / |E| (queries whose scope holds no row, |E| = 0, are left out);
* ε-recall(q) = |{s ∈ S : d(s) ≤ d_k(E) + ε·|d_k(E)|}| / |E|, capped at 1, with d(s) the *true*
  distance of s (ties at the k-th distance count as found, so near-ties do not read as misses);
* distance ratio(q) = d(S_k) / d_k(E), when S has as many rows as E and d_k(E) > 0 (1 = as good);
* under-return(q) = 1 when |S| < min(k, |E|): the engine had the rows and returned fewer.

The overall estimate is the mean over the cycle's *uniform* sample of the recent queries, with the
percentile bootstrap of :func:`monitor.retrieval.stats.bootstrap_ci`; small scopes get extra draws
(within each scope the draw is uniform too) that count for the per-scope numbers only.

Census
------
The stale share is a binomial proportion over the sampled ids (Wilson interval); the generations
are the modes of the stored-to-latest cosines of the stale ids.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from monitor.retrieval.stats import bootstrap_ci

ALL = "all"
OTHER = "other"
NONE = "none"  # the scope label of queries without a value for the scope field
_RESERVED = re.compile(r"(all|other|none)_*")


def scope_label(value: object) -> str:
    """A scope value as its label: the reserved ``all``, ``other`` and ``none`` (and those
    followed by underscores) get one more underscore, so no scope collides with the overall row,
    the pooled row or the no-scope queries, and distinct values keep distinct labels.

    >>> scope_label("acme"), scope_label("all"), scope_label("all_"), scope_label(5)
    ('acme', 'all_', 'all__', '5')
    """
    text = str(value)
    return text + "_" if _RESERVED.fullmatch(text) else text


@dataclass(frozen=True, slots=True)
class QueryOutcome:
    """One probed query: the per-query values and where it was drawn."""

    scope: str
    recall: float
    epsilon_recall: float
    distance_ratio: float  # NaN when undefined
    under_return: bool
    uniform: bool  # drawn in the uniform sample (counts for the overall estimate)
    filtered: bool = False
    unfiltered_recall: float = math.nan  # the same query's served recall without its filter
    quantized_recall: float = math.nan  # the exact quantized answer's recall


def outcome(
    served: Sequence[str],
    served_distances: np.ndarray,
    exact: Sequence[str],
    exact_distances: np.ndarray,
    k: int,
    epsilon: float,
    *,
    scope: str = NONE,
    uniform: bool = True,
) -> QueryOutcome | None:
    """The per-query values of one served answer against the exact one (None when |E| = 0).

    ``served_distances`` are the true (full-precision) distances of the served ids.

    >>> o = outcome(["a", "c"], np.array([0.1, 0.2]), ["a", "b"], np.array([0.1, 0.2]), 2, 0.01)
    >>> o.recall, o.epsilon_recall, o.distance_ratio, o.under_return
    (0.5, 1.0, 1.0, False)
    """
    n_exact = min(len(exact), k)
    if n_exact == 0:
        return None
    exact_set = set(exact[:n_exact])
    found = sum(1 for ident in served[:k] if ident in exact_set)
    kth = float(exact_distances[n_exact - 1])
    threshold = kth + epsilon * abs(kth) + 1e-9
    served_d = np.asarray(served_distances, dtype=np.float64)[: min(len(served), k)]
    close = int(np.count_nonzero(served_d <= threshold))
    ratio = math.nan
    if len(served_d) >= n_exact and kth > 0:
        ratio = float(np.sort(served_d)[n_exact - 1] / kth)
    return QueryOutcome(
        scope=scope,
        recall=found / n_exact,
        epsilon_recall=min(1.0, close / n_exact),
        distance_ratio=ratio,
        under_return=len(served) < n_exact,
        uniform=uniform,
    )


@dataclass(frozen=True, slots=True)
class Interval:
    mean: float
    lower: float
    upper: float


@dataclass(frozen=True)
class ScopeRow:
    """What one exported scope shows (``all``, a named scope, or ``other``)."""

    scope: str
    queries: int
    recall: Interval
    epsilon_recall: float
    under_return: float
    p5: float
    p10: float
    distance_ratio: float


@dataclass(frozen=True)
class RecallSummary:
    rows: tuple[ScopeRow, ...] = ()
    scopes_hidden: int = 0  # scopes seen in the cycle, neither named nor in ``other``'s... folded count
    flagged: tuple[str, ...] = ()  # named scopes significantly worse than the rest (upper bound below)
    loss: Mapping[str, float] = field(default_factory=dict)  # part -> recall lost (filter, quantization, graph)
    spent: Mapping[str, int] = field(default_factory=dict)  # named scope (and other) -> exact queries this cycle

    def row(self, scope: str = ALL) -> ScopeRow | None:
        for r in self.rows:
            if r.scope == scope:
                return r
        return None


def row_of(scope: str, items: Sequence[QueryOutcome], resamples: int, confidence: float, seed: int) -> ScopeRow:
    recall = np.array([o.recall for o in items], dtype=np.float64)
    ci = bootstrap_ci({"recall": recall}, resamples=resamples, confidence=confidence, seed=seed)["recall"]
    ratios = np.array([o.distance_ratio for o in items], dtype=np.float64)
    ratios = ratios[np.isfinite(ratios)]
    return ScopeRow(
        scope=scope,
        queries=len(items),
        recall=Interval(ci.mean, ci.lower, ci.upper),
        epsilon_recall=float(np.mean([o.epsilon_recall for o in items])),
        under_return=float(np.mean([o.under_return for o in items])),
        p5=float(np.quantile(recall, 0.05, method="inverted_cdf")),
        p10=float(np.quantile(recall, 0.10, method="inverted_cdf")),
        distance_ratio=float(ratios.mean()) if ratios.size else math.nan,
    )


def summarise(
    outcomes: Sequence[QueryOutcome],
    *,
    worst: int,
    min_scope_queries: int = 3,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> RecallSummary:
    """Overall (``all``) from the uniform draws; each scope from all its draws; the ``worst`` scopes
    by the upper bound of their recall interval (the most confidently bad first), the rest pooled
    in ``other``; a scope is flagged when its upper bound is below the overall lower bound, or
    when most of its queries under-return.
    """
    uniform = [o for o in outcomes if o.uniform]
    if not uniform:
        return RecallSummary()
    overall = row_of(ALL, uniform, resamples, confidence, seed)
    rows = [overall]
    by_scope: dict[str, list[QueryOutcome]] = {}
    for o in outcomes:
        if o.scope != NONE:
            by_scope.setdefault(o.scope, []).append(o)
    ranked = []
    for scope, items in by_scope.items():
        if len(items) >= min_scope_queries:
            ranked.append(row_of(scope, items, resamples, confidence, seed))
    ranked.sort(key=lambda r: (r.recall.upper, r.recall.mean, r.scope))
    shown = ranked[:worst]
    flagged = tuple(
        r.scope for r in shown if r.recall.upper < overall.recall.lower - 1e-9 or r.under_return >= 0.5
    )
    rest = [o for o in outcomes if o.scope != NONE and o.scope not in {r.scope for r in shown}]
    if rest:
        rows.append(row_of(OTHER, rest, resamples, confidence, seed))
    rows.extend(shown)
    hidden = len(by_scope) - len(shown)
    return RecallSummary(tuple(rows), hidden, flagged, recall_loss(outcomes))


def recall_loss(outcomes: Sequence[QueryOutcome]) -> dict[str, float]:
    """Recall lost to each part, over the queries where the part could be measured.

    * ``filter``: mean(served recall without the filter − with it) over filtered queries with an
      unfiltered twin, clipped at 0 (what the filter costs the same index);
    * ``quantization``: 1 − mean recall of the exact search in the quantized space (what the best
      index over the quantized vectors would lose);
    * ``graph``: the total loss (1 − mean recall) less the other two, clipped at 0.
    """
    uniform = [o for o in outcomes if o.uniform] or list(outcomes)
    if not uniform:
        return {}
    total = 1.0 - float(np.mean([o.recall for o in uniform]))
    out: dict[str, float] = {"total": total}
    twins = [o for o in uniform if o.filtered and math.isfinite(o.unfiltered_recall)]
    filter_part = 0.0
    if twins:
        filter_part = max(0.0, float(np.mean([o.unfiltered_recall - o.recall for o in twins]))) * (
            len(twins) / len(uniform))
        out["filter"] = filter_part
    quantized = [o.quantized_recall for o in uniform if math.isfinite(o.quantized_recall)]
    quant_part = 0.0
    if quantized:
        quant_part = 1.0 - float(np.mean(quantized))
        out["quantization"] = quant_part
    out["graph"] = max(0.0, total - filter_part - quant_part)
    return out


# ---------------------------------------------------------------------- census
def wilson(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval of a binomial proportion.

    >>> i = wilson(5, 100)
    >>> round(i.mean, 3), round(i.lower, 3), round(i.upper, 3)
    (0.05, 0.022, 0.112)
    >>> wilson(0, 0)
    Interval(mean=nan, lower=0.0, upper=1.0)
    """
    if n <= 0:
        return Interval(math.nan, 0.0, 1.0)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lower = 0.0 if successes == 0 else max(0.0, centre - half)
    upper = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, lower, upper)


def generations(cosines: np.ndarray, tolerance: float, *, max_generations: int = 4, gap: float = 0.05) -> list[float]:
    """Shares of the generations in the sampled index, current first.

    A stored vector whose cosine to the id's latest vector is at least ``1 - tolerance`` is of the
    current generation. The stale ones are split where their sorted cosines jump by more than
    ``gap`` (vectors of one older model or recipe sit together: a re-embedding under the same old
    model reproduces one cosine band); at most ``max_generations`` bands, the smallest gaps merged.

    >>> generations(np.array([1.0] * 8 + [0.1, 0.12]), 1e-3)
    [0.8, 0.2]
    >>> generations(np.array([1.0] * 6 + [0.1, 0.12, 0.6, 0.62]), 1e-3)
    [0.6, 0.2, 0.2]
    """
    c = np.asarray(cosines, dtype=np.float64)
    c = c[np.isfinite(c)]
    if c.size == 0:
        return []
    current = c >= 1.0 - tolerance
    shares = [float(current.mean())]
    stale = np.sort(c[~current])
    if stale.size:
        jumps = np.diff(stale)
        cuts = [i for i in np.argsort(jumps)[::-1][: max_generations - 2] if jumps[i] > gap]
        bounds = [0, *sorted(int(i) + 1 for i in cuts), stale.size]
        bands = [stale[a:b].size / c.size for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        shares.extend(sorted(bands, reverse=True))
    return shares


def k_occurrence_skewness(counts: Mapping[str, int], population: int) -> float:
    """Skewness of the k-occurrence N_k over ``population`` stored rows, the unseen ones at 0.

    With q queries of k neighbours each, N_k sums to q·k; a hub is a row in many lists. A skewness
    far above the ~1 of healthy text embeddings (Radovanović et al., 2010) says some rows are hubs.
    """
    values = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    n = max(int(population), values.size)
    if n < 2 or values.size == 0:
        return math.nan
    zeros = n - values.size
    mean = values.sum() / n
    centred = values - mean
    m2 = (np.sum(centred**2) + zeros * mean**2) / n
    m3 = (np.sum(centred**3) + zeros * (-mean) ** 3) / n
    if m2 <= 0:
        return 0.0
    return float(m3 / m2**1.5)
