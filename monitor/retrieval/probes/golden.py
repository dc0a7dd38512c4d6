"""Golden-set probe: labelled queries run against a retriever, scored by the metric engine.

The golden set is a JSONL file, one query per line::

    {"query_id": "q1", "text": "how do I reset my password", "qrels": {"doc-7": 2, "doc-9": 1}, "slice": "head"}
    {"query_id": "q2", "vector": [0.01, -0.2, ...], "qrels": {"doc-3": 1}}

``query_id`` (string or integer, unique), ``qrels`` (document id -> grade, at least one) and one
of ``vector`` / ``text`` (or both) are required; ``slice`` is optional and label-safe.

The retriever is either an HTTP search endpoint (a JSON request per query, the ranked ids read
from the response with a dotted path, as Elasticsearch's rank-eval templates do) or exact k-NN
over the current window sample of a (model, stream). Texts are embedded by an optional
sentence-transformers model when the retriever needs vectors.

Examples
--------
>>> template = RequestTemplate('{"query": {"match": {"body": "{{text}}"}}, "knn": {"vector": {{vector}}, "k": {{k}}}}')
>>> template.render({"text": 'say "hi"', "vector": [0.5, 1.0], "k": 3, "query_id": "q1"})
b'{"query":{"match":{"body":"say \\\\"hi\\\\""}},"knn":{"vector":[0.5,1.0],"k":3}}'
>>> extract_ids({"hits": {"hits": [{"_id": "d2"}, {"_id": 7}]}}, parse_ids_path("hits.hits[*]._id"))
['d2', '7']
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.config import LABEL_VALUE_RE
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.probes.base import Deadline, Probe, ProbeError, ProbeResult, identified_rows, summarise
from monitor.retrieval.probes.knn import exact_topk

if TYPE_CHECKING:
    from monitor.component import MonitorContext
    from monitor.retrieval.settings import (
        EncoderSettings,
        GoldenProbeSettings,
        HttpRetrieverSettings,
        KnnRetrieverSettings,
        ProbeSettings,
    )

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("text", "vector", "k", "query_id")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024


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
    if slice_ is not None and (not isinstance(slice_, str) or not LABEL_VALUE_RE.match(slice_)):
        raise ValueError(f"{where}: slice must be a label-safe string ({LABEL_VALUE_RE.pattern})")
    return GoldenQuery(str(qid), grades, text, array, slice_)


# ---------------------------------------------------------------------------- request templates
class RequestTemplate:
    """A JSON request body with ``{{placeholders}}``, rendered by building JSON, never by pasting text.

    Accepts JSON text in which placeholders may stand bare where a value goes (``"k": {{k}}``),
    or an already-parsed mapping. A string that is exactly one placeholder becomes the value
    itself (a list, a number, a string); a placeholder inside a longer string is interpolated.
    """

    def __init__(self, template: str | Mapping[str, Any]):
        if isinstance(template, str):
            try:
                parsed = json.loads(_quote_bare_placeholders(template))
            except ValueError as exc:
                raise ValueError(f"request_template is not JSON (placeholders aside): {exc}") from None
        else:
            parsed = template
        self.template = parsed
        self.names = frozenset(_names_in(parsed))
        unknown = self.names - set(PLACEHOLDERS)
        if unknown:
            raise ValueError(
                f"request_template uses unknown placeholders {sorted(unknown)}; known: {list(PLACEHOLDERS)}"
            )

    def render(self, values: Mapping[str, Any]) -> bytes:
        body = _substitute(self.template, values)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _quote_bare_placeholders(text: str) -> str:
    """Wrap placeholders that stand outside JSON strings in quotes, so the text parses as JSON."""
    out: list[str] = []
    in_string = escaped = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            out.append(ch)
            i += 1
            continue
        match = _PLACEHOLDER.match(text, i)
        if match:
            out.append(f'"{{{{{match.group(1)}}}}}"')
            i = match.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _names_in(node: Any) -> set[str]:
    if isinstance(node, str):
        return set(_PLACEHOLDER.findall(node))
    if isinstance(node, Mapping):
        return set().union(*(_names_in(k) | _names_in(v) for k, v in node.items()))
    if isinstance(node, list):
        return set().union(*(_names_in(v) for v in node))
    return set()


def _substitute(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: _as_text(values[m.group(1)]), node)
    if isinstance(node, Mapping):
        return {_substitute(k, values): _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    return node


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


# ---------------------------------------------------------------------------- response paths
_STEP = re.compile(r"([^.\[\]]+)|\[(\*|[0-9]+)\]")


def parse_ids_path(path: str) -> list[tuple[str, str]]:
    """``hits.hits[*]._id`` -> [("key", "hits"), ("key", "hits"), ("all", ""), ("key", "_id")]."""
    steps: list[tuple[str, str]] = []
    position = 0
    text = path.strip()
    if not text:
        raise ValueError("ids_path is empty")
    while position < len(text):
        if text[position] == "." and steps:
            position += 1
        match = _STEP.match(text, position)
        if not match:
            raise ValueError(f"ids_path {path!r}: cannot parse at {text[position:]!r}")
        if match.group(1) is not None:
            steps.append(("key", match.group(1)))
        elif match.group(2) == "*":
            steps.append(("all", ""))
        else:
            steps.append(("index", match.group(2)))
        position = match.end()
    return steps


def extract_ids(document: Any, steps: Sequence[tuple[str, str]]) -> list[str]:
    """Follow a parsed path through a JSON response; raise ``ProbeError`` when it does not fit."""
    nodes = [document]
    for kind, arg in steps:
        following: list[Any] = []
        for node in nodes:
            if kind == "key":
                if not isinstance(node, dict) or arg not in node:
                    raise ProbeError(f"response has no field {arg!r} where the ids path expects one")
                following.append(node[arg])
            elif kind == "all":
                if not isinstance(node, list):
                    raise ProbeError("response has no list where the ids path has [*]")
                following.extend(node)
            else:
                if not isinstance(node, list) or int(arg) >= len(node):
                    raise ProbeError(f"response has no element [{arg}] where the ids path expects one")
                following.append(node[int(arg)])
        nodes = following
    ids = []
    for node in nodes:
        if isinstance(node, bool) or not isinstance(node, (str, int)):
            raise ProbeError(f"an id in the response is {type(node).__name__}, not a string or integer")
        ids.append(str(node))
    return ids


# ---------------------------------------------------------------------------- retrievers
class HttpRetriever:
    """One request per query to a search endpoint (stdlib ``urllib``; no connection reuse)."""

    def __init__(self, settings: HttpRetrieverSettings):
        self.settings = settings
        self.template = None if settings.request_template is None else RequestTemplate(settings.request_template)
        self.steps = parse_ids_path(settings.ids_path)
        self.needs_vector = (self.template is not None and "vector" in self.template.names) or (
            "{{vector}}" in settings.url.replace(" ", "")
        )

    def search(self, query: GoldenQuery, vector: np.ndarray | None, k: int, deadline: Deadline) -> list[str]:
        values = {
            "text": query.text if query.text is not None else "",
            "vector": None if vector is None else [float(x) for x in vector],
            "k": k,
            "query_id": query.query_id,
        }
        url = _PLACEHOLDER.sub(lambda m: urllib.parse.quote(_as_text(values[m.group(1)]), safe=""), self.settings.url)
        body = None if self.settings.method == "GET" or self.template is None else self.template.render(values)
        headers = {"Accept": "application/json", **self.settings.headers}
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(url, data=body, headers=headers, method=self.settings.method)
        timeout = min(self.settings.request_timeout_seconds, deadline.remaining())
        if timeout <= 0:
            deadline.check()
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - configured URL
                raw = response.read(_MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise ProbeError(f"HTTP {exc.code} from {self.settings.url}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            reason = getattr(exc, "reason", exc)
            raise ProbeError(f"request to {self.settings.url} failed: {reason}") from None
        if len(raw) > _MAX_RESPONSE_BYTES:
            raise ProbeError("response larger than 64 MiB")
        try:
            document = json.loads(raw)
        except ValueError:
            raise ProbeError(f"response is not JSON: {raw[:60]!r}") from None
        return extract_ids(document, self.steps)[:k]


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

                from monitor.retrieval.probes.knn import resolve_device

                self._model = SentenceTransformer(str(self.settings.path), device=resolve_device(self.device).type)
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
class GoldenSetProbe(Probe):
    """Runs every golden query against the retriever and exports the engine's metrics per slice."""

    kind = "golden"

    def __init__(self, spec: GoldenProbeSettings, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec.name, spec.interval_seconds, spec.timeout_seconds)
        self.spec = spec
        self.context = context
        self.shared = shared
        self.device = shared.device or context.settings.device
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
            for i, vector in zip(todo, encoded):
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
            [ranked[i] for i in kept],  # type: ignore[misc]
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
        for query, vector in zip(self._queries, vectors):
            deadline.check()
            try:
                ranked.append(self.http.search(query, vector, k, deadline))
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

