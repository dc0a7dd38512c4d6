"""One index probe: a cycle of production-vs-exact searches on a budget, and the census.

A cycle (:meth:`IndexProbe.run`):

1. draws its queries (:func:`monitor.index.sampling.draw`) from the recent interaction queries of
   the probe's model and from the golden file, as many as the budget of exact searches allows;
2. per query: the served search and the exact one with the query's filter; the true distances of
   served ids the exact answer lacks (one fetch); with ``attribution``, the unfiltered twins of a
   filtered query and the exact search in the quantized space where the engine has one;
3. summarises per scope (:func:`monitor.index.estimators.summarise`);
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
    Interval,
    QueryOutcome,
    RecallSummary,
    generations,
    k_occurrence_skewness,
    outcome,
    summarise,
    wilson,
)
from monitor.index.sampling import IdSketch, ProbeQuery, draw, id_hash, read_golden
from monitor.index.settings import IndexProbeSpec
from monitor.retrieval.probes.base import EventBuffer

logger = logging.getLogger(__name__)

DUPLICATE_DISTANCE = 1e-6


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

    def _probe_query(self, query: ProbeQuery, uniform: bool, ledger: _Ledger) -> QueryOutcome | None:
        served = self._search(ledger, query, "served")
        exact = self._search(ledger, query, "exact")
        result = self._recall_of(ledger, query, served, exact, uniform)
        if result is None or not self.spec.attribution:
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
