"""ANN recall: how many of the exact nearest neighbours the production index served.

Interaction events that carry ``query_vector`` and the served ``results`` are buffered; each run
recomputes the exact top-k of every buffered query over the documents whose vectors the monitor
holds, the *pool* P (the window sample of ``(model, stream)``, plus an optional id -> vector
cache of that stream), and compares.

The estimator
-------------
The true recall of a query is |A ∩ T_k(C)| / k, with A the k served ids, C the index's corpus and
T_k(X) the exact top k of a set X. The monitor does not hold C, only P. Let A_u be the served
ids whose vectors are not in P (u = |A_u|), A_p = A ∖ A_u. Per query::

    recall_P = (u + |A_p ∩ T_{k-u}(P)|) / k

i.e. unknown served documents are given the benefit of the doubt and the known ones must be
among the exact best of what is left. Queries with no known served document carry no
information and are skipped (``embmon_retrieval_ann_known_results_ratio`` says how much of the
served lists the monitor could check). Properties (``tests/retrieval/probes/test_ann_recall.py``):

* **Exact** when P holds the corpus (window sample or cache as large as the index), or more
  generally every query's true top k: then recall_P is the true recall.
* **Never below the true recall** (an upper bound, query by query): a served document in T_k(C)
  is outranked in P only by members of T_k(C), so it stays in T_{k-u}(P). A low value is always
  real; an alert on it never fires falsely.
* **Bias**: a missed neighbour is seen only if it is in P. Say P holds a uniform fraction p of C
  plus the served documents (a vector cache). When the index's errors are near misses (ranks
  k+1..2k returned instead of ranks ≤ k) the miss rate reads low by about the factor p. When the
  index returns far-off documents (a broken index), the sampled documents beat them and
  recall_P equals the true recall even for small p. Served documents whose vectors are unknown
  are counted as hits, so an unknown far-off result is not seen at all.
  So recall_P catches broken indexes whenever the served vectors are known, and measures the
  fine 0.90–0.95 range only when p is near 1 (a reservoir or ``vector_cache_size`` the size of
  the corpus).

The value exported is the mean of recall_P over the evaluated queries with a bootstrap interval
over queries, overall and per slice.

Examples
--------
>>> pool = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.7, 0.7]], dtype=np.float32)
>>> ids = ["a", "b", "c", "d"]
>>> q = np.array([[1.0, 0.05]], dtype=np.float32)
>>> recall_against_pool(q, [("a", "b")], ids, pool, ks=[2])["recall@2"].tolist()
[1.0]
>>> recall_against_pool(q, [("a", "c")], ids, pool, ks=[2])["recall@2"].tolist()
[0.5]
>>> recall_against_pool(q, [("a", "zz")], ids, pool, ks=[2])["recall@2"].tolist()  # zz unknown: benefit of the doubt
[1.0]
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.retrieval.probes.base import ConfiguredProbe, EventBuffer, ProbeResult, identified_rows, sample, summarise
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.knn import exact_topk
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.component import MonitorContext
    from monitor.retrieval.settings import AnnRecallProbeSettings, ProbeSettings


@dataclass(frozen=True, slots=True)
class ServedQuery:
    vector: np.ndarray
    served: tuple[str, ...]
    slice: str | None


def recall_against_pool(
    queries: np.ndarray,
    served: Sequence[Sequence[str]],
    pool_ids: Sequence[str],
    pool: np.ndarray,
    ks: Sequence[int],
    *,
    similarity: str = "cosine",
    block_size: int = 8192,
    device: str | None = "cpu",
    check: object = None,
) -> dict[str, np.ndarray]:
    """Per-query recall_P@k (see the module docstring) for each k, keyed ``recall@k``.

    Rows whose served list has no document in the pool are NaN (no information); the caller drops
    them. ``served[i]`` is the served list of query i, best first (only its first k count at k).
    """
    if len(served) != queries.shape[0]:
        raise ValueError(f"{len(served)} served lists for {queries.shape[0]} queries")
    max_k = max(ks)
    found = exact_topk(
        queries, pool, max_k, similarity=similarity, block_size=block_size, device=device,
        check=check,  # type: ignore[arg-type]
    )
    position = {doc_id: row for row, doc_id in enumerate(pool_ids)}
    out = {f"recall@{k}": np.full(len(served), np.nan) for k in ks}
    for i, (row, served_ids) in enumerate(zip(found.indices.tolist(), served, strict=True)):
        exact = [j for j in row if j >= 0]
        for k in ks:
            top = list(dict.fromkeys(served_ids))[:k]
            known = [position[d] for d in top if d in position]
            if not known:
                continue
            unknown = len(top) - len(known)
            best = set(exact[: k - unknown])
            out[f"recall@{k}"][i] = (unknown + sum(1 for j in known if j in best)) / k
    return out


def _encode_served(items: list[ServedQuery]) -> dict[str, Any]:
    dims = {item.vector.shape[0] for item in items}
    vectors: Any = [i.vector for i in items]
    if items and len(dims) == 1:
        vectors = np.stack(vectors)  # one array in the checkpoint instead of one per event
    return {"vectors": vectors, "served": [list(i.served) for i in items], "slices": [i.slice for i in items]}


def _decode_served(state: Mapping[str, Any]) -> list[ServedQuery]:
    vectors = state["vectors"]
    rows = list(vectors) if isinstance(vectors, np.ndarray) else list(vectors)
    if not (len(rows) == len(state["served"]) == len(state["slices"])):
        raise ValueError("ANN buffer state holds mismatched fields")
    dims = {np.shape(v) for v in rows}
    if len(dims) > 1 or any(len(d) != 1 for d in dims):
        raise checks.InvalidState(f"ANN buffer query vectors have shapes {sorted(dims)}, expected one dimension")
    return [
        ServedQuery(checks.finite_array(np.asarray(v), np.shape(v), "a buffered query vector", np.float32),
                    tuple(str(d) for d in served), None if s is None else str(s))
        for v, served, s in zip(rows, state["served"], state["slices"], strict=True)
    ]


class VectorCache:
    """Document vectors by id: the ids among the last ``capacity`` rows written to the stream.

    A ring of ``capacity`` rows; re-embedding an id moves it to the newest slot (its old slot
    becomes a hole that the ring overwrites later). Memory: capacity × dim × 4 bytes.
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._vectors: np.ndarray | None = None
        self._ids: list[str | None] = [None] * self.capacity
        self._slot: dict[str, int] = {}
        self._next = 0
        self._lock = threading.Lock()

    def add(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        if self.capacity == 0 or not len(ids):
            return
        with self._lock:
            if self._vectors is None:
                self._vectors = np.zeros((self.capacity, vectors.shape[1]), dtype=np.float32)
            if vectors.shape[1] != self._vectors.shape[1]:
                return
            slots = np.empty(len(ids), dtype=np.int64)
            for i, doc_id in enumerate(ids):
                previous = self._slot.pop(doc_id, None)
                if previous is not None:
                    self._ids[previous] = None
                slot = self._next
                self._next = (self._next + 1) % self.capacity
                evicted = self._ids[slot]
                if evicted is not None:
                    del self._slot[evicted]
                self._ids[slot] = doc_id
                self._slot[doc_id] = slot
                slots[i] = slot
            self._vectors[slots] = vectors

    def state_dict(self) -> dict[str, Any]:
        ids, vectors = self.snapshot()
        return {"ids": ids, "vectors": vectors}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        ids = [str(i) for i in state["ids"]]
        vectors = np.asarray(state["vectors"])
        if ids and (vectors.ndim != 2 or vectors.shape[0] != len(ids)):
            raise ValueError("vector cache state holds mismatched ids and vectors")
        if ids:
            vectors = checks.finite_array(vectors, vectors.shape, "cached document vectors", np.float32)
        with self._lock:
            self._vectors, self._ids, self._slot, self._next = None, [None] * self.capacity, {}, 0
        if ids:
            self.add(ids[-self.capacity :], vectors[-self.capacity :])

    def snapshot(self) -> tuple[list[str], np.ndarray]:
        with self._lock:
            if self._vectors is None or not self._slot:
                return [], np.empty((0, 0), dtype=np.float32)
            rows = np.fromiter(self._slot.values(), dtype=np.int64, count=len(self._slot))
            return list(self._slot), self._vectors[rows].copy()

    def __len__(self) -> int:
        return len(self._slot)


class AnnRecallProbe(ConfiguredProbe["AnnRecallProbeSettings"]):
    kind = "ann_recall"

    def __init__(self, spec: AnnRecallProbeSettings, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec, context, shared)
        self.buffer: EventBuffer[ServedQuery] = EventBuffer(spec.buffer_size, spec.window_seconds)
        self.cache = VectorCache(spec.vector_cache_size)

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        if event.model == self.spec.model and event.query_vector is not None and event.results:
            self.buffer.add(ServedQuery(event.query_vector, event.results[: self.spec.max_k], event.slice), now)

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        if (
            self.cache.capacity
            and batch.ids is not None
            and batch.model == self.spec.model
            and batch.stream == self.spec.stream
        ):
            self.cache.add(batch.ids, batch.vectors)

    @property
    def dropped_events(self) -> int:
        return self.buffer.dropped

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(_encode_served), "cache": self.cache.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"], _decode_served)
        self.cache.load_state_dict(state["cache"])

    def pool(self) -> tuple[list[str], np.ndarray]:
        """Ids and vectors of every document the monitor holds for (model, stream), each id once."""
        cached_ids, cached = self.cache.snapshot()
        window = self.context.latest_windows().get((self.spec.model, self.spec.stream))
        if window is None:
            return cached_ids, cached
        ids, rows = identified_rows(window.sample_ids)
        if not cached_ids:
            return ids, window.sample[rows]
        known = set(cached_ids)
        extra = [i for i, doc_id in enumerate(ids) if doc_id not in known]
        if cached.shape[1] != window.sample.shape[1]:
            raise ProbeError("cached vectors and the window sample have different dimensions")
        return cached_ids + [ids[i] for i in extra], np.concatenate([cached, window.sample[rows[extra]]])

    def run(self, deadline: Deadline) -> ProbeResult:
        events = self.buffer.recent(self.context.clock(), limit=self.spec.max_queries)
        pool_ids, pool = self.pool()
        notes: list[str] = []
        if not events or not pool_ids:
            why = "no interaction events with query_vector and results" if not events else "no documents with ids"
            return ProbeResult(queries=((self.spec.model, "all", 0),), notes=(why,))
        dim = pool.shape[1]
        usable = [e for e in events if e.vector.shape[0] == dim]
        if len(usable) < len(events):
            notes.append(f"{len(events) - len(usable)} query vectors of another dimension than the documents ({dim})")
        if not usable:
            raise ProbeError(f"no query vector has the documents' dimension {dim}")
        per_query = recall_against_pool(
            np.stack([e.vector for e in usable]),
            [e.served for e in usable],
            pool_ids,
            pool,
            self.spec.k,
            similarity=self.spec.similarity,
            block_size=self.shared.knn_block_size,
            device=self.device,
            check=deadline.check,
        )
        deadline.check()
        informative = ~np.isnan(next(iter(per_query.values())))
        position = set(pool_ids)
        served_total = sum(len(e.served) for e in usable)
        served_known = sum(1 for e in usable for d in e.served if d in position)
        kept = {name: values[informative] for name, values in per_query.items()}
        slices = [e.slice for e, keep in zip(usable, informative, strict=True) if keep]
        summary = summarise(
            kept if informative.any() else {},
            slices,
            probe=self.name,
            model=self.spec.model,
            stats=self.shared.statistics,
            family=lambda f: "ann_recall",
        )
        skipped = int((~informative).sum())
        if skipped:
            notes.append(f"{skipped} queries skipped: none of their served documents is in the pool")
        samples = [
            *summary.samples,
            sample("retrieval_ann_known_results_ratio", served_known / served_total if served_total else 0.0,
                   probe=self.name, model=self.spec.model),
        ]
        return ProbeResult(tuple(summary.estimates), tuple(summary.queries), tuple(samples), tuple(notes))
