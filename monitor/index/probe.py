"""One index probe: a cycle of production-vs-exact searches on a budget, and the census.

A cycle (:meth:`IndexProbe.run`):

1. draws its queries from the recent interaction queries of the probe's model and from the golden
   file: without a scope field a uniform draw (:func:`monitor.index.sampling.draw`), as many as the
   budget of exact searches allows; with one, a screen of served searches (fill rates), a uniform
   share and an adaptive share of the exact budget (:mod:`monitor.index.scopes`);
2. per query: the served search and the exact one with the query's filter; the true distances of
   served ids the exact answer lacks (one fetch); with ``attribution``, the unfiltered twins of a
   filtered query and the exact search in the quantized space where the engine has one;
3. summarises: per scope from the evidence of the window (:func:`monitor.index.scopes.scope_summary`),
   or the cycle alone without scopes (:func:`monitor.index.estimators.summarise`);
4. the census: the stored vectors of the ids the stream sketch holds, against their latest
   stream vector (or a re-embedding of the stored text); random stored rows for degenerate rows
   and orphans; exact ``k + 1`` searches from a few of them for duplicates and hubs.

A query the engine cannot take (a wrong dimension; a filter value its column cannot hold,
``bad_filter``) is skipped and counted; any other engine error ends the cycle (the component
counts it and backs off). New work stops at the deadline; the queries done by then are
summarised (a partial cycle says so). Engine calls still running at the cutoff (the job's own
deadline) are given up (``timeout``). A census that fails drops the census only: the cycle's
recall is published, the census error counted by reason (a cycle with no recall fails).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.index.connectors.base import QUERY_REASONS, Answer, Connector, ConnectorError
from monitor.index.estimators import (
    NONE,
    Interval,
    QueryOutcome,
    RecallSummary,
    generations,
    k_occurrence_skewness,
    outcome,
    scope_label,
    summarise,
    wilson,
)
from monitor.index.sampling import IdSketch, ProbeQuery, draw, id_hash, read_golden
from monitor.index.scopes import ScopeEvidence, next_scopes, scope_summary, screen_plan
from monitor.index.settings import IndexProbeSpec
from monitor.retrieval.probes.base import EventBuffer

logger = logging.getLogger(__name__)

DUPLICATE_DISTANCE = 1e-6
CONFIDENCE = 0.95


@dataclass(frozen=True)
class CensusResult:
    sampled: int = 0  # ids of the sketch found in the index and compared
    stale: Interval = field(default_factory=lambda: Interval(math.nan, 0.0, 1.0))
    generation_shares: tuple[float, ...] = ()
    missing: int = 0  # sketch ids (seen before the grace period) absent from the index
    checked_for_missing: int = 0
    orphans: int = 0  # random index ids in the sketch's hash range never seen in the stream
    checked_for_orphans: int = 0
    degenerate: dict[str, float] = field(default_factory=dict)  # kind -> share of checked rows
    hubness: float = math.nan
    hub_occurrence: float = math.nan  # the most frequent neighbour's share of the lists
    rows: int = 0  # the index's rows


@dataclass(frozen=True)
class IndexResult:
    """What one cycle measured (immutable; replaced whole by the next)."""

    model: str
    k: int
    recall: RecallSummary = field(default_factory=RecallSummary)
    census: CensusResult | None = None
    queries: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> queries skipped
    exact_searches: int = 0
    searches: int = 0
    rows_read: int = 0
    cpu_seconds: float = 0.0
    partial: bool = False
    census_error: str | None = None  # the reason a census failed (the recall above still stands)


class IndexProbe:
    """The hooks (ingest thread: O(1) per event, O(rows) hashes per batch) and the cycle."""

    def __init__(self, spec: IndexProbeSpec, connector: Connector, seed: int = 0,
                 encoder: Callable[[list[str]], np.ndarray] | None = None):
        self.spec = spec
        self.name = spec.name
        self.connector = connector
        self.buffer: EventBuffer[ProbeQuery] = EventBuffer(spec.queries.buffer, spec.queries.window_seconds)
        self.golden = read_golden(spec.queries.golden_file) if spec.queries.golden_file is not None else []
        self.sketch = IdSketch(spec.census.tracked_ids)
        self.rng = np.random.default_rng(seed)
        self.encoder = encoder
        self.dim: int | None = None
        self.evidence = ScopeEvidence(spec.queries.window_seconds, spec.interval_seconds, spec.queries.max_scopes)
        self._active: set[str] = set()  # the scopes of the last cycle's queries

    # ------------------------------------------------------------------ hooks
    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        if self.spec.queries.stream and event.model == self.spec.model and event.query_vector is not None:
            self.buffer.add(ProbeQuery(event.query_vector, event.filter), now)

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        census = self.spec.census
        if not census.enabled or batch.model != self.spec.model or batch.ids is None:
            return
        if census.stream is not None and batch.stream != census.stream:
            return
        self.sketch.add(batch.ids, batch.vectors, now)

    # ------------------------------------------------------------------ the cycle
    def run(self, deadline: Deadline, now: float, cutoff: Deadline | None = None) -> IndexResult:
        """One cycle: no new work after ``deadline``; engine calls given up at ``cutoff`` (None: never)."""
        self.connector.deadline = cutoff
        if cutoff is not None:  # a call past the cutoff is cancelled, then cut, within 2 % of the time
            self.connector.grace = min(1.0, max(0.01, 0.02 * cutoff.remaining()))
        self.connector.refresh()
        try:
            return self._run(deadline, now)
        finally:
            self.connector.deadline = None

    def _run(self, deadline: Deadline, now: float) -> IndexResult:
        cpu0 = time.thread_time()
        spec = self.spec
        ledger = _Ledger()
        queries = self.buffer.recent(now) + self.golden
        # exact searches one query costs: its exact answer, and with attribution the quantized exact
        # answer and (for a filtered query) the unfiltered exact twin
        per_query = 1 + (1 if spec.attribution and self.connector.supports_quantized else 0) + (
            1 if spec.attribution and any(q.filter for q in queries) else 0)
        if spec.queries.scope_field is not None:
            outcomes, skipped, partial, spent = self._scoped_cycle(queries, per_query, ledger, deadline, now)
            summary = scope_summary(outcomes, self.evidence, now, sorted(self._active), worst=spec.worst_scopes,
                                    margin=spec.flag_margin, spent=spent)
        else:
            outcomes, skipped, partial = self._uniform_cycle(queries, per_query, ledger, deadline)
            summary = summarise(outcomes, worst=spec.worst_scopes)
        census = census_error = None
        if spec.census.enabled and not deadline.expired():
            try:
                census = self._census(now, ledger, deadline)
            except ConnectorError as exc:
                if not outcomes:
                    raise  # no recall to publish: the engine's failure is the cycle's
                census_error = exc.reason
                logger.debug("index probe %s: census dropped (%s: %s)", self.name, exc.reason, exc)
        return IndexResult(
            model=spec.model, k=spec.k, recall=summary, census=census, queries=len(outcomes),
            skipped=dict(skipped), exact_searches=ledger.exact, searches=ledger.searches,
            rows_read=ledger.rows, cpu_seconds=time.thread_time() - cpu0, partial=partial,
            census_error=census_error,
        )

    def _uniform_cycle(self, queries: list[ProbeQuery], per_query: int, ledger: _Ledger,
                       deadline: Deadline) -> tuple[list[QueryOutcome], Counter[str], bool]:
        """Without scopes: a uniform draw of the queries, each served and searched exactly."""
        spec = self.spec
        picked = draw(queries, max(1, spec.budget.exact_searches // per_query),
                      spec.queries.scope_field, spec.queries.min_per_scope, self.rng)
        outcomes: list[QueryOutcome] = []
        skipped: Counter[str] = Counter()
        allowed: frozenset[str] = getattr(self.connector, "filter_columns", frozenset())
        partial = False
        for query, uniform in picked:
            if deadline.expired():
                partial = True
                break
            if ledger.exact >= spec.budget.exact_searches:
                break
            if any(key not in allowed for key, _ in query.filter):
                skipped["unsupported_filter"] += 1
                continue
            try:
                query = ProbeQuery(query.vector, self.connector.admit(query.filter))
                result = self._probe_query(query, uniform, ledger)
            except ConnectorError as exc:
                if exc.reason not in QUERY_REASONS:
                    raise
                skipped[exc.reason] += 1
                continue
            if result is None:
                skipped["empty_scope"] += 1
            else:
                outcomes.append(result)
        return outcomes, skipped, partial

    def _scope_counts(self) -> dict[str, int] | None:
        """Rows per scope value (the fill rate's denominator), read once a cycle; None when the engine cannot count
        or answers what cannot be read."""
        field_name = self.spec.queries.scope_field
        counter = getattr(self.connector, "scope_counts", None)
        if field_name is None or counter is None:
            return None
        try:
            return {scope_label(value): rows for value, rows in counter(field_name).items()}
        except ConnectorError as exc:
            # an answer it cannot read (a tenant that wrote more than MAX_SCOPE_VALUES values, an
            # oversized body) costs the fill rates only, never the cycle's recall
            if exc.reason not in ("unsupported", "bad_result", "oversized"):
                raise
            logger.debug("index probe %s: screening without fill rates (%s: %s)", self.name, exc.reason, exc)
            return None

    def _scoped_cycle(self, queries: list[ProbeQuery], per_query: int, ledger: _Ledger, deadline: Deadline,
                      now: float) -> tuple[list[QueryOutcome], Counter[str], bool, dict[str, int]]:
        """With scopes: screen by fill rate, a uniform exact share, then the adaptive share (docs/index.md)."""
        spec = self.spec
        field_name = spec.queries.scope_field
        allowed: frozenset[str] = getattr(self.connector, "filter_columns", frozenset())
        skipped: Counter[str] = Counter()
        outcomes: list[QueryOutcome] = []
        spent: Counter[str] = Counter()
        counts = self._scope_counts() if queries else None
        if counts is not None:  # a scope the engine holds no row of has no recall: no search is spent on it
            kept = [q for q in queries if not self._counted_empty(q, counts, allowed)]
            if len(kept) < len(queries):
                skipped["empty_scope"] += len(queries) - len(kept)
            queries = kept
        scopes = [q.scope(field_name) for q in queries]
        by_scope: dict[str, list[int]] = {}
        for i, scope in enumerate(scopes):
            if scope != NONE:
                by_scope.setdefault(scope, []).append(i)
        self._active = set(by_scope)
        n = len(queries)
        if n == 0:
            return outcomes, skipped, False, {}
        budget = spec.budget.exact_searches
        uniform_queries = max(1, int(budget * spec.budget.uniform_share) // per_query)
        uniform = self.rng.choice(n, size=min(n, uniform_queries), replace=False).tolist()
        last_seen = self.evidence.last_seen()
        plan = screen_plan(by_scope, uniform, max(spec.budget.screen, len(uniform)), spec.queries.min_per_scope,
                           last_seen, n, self.rng)
        served: dict[int, Answer] = {}
        usable = [all(key in allowed for key, _ in q.filter) for q in queries]
        admitted: set[int] = set()

        def admit(i: int) -> bool:
            """The query's filter as the engine binds it; a query the engine cannot take is skipped."""
            if i in admitted:
                return usable[i]
            admitted.add(i)
            if not usable[i]:
                skipped["unsupported_filter"] += 1
                return False
            try:
                queries[i] = ProbeQuery(queries[i].vector, self.connector.admit(queries[i].filter))
            except ConnectorError as exc:
                if exc.reason not in QUERY_REASONS:
                    raise
                skipped[exc.reason] += 1
                usable[i] = False
            return usable[i]

        screened: list[tuple[str, int]] = []  # (scope, rows served) of the screen's answers
        expired = False
        for i in plan:
            if deadline.expired():
                expired = True
                break
            if not admit(i):
                continue
            try:
                answer = self._search(ledger, queries[i], "served")
            except ConnectorError as exc:
                if exc.reason not in QUERY_REASONS:
                    raise
                skipped[exc.reason] += 1
                usable[i] = False
                continue
            served[i] = answer
            if scopes[i] != NONE:
                self.evidence.touch(scopes[i], now)
                screened.append((scopes[i], len(answer)))
        self._add_fills(screened, counts, None if expired else deadline, now)
        if expired:
            return outcomes, skipped, True, dict(spent)
        done: set[int] = set()

        def probe(i: int, is_uniform: bool) -> QueryOutcome | None:
            done.add(i)
            if not admit(i):
                return None
            try:
                result = self._probe_query(queries[i], is_uniform, ledger, served.get(i))
            except ConnectorError as exc:
                if exc.reason not in QUERY_REASONS:
                    raise
                skipped[exc.reason] += 1
                return None
            if result is None:
                skipped["empty_scope"] += 1
                return None
            outcomes.append(result)
            if result.scope != NONE:
                spent[result.scope] += 1
                self.evidence.add_exact(result.scope, [result.recall], [result.epsilon_recall],
                                        [result.distance_ratio], now,
                                        under=[result.under_return] if counts is None else None)
            return result

        for i in uniform:
            if deadline.expired():
                return outcomes, skipped, True, dict(spent)
            if ledger.exact >= budget:
                break
            probe(i, True)
        names = sorted(by_scope)
        traffic = np.array([len(by_scope[s]) for s in names], dtype=np.float64)
        left = {s: [i for i in by_scope[s] if i not in done and usable[i]] for s in names}
        for members in left.values():  # screened queries first: their served answer is known
            members.sort(key=lambda i: (i not in served, int(self.rng.integers(1 << 30))))
        while ledger.exact < budget:
            if deadline.expired():
                return outcomes, skipped, True, dict(spent)
            bounds = self.evidence.bounds(now, 1.0 - CONFIDENCE, names)
            position = {s: j for j, s in enumerate(bounds.scopes)}
            available = np.zeros(len(bounds.scopes), dtype=bool)
            weights = np.zeros(len(bounds.scopes))
            for j, s in enumerate(names):
                if s in position:
                    available[position[s]] = bool(left[s])
                    weights[position[s]] = traffic[j]
            choices = next_scopes(bounds, available, weights, spec.worst_scopes)
            if not choices:
                break
            for choice in choices:
                scope = bounds.scopes[choice]
                if ledger.exact >= budget or not left[scope]:
                    continue
                i = left[scope].pop(0)
                if probe(i, False) is None and not self.evidence.bounds(now, 1.0 - CONFIDENCE, [scope]).n.any():
                    left[scope] = []  # an empty scope: nothing to learn this cycle
        return outcomes, skipped, False, dict(spent)

    def _counted_empty(self, query: ProbeQuery, counts: dict[str, int], allowed: frozenset[str]) -> bool:
        """Whether ``query``'s scope holds no row by the engine's count: a text or integer value (the
        engine writes those as the label does) of a filter the engine takes (a query it cannot take
        is counted as such where it is drawn)."""
        field_name = self.spec.queries.scope_field
        value = next((v for key, v in query.filter if key == field_name), None)
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            return False
        if counts.get(query.scope(field_name), 0) or any(key not in allowed for key, _ in query.filter):
            return False
        try:
            self.connector.admit(query.filter)
        except ConnectorError as exc:
            if exc.reason not in QUERY_REASONS:
                raise
            return False
        return True

    def _add_fills(self, screened: list[tuple[str, int]], counts: dict[str, int] | None, deadline: Deadline | None,
                   now: float) -> None:
        """The screen's fill rates against the rows counted before it, and after it where an answer
        under-returned: rows deleted between the count and the search (a tenant emptying its scope)
        are not an engine that under-returns, so a scope's denominator is the smaller count (an
        under-return left unconfirmed, past the deadline or without a second count, is dropped)."""
        if counts is None:
            return
        k = self.spec.k
        after: dict[str, int] | None = None
        if any(served < min(k, counts.get(scope, 0)) for scope, served in screened):
            after = self._scope_counts() if deadline is not None and not deadline.expired() else None
        for scope, served in screened:
            rows = counts.get(scope, 0)
            expected = min(k, rows)
            if served < expected:
                if after is None:
                    continue
                expected = min(expected, after.get(scope, 0))
            if expected:  # a scope holding no row has no fill rate
                self.evidence.add_fill(scope, served / expected, served < expected, now)

    def _search(self, ledger: _Ledger, query: ProbeQuery, mode: Any, filtered: bool = True,
                k: int | None = None) -> Answer:
        answer = self.connector.search(query.vector, k or self.spec.k, query.filter if filtered else (), mode)
        ledger.searches += 1
        ledger.exact += mode != "served"
        ledger.rows += len(answer)
        return answer

    def _true_distances(self, ledger: _Ledger, query: ProbeQuery, served: Answer, exact: Answer) -> np.ndarray:
        """The served ids' full-precision distances: the exact answer's where it has them, else fetched."""
        known = dict(zip(exact.ids, exact.distances.tolist(), strict=True))
        unknown = [i for i in served.ids if i not in known]
        if unknown:
            stored = self.connector.fetch(unknown)
            ledger.rows += len(stored)
            if stored:
                ids = list(stored)
                d = self.connector.distance(query.vector, np.stack([stored[i] for i in ids]))
                known.update(zip(ids, d.tolist(), strict=True))
        # an id the engine served but cannot fetch back (deleted between the calls) is a miss
        return np.array([known.get(i, math.inf) for i in served.ids], dtype=np.float64)

    def _recall_of(self, ledger: _Ledger, query: ProbeQuery, served: Answer, exact: Answer,
                   uniform: bool) -> QueryOutcome | None:
        scope = query.scope(self.spec.queries.scope_field)
        return outcome(served.ids, self._true_distances(ledger, query, served, exact), exact.ids, exact.distances,
                       self.spec.k, self.spec.epsilon, scope=scope, uniform=uniform)

    def _probe_query(self, query: ProbeQuery, uniform: bool, ledger: _Ledger,
                     served: Answer | None = None) -> QueryOutcome | None:
        """One query's outcome; the attribution searches for uniform draws only (the loss is over them)."""
        served = served if served is not None else self._search(ledger, query, "served")
        exact = self._search(ledger, query, "exact")
        result = self._recall_of(ledger, query, served, exact, uniform)
        if result is None or not self.spec.attribution or not uniform:
            return result
        extra: dict[str, Any] = {}
        budget = self.spec.budget.exact_searches
        if query.filter and ledger.exact < budget:
            twin_served = self._search(ledger, query, "served", filtered=False)
            twin_exact = self._search(ledger, query, "exact", filtered=False)
            twin = outcome(twin_served.ids, self._true_distances(ledger, query, twin_served, twin_exact),
                           twin_exact.ids, twin_exact.distances, self.spec.k, self.spec.epsilon)
            if twin is not None:
                extra.update(filtered=True, unfiltered_recall=twin.recall)
        if self.connector.supports_quantized and ledger.exact < budget:
            quantized = self._search(ledger, query, "exact_quantized")
            n = min(len(exact), self.spec.k)
            extra["quantized_recall"] = len(set(quantized.ids) & set(exact.ids[:n])) / n
        if not extra:
            return result
        from dataclasses import replace

        return replace(result, **extra)

    # ------------------------------------------------------------------ census
    def _census(self, now: float, ledger: _Ledger, deadline: Deadline) -> CensusResult:
        spec = self.spec.census
        tracked = self.sketch.items()
        limit = self.spec.budget.census_rows
        if len(tracked) > limit:
            order = self.rng.choice(len(tracked), size=limit, replace=False)
            tracked = [tracked[int(i)] for i in order]
        rows = self.connector.count()
        stored = self.connector.fetch([ident for ident, _, _ in tracked]) if tracked else {}
        ledger.rows += len(stored)
        latest = {ident: vector for ident, vector, _ in tracked}
        if self.encoder is not None and stored:
            texts = self.connector.texts(list(stored))
            if texts:
                ids = list(texts)
                encoded = self.encoder([texts[i] for i in ids])
                latest = {i: np.asarray(v, dtype=np.float32) for i, v in zip(ids, encoded, strict=True)}
        cosines = []
        for ident, vector in stored.items():
            current = latest.get(ident)
            if current is None or current.shape != vector.shape:
                continue
            denominator = float(np.linalg.norm(vector) * np.linalg.norm(current))
            cosines.append(float(vector @ current) / denominator if denominator > 0 else math.nan)
        # a stored zero or NaN row has no cosine: it is not the current vector, so it counts as stale
        c = np.nan_to_num(np.asarray(cosines, dtype=np.float64), nan=-1.0, posinf=-1.0, neginf=-1.0)
        stale = int(np.count_nonzero(c < 1.0 - spec.tolerance))
        due = [ident for ident, _, seen in tracked if seen <= now - spec.grace_seconds]
        missing = sum(1 for ident in due if ident not in stored)
        degenerate: dict[str, float] = {}
        orphans = checked_orphans = 0
        hubness = hub_share = math.nan
        if not deadline.expired() and (spec.degenerate_rows or spec.hub_queries):
            sample = self.connector.sample(max(spec.degenerate_rows, spec.hub_queries))
            ledger.rows += len(sample)
            if sample:
                matrix = np.stack([v for _, v in sample])
                finite = np.isfinite(matrix).all(axis=1)
                degenerate["nan"] = float(np.mean(~finite))
                degenerate["zero"] = float(np.mean(finite & ~np.any(matrix != 0, axis=1)))
                threshold = self.sketch.threshold
                in_range = [ident for ident, _ in sample if id_hash(ident) <= threshold]
                checked_orphans = len(in_range) if len(self.sketch) else 0
                orphans = sum(1 for ident in in_range if ident not in self.sketch) if checked_orphans else 0
                duplicate, hubness, hub_share = self._hubs(sample, rows, ledger, deadline)
                if duplicate is not None:
                    degenerate["duplicate"] = duplicate
        return CensusResult(
            sampled=int(c.size), stale=wilson(stale, int(c.size)),
            generation_shares=tuple(generations(c, spec.tolerance)), missing=missing, checked_for_missing=len(due),
            orphans=orphans, checked_for_orphans=checked_orphans, degenerate=degenerate, hubness=hubness,
            hub_occurrence=hub_share, rows=rows,
        )

    def _hubs(self, sample: list[tuple[str, np.ndarray]], rows: int, ledger: _Ledger,
              deadline: Deadline) -> tuple[float | None, float, float]:
        """Exact k + 1 searches from stored rows: the share with an exact duplicate, the k-occurrence skew."""
        k = self.spec.k
        usable = [(i, v) for i, v in sample if np.isfinite(v).all() and v.any()][: self.spec.census.hub_queries]
        counts: Counter[str] = Counter()
        duplicates = searched = 0
        for ident, vector in usable:
            if deadline.expired():
                break
            answer = self.connector.search(vector.astype(np.float32), k + 1, (), "exact")
            ledger.searches += 1
            ledger.exact += 1
            ledger.rows += len(answer)
            searched += 1
            others = [(i, d) for i, d in zip(answer.ids, answer.distances.tolist(), strict=True) if i != ident][:k]
            duplicates += any(abs(d) <= DUPLICATE_DISTANCE for _, d in others)
            counts.update(i for i, _ in others)
        if not searched:
            return None, math.nan, math.nan
        skew = k_occurrence_skewness(counts, rows)
        top = counts.most_common(1)[0][1] / searched if counts else 0.0
        return duplicates / searched, skew, top


@dataclass
class _Ledger:
    searches: int = 0
    exact: int = 0
    rows: int = 0
