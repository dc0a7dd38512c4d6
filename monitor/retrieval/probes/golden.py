"""Golden-set probe: labelled queries run against a retriever, scored by the metric engine.

The golden set is a JSONL file, one query per line::

    {"query_id": "q1", "text": "how do I reset my password", "qrels": {"doc-7": 2, "doc-9": 1}, "slice": "head"}
    {"query_id": "q2", "vector": [0.01, -0.2, ...], "qrels": {"doc-3": 1}}

``query_id`` (string or integer, unique), ``qrels`` (document id -> grade, at least one) and one
of ``vector`` / ``text`` (or both) are required; ``slice`` is optional and label-safe.

The retriever is either an HTTP search endpoint (:mod:`~monitor.retrieval.probes.http_retriever`:
a JSON request per query, the ranked ids read from the response with a dotted path, as
Elasticsearch's rank-eval templates do) or exact k-NN over the current window sample of a
(model, stream). Texts are embedded by an optional sentence-transformers model when the retriever
needs vectors.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.deadline import Deadline
from monitor.decoding.labels import LABEL_VALUE_RE, is_label_value
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.probes.base import ConfiguredProbe, ProbeResult, identified_rows, summarise
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.http_retriever import HttpRetriever
from monitor.retrieval.probes.knn import exact_topk

if TYPE_CHECKING:
    from monitor.component import MonitorContext
    from monitor.retrieval.settings import (
        EncoderSettings,
        GoldenProbeSettings,
        KnnRetrieverSettings,
        ProbeSettings,
    )

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the golden file
@dataclass(frozen=True)
class GoldenQuery:
    query_id: str
    qrels: Mapping[str, float]
    text: str | None = None
    vector: np.ndarray | None = None
    slice: str | None = None


def load_golden(path: str | Path) -> list[GoldenQuery]:
    """Read and validate a golden-set file; a bad line raises ``ValueError("file:line: ...")``."""
    path = Path(path)
    queries: list[GoldenQuery] = []
    seen: set[str] = set()
    dim: int | None = None
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not JSON ({exc})") from None
            query = _golden_query(doc, where)
            if query.query_id in seen:
                raise ValueError(f"{where}: query_id {query.query_id!r} repeated")
            seen.add(query.query_id)
            if query.vector is not None:
                if dim is not None and query.vector.shape[0] != dim:
                    raise ValueError(f"{where}: vector has {query.vector.shape[0]} components, earlier ones {dim}")
                dim = query.vector.shape[0]
            queries.append(query)
    if not queries:
        raise ValueError(f"{path}: no queries")
    return queries


def _golden_query(doc: Any, where: str) -> GoldenQuery:
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a JSON object")
    unknown = set(doc) - {"query_id", "qrels", "text", "vector", "slice"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    qid = doc.get("query_id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid) == "":
        raise ValueError(f"{where}: query_id must be a non-empty string or an integer")
    qrels = doc.get("qrels")
    if not isinstance(qrels, dict) or not qrels:
        raise ValueError(f"{where}: qrels must be a non-empty object of document id -> grade")
    grades: dict[str, float] = {}
    for doc_id, grade in qrels.items():
        if isinstance(grade, bool) or not isinstance(grade, (int, float)) or not math.isfinite(grade):
            raise ValueError(f"{where}: grade of {doc_id!r} must be a finite number")
        grades[str(doc_id)] = float(grade)
    text = doc.get("text")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise ValueError(f"{where}: text must be a non-empty string")
    vector = doc.get("vector")
    array = None
    if vector is not None:
        if not isinstance(vector, list) or not vector or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in vector
        ):
            raise ValueError(f"{where}: vector must be a non-empty list of numbers")
        array = np.asarray(vector, dtype=np.float32)
        if not np.isfinite(array).all() or not array.any():
            raise ValueError(f"{where}: vector must be finite and non-zero")
    if text is None and array is None:
        raise ValueError(f"{where}: give a vector or a text")
    slice_ = doc.get("slice")
    if slice_ is not None and not is_label_value(slice_):
        raise ValueError(f"{where}: slice must be a label-safe string ({LABEL_VALUE_RE.pattern})")
    return GoldenQuery(str(qid), grades, text, array, slice_)


# ---------------------------------------------------------------------------- text queries
class Encoder:
    """A sentence-transformers model loaded on first use (its import and load take seconds)."""

    def __init__(self, settings: EncoderSettings, device: str | None):
        self.settings = settings
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                from monitor.devices import device_type

                self._model = SentenceTransformer(str(self.settings.path), device=device_type(self.device))
            vectors = self._model.encode(
                list(texts),
                batch_size=self.settings.batch_size,
                convert_to_numpy=True,
                normalize_embeddings=self.settings.normalize,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    def close(self) -> None:
        with self._lock:
            self._model = None


# ---------------------------------------------------------------------------- the probe
class GoldenSetProbe(ConfiguredProbe["GoldenProbeSettings"]):
    """Runs every golden query against the retriever and exports the engine's metrics per slice."""

    kind = "golden"

    def __init__(self, spec: GoldenProbeSettings, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec, context, shared)
        self.metrics = [f"{family}@{k}" for family in spec.metrics for k in spec.k]
        self.encoder = None if spec.encoder is None else Encoder(spec.encoder, self.device)
        self.http = HttpRetriever(spec.retriever) if spec.retriever.kind == "http" else None
        self._loaded_mtime: float | None = None
        self._queries: list[GoldenQuery] = []
        self._vectors: list[np.ndarray | None] = []
        self._load()  # a bad file is a configuration error: fail at start-up, naming the line

    # -- the file (re-read when it changes) and the query vectors
    def _load(self) -> None:
        mtime = self.spec.file.stat().st_mtime
        if mtime == self._loaded_mtime:
            return
        queries = load_golden(self.spec.file)
        needs_vector = self.http is None or self.http.needs_vector
        missing = [q.query_id for q in queries if q.vector is None]
        if needs_vector and missing and self.encoder is None:
            raise ValueError(
                f"{self.spec.file}: {len(missing)} queries have only a text (first: {missing[0]!r}) but the "
                f"retriever needs vectors: configure probes.golden[{self.name}].encoder"
            )
        self._queries = queries
        self._vectors = [q.vector for q in queries]
        self._encoded = not (needs_vector and missing)
        self._loaded_mtime = mtime

    def _query_vectors(self, deadline: Deadline) -> list[np.ndarray | None]:
        if not self._encoded:
            assert self.encoder is not None
            todo = [i for i, v in enumerate(self._vectors) if v is None]
            texts = [self._queries[i].text or "" for i in todo]
            deadline.check()
            encoded = self.encoder.encode(texts)
            for i, vector in zip(todo, encoded, strict=True):
                self._vectors[i] = vector
            self._encoded = True
        return self._vectors

    def run(self, deadline: Deadline) -> ProbeResult:
        try:
            self._load()
        except (OSError, ValueError) as exc:
            raise ProbeError(f"golden set: {exc}") from None
        vectors = self._query_vectors(deadline)
        k = self.spec.max_k
        ranked = self._retrieve_http(vectors, k, deadline) if self.http else self._retrieve_knn(vectors, k, deadline)
        deadline.check()
        kept = [i for i, ids in enumerate(ranked) if ids is not None]
        results = RankedResults.from_lists(
            [ids for ids in ranked if ids is not None],
            [self._queries[i].qrels for i in kept],
            [self._queries[i].query_id for i in kept],
        )
        per_query = evaluate(
            results,
            self.metrics,
            relevance_threshold=self.spec.relevance_threshold,
            gain=self.spec.gain,
            max_grade=self.spec.max_grade,
        )
        summary = summarise(
            per_query,
            [self._queries[i].slice for i in kept],
            probe=self.name,
            model=self.spec.model,
            stats=self.shared.statistics,
        )
        failed = len(ranked) - len(kept)
        notes = (f"{failed} of {len(ranked)} requests failed and were left out",) if failed else ()
        return ProbeResult(tuple(summary.estimates), tuple(summary.queries), tuple(summary.samples), notes)

    def _retrieve_http(self, vectors: list[np.ndarray | None], k: int, deadline: Deadline) -> list[list[str] | None]:
        assert self.http is not None
        ranked: list[list[str] | None] = []
        errors: list[str] = []
        allowed = math.floor(self.http.settings.max_error_ratio * len(self._queries))
        for query, vector in zip(self._queries, vectors, strict=True):
            deadline.check()
            try:
                ranked.append(self.http.search(query.query_id, query.text, vector, k, deadline))
            except ProbeError as exc:
                if deadline.remaining() <= 0:
                    deadline.check()
                errors.append(str(exc))
                ranked.append(None)
                if len(errors) > allowed:
                    raise ProbeError(
                        f"{len(errors)} of {len(ranked)} requests failed so far (allowed: {allowed} of "
                        f"{len(self._queries)}); first error: {errors[0]}"
                    ) from None
        if errors:
            logger.warning(
                "probe %s: %d of %d requests failed (first: %s)", self.name, len(errors), len(ranked), errors[0]
            )
        return ranked

    def _retrieve_knn(self, vectors: list[np.ndarray | None], k: int, deadline: Deadline) -> list[list[str] | None]:
        retriever: KnnRetrieverSettings = self.spec.retriever  # type: ignore[assignment]
        window = self.context.latest_windows().get((self.spec.model, retriever.stream))
        if window is None:
            raise ProbeError(f"no window for model {self.spec.model!r} stream {retriever.stream!r} yet")
        ids, rows = identified_rows(window.sample_ids)
        if not rows.size:
            raise ProbeError(f"the sample of {self.spec.model}/{retriever.stream} holds no documents with ids")
        dims = sorted({v.shape[0] for v in vectors if v is not None})
        if len(dims) != 1:
            raise ProbeError(f"golden query vectors have dimensions {dims} (given vectors and the encoder's differ)")
        matrix = np.stack([v for v in vectors if v is not None])
        if matrix.shape[1] != window.sample.shape[1]:
            raise ProbeError(f"query vectors have dimension {matrix.shape[1]}, the documents {window.sample.shape[1]}")
        found = exact_topk(
            matrix,
            window.sample[rows],
            k,
            similarity=retriever.similarity,
            block_size=self.shared.knn_block_size,
            device=self.device,
            check=deadline.check,
        )
        return [[ids[j] for j in row if j >= 0] for row in found.indices.tolist()]

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()

