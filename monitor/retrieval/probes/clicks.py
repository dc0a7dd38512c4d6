"""Click feedback: online ranking metrics and beyond-accuracy metrics from interaction events.

Every interaction event of the window is an impression: the ``results`` served for a query, and
the feedback on them, ``clicks`` (ids) and/or ``relevance`` (id -> grade). Events that share a
``query_id`` (an impression event, then click events) are merged: the first non-empty results,
the union of the clicks, the highest explicit grade per id. A clicked id is worth
``click_grade`` (default 1) unless ``relevance`` grades it, and any positive grade counts as
relevant for MRR and the click-through rate.

Per query with at least one result (``k`` from the probe's cutoffs):

* ``mrr@k``: 1 / rank of the first clicked (positively graded) result within k, else 0;
* ``ndcg@k``: nDCG with the click-derived grades (trec_eval's definition, linear gain by default);
* click-through rate@k: 1 if any result within k was clicked, else 0, averaged over queries.

Over every query, with or without results: the zero-result ratio. Queries without any click
count (a query nobody clicked is a failed query, not a missing one).

Beyond accuracy (seed 000, section 21.4.2), per model over the window's top-k lists (k = the
largest cutoff), with the universe U = catalog ∪ recommended ∪ clicked ids:

* catalog coverage = |distinct recommended ids ∩ catalog| / |catalog|;
* Gini of the recommendation counts over U, never-recommended items included as zeros;
* popularity bias = mean popularity of the recommendation slots / mean popularity over U, where
  an item's popularity is the number of queries of the window that clicked it.

Fixes to the seed's ``RecommendationMetrics.beyond_accuracy_report``: it uses ``Counter`` without
importing it (the code raises ``NameError``); its Gini is computed over recommended items only,
so a system that recommends 6 items of a 10-item catalog equally scores 0, "perfect equality"
(its example: 0.24; over the catalog: 0.54); its coverage counts recommended ids missing from
the catalog, so it can exceed 1; a Gini of no recommendations divides by zero.

Examples
--------
>>> round(gini([3, 2, 1, 1, 1, 1]), 4)  # the seed's example: recommended items only
0.2407
>>> round(gini([3, 2, 1, 1, 1, 1, 0, 0, 0, 0]), 4)  # with the 4 catalog items never recommended
0.5444
>>> recs = {"item_1": 3, "item_2": 2, "item_3": 1, "item_4": 1, "item_5": 1, "item_6": 1}
>>> popularity = {f"item_{i}": 100 - i * 10 for i in range(1, 11)}
>>> round(popularity_bias(recs, popularity, universe_size=10), 4)  # the seed's 1.60
1.6049
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.probes.base import (
    ALL,
    ConfiguredProbe,
    EventBuffer,
    ProbeResult,
    Sample,
    sample,
    slice_labels,
    summarise,
)
from monitor.retrieval.stats import fold_slices
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.component import MonitorContext
    from monitor.retrieval.settings import ClickProbeSettings, ProbeSettings


# ---------------------------------------------------------------------------- beyond accuracy
def gini(counts: Iterable[float]) -> float:
    """Gini coefficient of non-negative counts: 0 = all equal, (n−1)/n = one item has everything.

    G = (2 Σᵢ i·x₍ᵢ₎ − (n + 1) Σ x) / (n Σ x) over the counts sorted ascending (i = 1..n);
    NaN when the counts sum to 0.
    """
    x = np.sort(np.asarray(list(counts), dtype=np.float64))
    total = x.sum()
    if x.size == 0 or total <= 0:
        return float("nan")
    if (x < 0).any():
        raise ValueError("counts must be non-negative")
    n = x.size
    index = np.arange(1, n + 1)
    return float((2.0 * np.sum(index * x) - (n + 1) * total) / (n * total))


def catalog_coverage(recommended: Iterable[str], catalog: set[str] | None, catalog_size: int) -> float:
    """Distinct recommended ids that are in the catalog, over the catalog size.

    With ``catalog=None`` (only the size is known) every recommended id counts.
    """
    distinct = set(recommended)
    hits = len(distinct) if catalog is None else len(distinct & catalog)
    return min(1.0, hits / catalog_size) if catalog_size > 0 else float("nan")


def popularity_bias(
    recommendation_counts: Mapping[str, int], popularity: Mapping[str, float], universe_size: int
) -> float:
    """Mean popularity of what was recommended (per slot) over the mean popularity of the universe.

    Items absent from ``popularity`` have popularity 0; the universe mean is Σ popularity over
    ``universe_size`` items. 1 = recommendations as popular as the average item; > 1 biased toward
    popular items. NaN without recommendations or without any popular item.
    """
    slots = sum(recommendation_counts.values())
    total_popularity = float(sum(popularity.values()))
    if slots == 0 or total_popularity <= 0 or universe_size <= 0:
        return float("nan")
    recommended = sum(count * popularity.get(item, 0.0) for item, count in recommendation_counts.items()) / slots
    return recommended / (total_popularity / universe_size)


# ---------------------------------------------------------------------------- the probe
@dataclass
class _Query:
    results: tuple[str, ...] = ()
    clicks: dict[str, None] = field(default_factory=dict)  # ordered set
    relevance: dict[str, float] = field(default_factory=dict)
    slice: str | None = None

    def qrels(self, click_grade: float) -> dict[str, float]:
        """Clicked ids at ``click_grade``, overridden by explicit grades."""
        return {**dict.fromkeys(self.clicks, click_grade), **self.relevance}


def merge_events(events: Sequence[InteractionEvent]) -> list[_Query]:
    """One query per query_id (events without a query_id stand alone), in first-seen order.

    The first non-empty ``results`` and the first ``slice`` win; clicks are united; an id graded
    by several events keeps its highest grade.
    """
    merged: dict[object, _Query] = {}
    for n, event in enumerate(events):
        key: object = ("id", event.query_id) if event.query_id is not None else ("n", n)
        query = merged.setdefault(key, _Query())
        if not query.results and event.results:
            query.results = event.results
        if query.slice is None:
            query.slice = event.slice
        query.clicks.update(dict.fromkeys(event.clicks))
        for doc, grade in event.relevance.items():
            query.relevance[doc] = max(grade, query.relevance.get(doc, grade))
    return list(merged.values())


class CatalogIds:
    """Distinct document ids seen on a (model, stream), bounded; the probe's catalog."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.ids: dict[str, set[str]] = defaultdict(set)  # model -> ids
        self.full: set[str] = set()  # models whose set hit the limit
        self._lock = threading.Lock()

    def add(self, model: str, ids: Sequence[str]) -> None:
        with self._lock:
            known = self.ids[model]
            if model in self.full:
                return
            known.update(ids)
            if len(known) >= self.limit:
                self.full.add(model)

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"ids": {model: sorted(ids) for model, ids in self.ids.items()}, "full": sorted(self.full)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self.ids = defaultdict(set, {str(m): {str(i) for i in ids} for m, ids in state["ids"].items()})
            self.full = {str(m) for m in state["full"]}

    def get(self, model: str) -> set[str] | None:
        with self._lock:
            known = self.ids.get(model)
            return None if not known else set(known)


class ClickFeedbackProbe(ConfiguredProbe["ClickProbeSettings"]):
    kind = "clicks"

    def __init__(self, spec: ClickProbeSettings, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec, context, shared)
        self.metrics = [f"{family}@{k}" for family in spec.metrics for k in spec.k]
        self.buffer: EventBuffer[InteractionEvent] = EventBuffer(spec.buffer_size, spec.window_seconds)
        self.catalog = CatalogIds(spec.max_catalog_ids)

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        if self.spec.model is None or event.model == self.spec.model:
            # only what this probe reads: a query vector would cost d floats per buffered event
            self.buffer.add(InteractionEvent(event.model, event.query_id, None, event.results, event.clicks,
                                             event.relevance, event.slice, event.ts), now)

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        if (
            self.spec.catalog_stream is not None
            and batch.ids is not None
            and batch.stream == self.spec.catalog_stream
            and (self.spec.model is None or batch.model == self.spec.model)
        ):
            self.catalog.add(batch.model, batch.ids)

    @property
    def dropped_events(self) -> int:
        return self.buffer.dropped

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(_encode_events), "catalog": self.catalog.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"], _decode_events)
        self.catalog.load_state_dict(state["catalog"])

    def run(self, deadline: Deadline) -> ProbeResult:
        events = self.buffer.recent(self.context.clock())
        by_model: dict[str, list[InteractionEvent]] = defaultdict(list)
        for event in events:
            by_model[event.model].append(event)
        if self.spec.model is not None:
            by_model.setdefault(self.spec.model, [])
        estimates, queries, samples = [], [], []
        for model in sorted(by_model):
            deadline.check()
            e, q, s = self._evaluate_model(model, by_model[model])
            estimates += e
            queries += q
            samples += s
        return ProbeResult(tuple(estimates), tuple(queries), tuple(samples))

    def _evaluate_model(self, model: str, events: list[InteractionEvent]) -> tuple[list, list, list[Sample]]:
        stats = self.shared.statistics
        judged = merge_events(events)
        qrels = [q.qrels(self.spec.click_grade) for q in judged]
        if not judged:
            return [], [(model, ALL, 0)], []
        raw_slices = slice_labels(q.slice for q in judged)
        sliced = any(label is not None for label in raw_slices)
        folded: list[str] = []  # the slice label of each query, when sliced
        dropped: tuple[str, ...] = ()
        if sliced:  # one fold for every number of this model, so their slice labels agree
            labels_array, dropped = fold_slices(raw_slices, max_slices=stats.max_slices)
            folded = labels_array.tolist()
        with_results = [i for i, q in enumerate(judged) if q.results]
        samples: list[Sample] = []

        # zero-result ratio, over every query
        empty = np.array([not q.results for q in judged])
        groups = {ALL: np.ones(len(judged), dtype=bool)}
        if sliced:
            labels = np.asarray(folded, dtype=object)
            groups.update({name: labels == name for name in sorted(set(folded))})
        for name, members in groups.items():
            samples.append(sample("retrieval_zero_result_ratio", float(empty[members].mean()),
                                  probe=self.name, model=model, slice=name))

        # accuracy from clicks, over the queries that returned something
        summary_queries: list[tuple[str, str, int]] = []
        estimates = []
        if with_results:
            ranked = RankedResults.from_lists(
                [judged[i].results for i in with_results], [qrels[i] for i in with_results]
            )
            per_query = evaluate(ranked, self.metrics, relevance_threshold=_threshold(qrels), gain=self.spec.gain)
            subset: list[str | None] = [folded[i] for i in with_results] if sliced else [None] * len(with_results)
            summary = summarise(per_query, subset, probe=self.name, model=model, stats=stats,
                                folded_upstream=bool(dropped))
            estimates, summary_queries = summary.estimates, summary.queries
            samples += summary.samples
            clicked_within = _first_positive_rank(ranked.grades)
            sub = np.asarray(subset, dtype=object)
            for name in [ALL, *sorted({s for s in subset if s is not None})]:
                members = np.ones(len(subset), dtype=bool) if name == ALL else sub == name
                for k in self.spec.k:
                    ctr = float((clicked_within[members] <= k).mean())
                    samples.append(sample("retrieval_click_through_rate", ctr,
                                          probe=self.name, model=model, slice=name, k=str(k)))
        else:
            summary_queries = [(model, ALL, 0)]

        samples += self._beyond_accuracy(model, judged, qrels)
        return estimates, summary_queries, samples

    def _beyond_accuracy(self, model: str, judged: list[_Query], qrels: list[dict[str, float]]) -> list[Sample]:
        k = self.spec.max_k
        counts: Counter[str] = Counter(doc for q in judged for doc in dict.fromkeys(q.results[:k]))
        popularity: Counter[str] = Counter(doc for graded in qrels for doc, grade in graded.items() if grade > 0)
        catalog = self.catalog.get(model) if self.spec.catalog_stream is not None else None
        seen = set(counts) | set(popularity)
        if self.spec.catalog_size is not None:
            catalog_size = self.spec.catalog_size
            universe = max(catalog_size, len(seen))
            in_catalog: set[str] | None = None
        elif catalog is not None:
            catalog_size = len(catalog)
            universe = len(catalog | seen)
            in_catalog = catalog
        else:
            catalog_size = 0
            universe = len(seen)
            in_catalog = None
        out = []
        labels = {"probe": self.name, "model": model}
        if catalog_size:
            coverage = catalog_coverage(counts, in_catalog, catalog_size)
            out.append(sample("retrieval_catalog_coverage_ratio", coverage, **labels))
        zeros = universe - len(counts)
        g = gini([*counts.values(), *([0] * zeros)])
        if not np.isnan(g):
            out.append(sample("retrieval_gini", g, **labels))
        bias = popularity_bias(counts, popularity, universe)
        if not np.isnan(bias):
            out.append(sample("retrieval_popularity_bias", bias, **labels))
        return out


def _encode_events(events: list[InteractionEvent]) -> list[list[Any]]:
    return [[e.model, e.query_id, list(e.results), list(e.clicks), dict(e.relevance), e.slice, e.ts] for e in events]


def _decode_events(rows: list[list[Any]]) -> list[InteractionEvent]:
    out = []
    for model, query_id, results, clicks, relevance, slice_, ts in rows:
        out.append(InteractionEvent(
            model=str(model), query_id=None if query_id is None else str(query_id),
            results=tuple(str(r) for r in results), clicks=tuple(str(c) for c in clicks),
            relevance={str(k): checks.finite(v, "a buffered relevance grade") for k, v in relevance.items()},
            slice=None if slice_ is None else str(slice_),
            ts=None if ts is None else checks.finite(ts, "a buffered event's time"),
        ))
    return out


def _threshold(qrels: list[dict[str, float]]) -> float:
    """Relevance threshold for the binary metrics: any positive feedback counts as relevant."""
    positive = [g for graded in qrels for g in graded.values() if g > 0]
    return min(positive) if positive else 1.0


def _first_positive_rank(grades: np.ndarray) -> np.ndarray:
    """1-based rank of the first positively graded result per row (inf when none)."""
    positive = grades > 0
    first = np.argmax(positive, axis=1) + 1.0
    return np.where(positive.any(axis=1), first, np.inf)
