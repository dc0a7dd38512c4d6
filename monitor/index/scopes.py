"""Per-scope evidence across cycles, its confidence sequences, and where the exact budget goes.

Three parts (docs/index.md, "Many scopes", states the guarantees):

* :func:`kl_bounds`: the Chernoff (Bernoulli-KL) confidence bounds of the mean of values in
  [0, 1], vectorised, and :func:`log_term`, the union over every read of a scope's evidence that
  turns them into a **confidence sequence**: valid at every cycle at once, whatever the cycles
  decided to draw from what they had seen;
* :class:`ScopeEvidence`: per scope, the sums of what the probe observed (exact outcomes; the fill
  rate of served searches) in time slots covering ``window_seconds``: bounded memory (a fixed
  array of ``max_scopes`` × :data:`SLOTS` × :data:`STATS` numbers), the least recently seen scope
  evicted when a new one arrives at capacity;
* :func:`next_scopes`: the adaptive share of the exact budget, two or three draws at a time, by LUCB for
  the ``m`` worst scopes (Kalyanakrishnan et al., 2012, turned to the bottom m): the member of the
  current worst set whose interval is widest, and the outsider whose lower bound is lowest.

A served answer's **fill rate** is |S| / min(k, rows in the scope); since recall = |S ∩ E| / |E|
with |E| = min(k, rows), a query's recall is at most its fill rate, so the fill rate's upper
bound bounds the scope's recall from above without an exact search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from monitor.index.estimators import (
    ALL,
    NONE,
    OTHER,
    Interval,
    QueryOutcome,
    RecallSummary,
    ScopeRow,
    recall_loss,
    row_of,
)

SLOTS = 16
UNDER_FLOOR = 0.1
# the sums kept per scope and slot
N_EXACT, S_RECALL, S_EPS, N_RATIO, S_RATIO, N_FILL, S_FILL, N_UNDER, S_UNDER = range(9)
STATS = 9


def log_term(ever: np.ndarray | float, alpha: float) -> np.ndarray:
    """log(1/δ) of one side of the bound for a scope that has had ``ever`` observations in all.

    The evidence read at a cycle is a contiguous run [a, b] of the scope's observations (the window
    drops the oldest), b ≤ ``ever``. Spending δ(a, b) = α / (2 b² (b + 1)) on each run and side sums
    to at most α over all runs, so the bounds hold at every read at once (a confidence sequence).
    """
    b = np.maximum(np.asarray(ever, dtype=np.float64), 1.0)
    return np.asarray(np.log(2.0 * b * b * (b + 1.0) / alpha), dtype=np.float64)


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    p = np.clip(p, 0.0, 1.0)
    q = np.clip(q, 1e-12, 1 - 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * np.log(p / q), 0.0)
        b = np.where(p < 1, (1 - p) * np.log((1 - p) / (1 - q)), 0.0)
    return np.asarray(a + b, dtype=np.float64)


def kl_bounds(mean: np.ndarray, n: np.ndarray, log_delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper): the q with n·kl(mean, q) ≤ log(1/δ) on each side (Chernoff for [0, 1] values).

    For independent values in [0, 1] with mean μ, P(μ > upper) ≤ δ and P(μ < lower) ≤ δ (Hoeffding,
    1963: a [0, 1] variable's moment generating function is at most a Bernoulli's of the same mean).
    n = 0 gives [0, 1].

    >>> lo, hi = kl_bounds(np.array([0.05, 0.9]), np.array([40, 40]), np.array([math.log(40), math.log(40)]))
    >>> [round(float(x), 3) for x in lo], [round(float(x), 3) for x in hi]
    ([0.003, 0.726], [0.198, 0.982])
    """
    mean = np.clip(np.asarray(mean, dtype=np.float64), 0.0, 1.0)
    n = np.asarray(n, dtype=np.float64)
    limit = np.where(n > 0, np.asarray(log_delta, dtype=np.float64) / np.maximum(n, 1e-12), np.inf)
    lo_a, lo_b = np.zeros_like(mean), mean.copy()  # lower: kl(mean, q) decreasing in q on [0, mean]
    hi_a, hi_b = mean.copy(), np.ones_like(mean)  # upper: increasing on [mean, 1]
    for _ in range(40):
        mid = (lo_a + lo_b) / 2
        inside = _kl(mean, mid) <= limit
        lo_b = np.where(inside, mid, lo_b)
        lo_a = np.where(inside, lo_a, mid)
        mid = (hi_a + hi_b) / 2
        inside = _kl(mean, mid) <= limit
        hi_a = np.where(inside, mid, hi_a)
        hi_b = np.where(inside, hi_b, mid)
    lower = np.where(n > 0, lo_a, 0.0)
    upper = np.where(n > 0, hi_b, 1.0)
    return lower, upper


@dataclass(frozen=True)
class Bounds:
    """Every tracked scope's evidence over the window and its bounds (arrays aligned with ``scopes``)."""

    scopes: tuple[str, ...]
    n: np.ndarray  # exact outcomes in the window
    recall: np.ndarray  # their mean recall (NaN without any)
    lower: np.ndarray  # recall confidence sequence, lower (0 without exact outcomes)
    upper: np.ndarray  # min(recall's upper, fill rate's upper)
    recall_upper: np.ndarray  # the recall confidence sequence's own upper bound (1 without exact outcomes)
    fill: np.ndarray  # mean fill rate (NaN without any)
    fill_n: np.ndarray
    under: np.ndarray  # mean under-return (NaN without any)
    under_lower: np.ndarray
    under_n: np.ndarray
    epsilon_recall: np.ndarray
    distance_ratio: np.ndarray

    def index(self) -> dict[str, int]:
        return {s: i for i, s in enumerate(self.scopes)}


class ScopeEvidence:
    """What the probe saw of each scope over ``window_seconds``, in fixed memory.

    Time is cut into slots of ``max(interval, window / SLOTS)`` seconds; the slots older than the
    window are zeroed for every scope at once, so reading is a sum over the live slots.

    >>> ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=100)
    >>> for cycle in range(10):  # two draws a cycle
    ...     ev.add_exact("acme", [0.1, 0.0], [0.1, 0.0], [math.nan, math.nan], now=300.0 * cycle)
    >>> b = ev.bounds(now=2700.0, alpha=0.05)
    >>> int(b.n[0]), round(float(b.recall[0]), 2), round(float(b.upper[0]), 2)
    (20, 0.05, 0.57)
    """

    def __init__(self, window_seconds: float, interval_seconds: float, max_scopes: int):
        self.window = float(window_seconds)
        self.width = max(float(interval_seconds), self.window / SLOTS)
        self.max_scopes = int(max_scopes)
        self._row: dict[str, int] = {}
        self._names: list[str | None] = []
        self._data = np.zeros((min(self.max_scopes, 64), SLOTS, STATS), dtype=np.float64)
        self._ever = np.zeros(min(self.max_scopes, 64), dtype=np.float64)
        self._seen = np.full(min(self.max_scopes, 64), -math.inf)
        self._slot_ids = np.full(SLOTS, -1, dtype=np.int64)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, scope: object) -> bool:
        return scope in self._row

    def _advance(self, now: float) -> int:
        """The ring position of ``now``'s slot, zeroing slots that left the window."""
        slot = int(math.floor(now / self.width))
        oldest = int(math.floor((now - self.window) / self.width))
        stale = (self._slot_ids >= 0) & (self._slot_ids <= oldest)
        if stale.any():
            self._data[:, stale, :] = 0.0
            self._slot_ids[stale] = -1
        position = slot % SLOTS
        if self._slot_ids[position] != slot:
            self._data[:, position, :] = 0.0
            self._slot_ids[position] = slot
        return position

    def _scope_row(self, scope: str, now: float) -> int:
        row = self._row.get(scope)
        if row is None:
            if len(self._names) < self.max_scopes:
                row = len(self._names)
                if row >= len(self._ever):
                    grow = min(self.max_scopes, 2 * len(self._ever))
                    self._data = np.concatenate([self._data, np.zeros((grow - len(self._ever), SLOTS, STATS))])
                    self._ever = np.concatenate([self._ever, np.zeros(grow - len(self._ever))])
                    self._seen = np.concatenate([self._seen, np.full(grow - len(self._seen), -math.inf)])
                self._names.append(scope)
            else:  # full: the least recently seen scope makes room
                row = int(np.argmin(self._seen))
                old = self._names[row]
                if old is not None:
                    del self._row[old]
                self._names[row] = scope
                self._data[row] = 0.0
                self._ever[row] = 0.0
                self.evicted += 1
            self._row[scope] = row
        self._seen[row] = now
        return row

    def add_exact(self, scope: str, recall: Sequence[float], epsilon_recall: Sequence[float],
                  distance_ratio: Sequence[float], now: float, under: Sequence[bool] | None = None) -> None:
        """Exact outcomes of ``scope`` (and their under-return when no fill rate measures it)."""
        position = self._advance(now)
        row = self._scope_row(scope, now)
        cell = self._data[row, position]
        cell[N_EXACT] += len(recall)
        cell[S_RECALL] += float(np.sum(recall))
        cell[S_EPS] += float(np.sum(epsilon_recall))
        ratios = np.asarray(distance_ratio, dtype=np.float64)
        ratios = ratios[np.isfinite(ratios)]
        cell[N_RATIO] += ratios.size
        cell[S_RATIO] += float(ratios.sum())
        if under is not None:
            cell[N_UNDER] += len(under)
            cell[S_UNDER] += float(np.sum(under))
        self._ever[row] += len(recall)

    def add_fill(self, scope: str, fill: float, under: bool, now: float) -> None:
        """One served answer's fill rate (against a known row count) and whether it under-returned."""
        position = self._advance(now)
        row = self._scope_row(scope, now)
        cell = self._data[row, position]
        cell[N_FILL] += 1
        cell[S_FILL] += min(1.0, max(0.0, fill))
        cell[N_UNDER] += 1
        cell[S_UNDER] += bool(under)

    def last_seen(self) -> dict[str, float]:
        """When each tracked scope last had evidence or was screened."""
        return {name: float(self._seen[row]) for name, row in self._row.items()}

    def touch(self, scope: str, now: float) -> None:
        """Keep ``scope`` tracked (it is active) without evidence."""
        self._advance(now)
        self._scope_row(scope, now)

    def bounds(self, now: float, alpha: float, scopes: Sequence[str] | None = None,
               family: int = 1) -> Bounds:
        """The bounds of ``scopes`` (default: every tracked one) at level ``alpha / family`` per scope.

        ``family`` > 1 makes the bounds hold for that many scopes at once (Bonferroni).
        """
        self._advance(now)
        names = list(self._row) if scopes is None else [s for s in scopes if s in self._row]
        rows = np.array([self._row[s] for s in names], dtype=np.int64)
        totals = self._data[rows].sum(axis=1) if len(rows) else np.zeros((0, STATS))
        level = alpha / max(1, family)
        with np.errstate(invalid="ignore", divide="ignore"):
            n = totals[:, N_EXACT]
            recall = np.where(n > 0, totals[:, S_RECALL] / np.maximum(n, 1), math.nan)
            eps = np.where(n > 0, totals[:, S_EPS] / np.maximum(n, 1), math.nan)
            ratio = np.where(totals[:, N_RATIO] > 0, totals[:, S_RATIO] / np.maximum(totals[:, N_RATIO], 1), math.nan)
            fill_n = totals[:, N_FILL]
            fill = np.where(fill_n > 0, totals[:, S_FILL] / np.maximum(fill_n, 1), math.nan)
            under_n = totals[:, N_UNDER]
            under = np.where(under_n > 0, totals[:, S_UNDER] / np.maximum(under_n, 1), math.nan)
        ever = self._ever[rows] if len(rows) else np.zeros(0)
        lower, upper = kl_bounds(np.nan_to_num(recall), n, log_term(ever, level))
        _, fill_upper = kl_bounds(np.nan_to_num(fill), fill_n, log_term(fill_n, level))
        under_lower, _ = kl_bounds(np.nan_to_num(under), under_n, log_term(under_n, level))
        return Bounds(
            scopes=tuple(names), n=n, recall=recall, lower=lower, upper=np.minimum(upper, fill_upper),
            recall_upper=upper,
            fill=fill, fill_n=fill_n, under=under, under_lower=under_lower, under_n=under_n,
            epsilon_recall=eps, distance_ratio=ratio,
        )


def next_scopes(bounds: Bounds, available: np.ndarray, traffic: np.ndarray, m: int) -> list[int]:
    """The scopes (indices into ``bounds``) the next adaptive exact searches go to: LUCB's pair.

    The current worst set J is the ``m`` available scopes of lowest point estimate (the recall mean,
    else the fill rate, an upper bound of it, else 1); h is the member of J whose recall interval
    (from exact outcomes alone) is widest, l the outsider with the lowest lower bound (ties: the
    lower point estimate, then more traffic). Both are drawn, h first: the pair whose overlap keeps
    the worst set uncertain, and the named scopes' recall estimated, not only bounded by their fill
    rate. Third, the lowest estimate (once it has an exact outcome, while its interval is more than
    half as wide as h's), which near-tied decoys at the worst set's edge would otherwise starve.
    ``traffic`` is each scope's query count. Empty when nothing is available.
    """
    idx = np.flatnonzero(available)
    if idx.size == 0:
        return []
    point = np.where(np.isfinite(bounds.recall), bounds.recall,
                     np.where(np.isfinite(bounds.fill), bounds.fill, 1.0))[idx]
    width = (bounds.recall_upper - bounds.lower)[idx]
    busy = traffic[idx]
    order = np.lexsort((-busy, point))
    worst, rest = order[:m], order[m:]
    h = worst[np.lexsort((-busy[worst], point[worst], -width[worst]))[0]]
    # the lowest estimate too, once it has an exact outcome, while its interval is more than half as
    # wide as h's: among many near-tied scopes at the worst set's edge (a tenant's decoys) LUCB's
    # pair never settles on them, and this draw is what lets a scope far below them be flagged
    low = worst[0]
    extra = [int(idx[low])] if low != h and bounds.n[idx[low]] > 0 and 2 * width[low] > width[h] else []
    if rest.size == 0:
        return [int(idx[h]), *extra]
    l_ = rest[np.lexsort((-busy[rest], point[rest], bounds.lower[idx][rest]))[0]]
    return [int(idx[h]), int(idx[l_]), *extra]


def screen_plan(by_scope: dict[str, list[int]], uniform: Sequence[int], size: int, per_scope: int,
                last_seen: dict[str, float], n: int, rng: np.random.Generator) -> list[int]:
    """The pool indices a cycle screens with served searches, ``size`` at most, without repeats.

    The uniform draw first (its served answers are reused); then up to ``per_scope`` queries of each
    scope, least recently seen scopes first (then the busiest), within half of ``size``, so every
    active scope is screened within a few cycles whatever their number; then uniform draws of the
    pool (traffic-weighted) up to ``size``.
    """
    chosen: list[int] = list(dict.fromkeys(int(i) for i in uniform))[:size]
    taken = set(chosen)
    coverage_end = max(len(chosen), size // 2 + len(chosen) // 2)
    order = sorted(by_scope, key=lambda s: (last_seen.get(s, -math.inf), -len(by_scope[s]), s))
    for scope in order:
        if len(chosen) >= coverage_end:
            break
        members = by_scope[scope]
        have = sum(1 for i in members if i in taken)
        want = min(per_scope - have, coverage_end - len(chosen))
        if want <= 0:
            continue
        free = [i for i in members if i not in taken]
        for j in rng.permutation(len(free))[:want].tolist():
            chosen.append(free[j])
            taken.add(free[j])
    left = min(size, n) - len(chosen)
    if left > 0:
        for i in rng.permutation(n).tolist():
            if left <= 0:
                break
            if i not in taken:
                chosen.append(i)
                taken.add(i)
                left -= 1
    return chosen


def scope_summary(outcomes: Sequence[QueryOutcome], evidence: ScopeEvidence, now: float, active: Sequence[str],
                  *, worst: int, margin: float, confidence: float = 0.95,
                  spent: dict[str, int] | None = None, seed: int = 0) -> RecallSummary:
    """The cycle's summary: ``all`` from its uniform draws (bootstrap), the scopes from the evidence.

    Every scope with evidence in the window or queries in the cycle's pool is a candidate. A
    scope is **flagged** when, with the bounds made simultaneous over the candidates
    (Bonferroni), its recall's upper bound is ``margin`` below the overall lower bound, or its
    under-return's lower bound is above one half, or at least half of its served answers
    under-returned and its under-return's own lower bound is above ``UNDER_FLOOR`` (a defect of
    the engine, not noise: a healthy engine returns min(k, rows) rows). The ``worst`` named are the
    flagged ones (lowest point estimate first), then the lowest upper bounds (the most confidently
    bad first); ``other`` pools the uniform draws of the rest (an unbiased estimate of their
    traffic's recall); the rest are counted as hidden.
    """
    uniform = [o for o in outcomes if o.uniform]
    if not uniform:
        return RecallSummary()
    overall = row_of(ALL, uniform, 1000, confidence, seed)
    alpha = 1.0 - confidence
    b = evidence.bounds(now, alpha)
    has = (b.n > 0) | (b.fill_n > 0) | (b.under_n > 0)
    candidates = sorted(set(np.asarray(b.scopes, dtype=object)[has].tolist()) | set(active))
    index = b.index()
    rows_of = [index[s] for s in candidates if s in index and has[index[s]]]
    family = evidence.bounds(now, alpha, [b.scopes[i] for i in rows_of], family=max(1, len(candidates)))
    flagged_set = {
        scope for scope, upper, under_lower in zip(family.scopes, family.upper, family.under_lower, strict=True)
        if upper < overall.recall.lower - margin - 1e-9 or under_lower > 0.5
    }
    # most of its served answers under-returned, and certainly more than UNDER_FLOOR of them: the
    # engine had the rows and did not serve them
    flagged_set |= {b.scopes[i] for i in rows_of if b.under[i] >= 0.5 and b.under_lower[i] > UNDER_FLOOR}
    point = np.where(np.isfinite(b.recall), b.recall, np.where(np.isfinite(b.fill), b.fill, 1.0))

    def rank(i: int) -> tuple[bool, float, float, str]:
        if b.scopes[i] in flagged_set:  # the flagged first, the worst-looking first among them
            return (False, float(point[i]), float(b.upper[i]), b.scopes[i])
        return (True, float(b.upper[i]), float(point[i]), b.scopes[i])

    ranked = sorted(rows_of, key=rank)
    shown = [b.scopes[i] for i in ranked[:worst]]
    by_scope: dict[str, list[float]] = {}
    for o in outcomes:
        by_scope.setdefault(o.scope, []).append(o.recall)
    rows = [overall]
    rest = [o for o in uniform if o.scope != NONE and o.scope not in set(shown)]
    if rest:
        rows.append(row_of(OTHER, rest, 1000, confidence, seed))
    for i in ranked[:worst]:
        scope = b.scopes[i]
        seen = np.asarray(by_scope.get(scope, []), dtype=np.float64)
        rows.append(ScopeRow(
            scope=scope, queries=int(b.n[i]), recall=Interval(float(b.recall[i]), float(b.lower[i]), float(b.upper[i])),
            epsilon_recall=float(b.epsilon_recall[i]), under_return=float(b.under[i]),
            p5=float(np.quantile(seen, 0.05, method="inverted_cdf")) if seen.size else math.nan,
            p10=float(np.quantile(seen, 0.10, method="inverted_cdf")) if seen.size else math.nan,
            distance_ratio=float(b.distance_ratio[i]),
        ))
    spent = spent or {}
    shown_spent = {s: spent.get(s, 0) for s in shown}
    shown_spent[OTHER] = sum(n for s, n in spent.items() if s not in shown_spent)
    flagged = tuple(s for s in shown if s in flagged_set)
    return RecallSummary(tuple(rows), len(candidates) - len(shown), flagged, recall_loss(outcomes), shown_spent)
