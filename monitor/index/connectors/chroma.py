"""A Chroma collection over Chroma's HTTP API (v2): the server ``chroma run`` starts, no client library.

* **served**: ``POST .../collections/{id}/query`` with the query, ``n_results`` k and the filter as a
  ``where`` of equalities (``$and`` of several): what the application's own query does, through the
  collection's HNSW index with the collection's own settings (``ef_search``, ``space``), which are read
  from the collection and are not the probe's to change;
* **exact**: Chroma has no brute-force switch (``ef_search`` is a setting of the collection, and changing
  it changes the application's searches too). The exact answer is computed here: every row under the same
  ``where`` is read with its embedding (``POST .../get``, pages of ``page_rows``) and ranked by the
  collection's distance. It is bounded: a filter with more than ``exact_max_rows`` rows is refused as
  ``unsupported`` before any row is read (its count comes first), so one exact search reads at most
  ``exact_max_rows`` rows; keep the probe's exact searches to filtered scopes or small collections;
* **fetch**: ``get`` by ids; **sample**: ``get`` of one row at each of ``n`` offsets drawn at random
  (a uniform sample without replacement); **count**: ``GET .../count``.

Distances are Chroma's: cosine ``1 - cos``, l2 the *squared* Euclidean distance, ip ``1 - x·q``
(:meth:`ChromaConnector.distance`). The collection's ``space`` decides them; a ``metric`` setting that
disagrees with it is refused (``unsupported``), so recall is never measured in the wrong distance.
Every request has the section's ``timeout_seconds``; every failure is a :class:`ConnectorError` by reason.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.index.connectors.base import (
    Answer,
    Connector,
    ConnectorError,
    Filter,
    Mode,
    Reason,
    check_query,
    distances,
    parse_count,
    parse_distance,
    parse_id,
    parse_rows,
    parse_vector_rows,
)
from monitor.index.settings import ChromaSettings

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# Chroma's space -> this package's metric name
SPACES = {"cosine": "cosine", "l2": "l2", "ip": "dot"}
_HTTP_REASONS: dict[int, Reason] = {401: "permission", 403: "permission", 404: "missing_table", 408: "timeout",
                                    502: "unreachable", 503: "unreachable", 504: "timeout"}


def where(filter_: Filter, allowed: frozenset[str]) -> dict[str, Any] | None:
    """The filter's equalities as a Chroma ``where`` (one ``$eq``, or an ``$and`` of several)."""
    clauses: list[dict[str, Any]] = []
    for key, value in filter_:
        if key not in allowed:
            raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
        if isinstance(value, float) and not np.isfinite(value):
            raise ConnectorError("unsupported", "a non-finite filter value")
        clauses.append({key: {"$eq": value}})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def classify_http(code: int, body: bytes, path: str) -> ConnectorError:
    text = body.decode("utf-8", "replace")[:300].strip()
    lowered = text.lower()
    if "dimension" in lowered:
        return ConnectorError("dimension", f"HTTP {code} from {path}: {text}")
    if code == 404 or ("does not exist" in lowered and "collection" in lowered):
        return ConnectorError("missing_table", f"HTTP {code} from {path}: {text}")
    return ConnectorError(_HTTP_REASONS.get(code, "other"), f"HTTP {code} from {path}: {text}")


def parse_query(doc: Any, k: int) -> Answer:
    """A ``query`` answer for one query embedding: ``{"ids": [[...]], "distances": [[...]]}``."""
    if not isinstance(doc, dict):
        raise ConnectorError("bad_result", "a query answer that is not an object")
    ids, dists = doc.get("ids"), doc.get("distances")
    if not (isinstance(ids, list) and isinstance(dists, list) and len(ids) == 1 and len(dists) == 1):
        raise ConnectorError("bad_result", "a query answer without one list of ids and of distances")
    if not (isinstance(ids[0], list) and isinstance(dists[0], list) and len(ids[0]) == len(dists[0])):
        raise ConnectorError("bad_result", "a query answer whose ids and distances differ in length")
    return parse_rows(zip(ids[0], [parse_distance(d) for d in dists[0]], strict=True), k)


def parse_get(doc: Any, dim: int | None, limit: int) -> list[tuple[str, np.ndarray]]:
    """A ``get`` answer with embeddings: ``{"ids": [...], "embeddings": [[...], ...]}``."""
    if not isinstance(doc, dict):
        raise ConnectorError("bad_result", "a get answer that is not an object")
    ids, vectors = doc.get("ids"), doc.get("embeddings")
    if not isinstance(ids, list) or not isinstance(vectors, list) or len(ids) != len(vectors):
        raise ConnectorError("bad_result", "a get answer without matching ids and embeddings")
    return parse_vector_rows(zip(ids, vectors, strict=True), dim, limit)


class ChromaConnector(Connector):
    engine = "chroma"

    def __init__(self, settings: ChromaSettings):
        self.settings = settings
        self.metric = settings.metric
        self.filter_columns = frozenset(settings.filter_columns)
        self.dim: int | None = None
        self.hnsw: dict[str, Any] = {}  # the collection's HNSW settings, as the server reports them
        self._base: str | None = None
        self._token = settings.token_file.read_text().strip() if settings.token_file is not None else None

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - http(s)
        path = urllib.parse.urlsplit(url).path
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_seconds) as response:  # noqa: S310
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise classify_http(exc.code, exc.read(4096) or b"", path) from None
        except TimeoutError:
            raise ConnectorError("timeout", f"no answer from {path} within {self.settings.timeout_seconds}s") from None
        except (urllib.error.URLError, OSError) as exc:
            timed_out = isinstance(getattr(exc, "reason", None), TimeoutError)
            raise ConnectorError("timeout" if timed_out else "unreachable", f"{path}: {exc}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ConnectorError("bad_result", "an answer over 64 MiB")
        try:
            return json.loads(raw)
        except ValueError:
            raise ConnectorError("bad_result", "an answer that is not JSON") from None

    def _collection(self) -> str:
        """The collection's URL; at the first call, its id, dimension and HNSW settings are read."""
        if self._base is not None:
            return self._base
        s = self.settings
        root = f"{s.url}/api/v2/tenants/{urllib.parse.quote(s.tenant)}/databases/{urllib.parse.quote(s.database)}"
        doc = self._request("GET", f"{root}/collections/{urllib.parse.quote(s.collection)}")
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
            raise ConnectorError("bad_result", "a collection without an id")
        config = doc.get("configuration_json") or {}
        hnsw = config.get("hnsw") if isinstance(config, dict) else None
        hnsw = hnsw if isinstance(hnsw, dict) else {}
        space = hnsw.get("space") or ((doc.get("metadata") or {}).get("hnsw:space")) or "l2"
        if space not in SPACES:
            raise ConnectorError("unsupported", f"chroma: collection space {space!r}")
        if SPACES[space] != s.metric:
            raise ConnectorError("unsupported", f"chroma: the collection's space is {space!r}, metric says {s.metric}")
        dim = doc.get("dimension")
        self.dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None
        self.hnsw = dict(hnsw)
        self._base = f"{root}/collections/{doc['id']}"
        return self._base

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        base = self._collection()
        try:
            return self._request("POST", base + path, body)
        except ConnectorError as exc:
            if exc.reason in ("missing_table", "unreachable"):
                self._base = None  # a collection recreated (new id), a server back: look it up again
            raise

    # ------------------------------------------------------------------ the four questions
    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        if mode == "exact_quantized":
            raise ConnectorError("unsupported", "chroma: no exact search in a quantized space")
        self._collection()
        q = check_query(query, self.dim)
        clause = where(filter_, self.filter_columns)
        if mode == "exact":
            return self._exact(q, k, clause)
        body: dict[str, Any] = {"query_embeddings": [q.tolist()], "n_results": k, "include": ["distances"]}
        if clause is not None:
            body["where"] = clause
        return parse_query(self._post("/query", body), k)

    def _exact(self, q: np.ndarray, k: int, clause: dict[str, Any] | None) -> Answer:
        """Every row under ``clause`` read and ranked here (bounded by ``exact_max_rows``)."""
        s = self.settings
        total = self.count() if clause is None else None
        if total is not None and total > s.exact_max_rows:
            raise ConnectorError("unsupported", f"chroma: an exact search over {total} rows "
                                                f"(exact_max_rows {s.exact_max_rows})")
        rows: list[tuple[str, np.ndarray]] = []
        offset = 0
        while True:
            body: dict[str, Any] = {"limit": s.page_rows, "offset": offset, "include": ["embeddings"]}
            if clause is not None:
                body["where"] = clause
            page = parse_get(self._post("/get", body), self.dim, s.page_rows)
            rows.extend(page)
            offset += len(page)
            if len(rows) > s.exact_max_rows:
                raise ConnectorError("unsupported", f"chroma: an exact search over more than {s.exact_max_rows} rows "
                                                    "(exact_max_rows)")
            if len(page) < s.page_rows:
                break
        if not rows:
            return Answer((), np.zeros(0, dtype=np.float64))
        dists = self.distance(q, np.stack([v for _, v in rows]))
        order = np.argsort(dists, kind="stable")[:k]
        return parse_rows(((rows[i][0], float(dists[i])) for i in order.tolist()), k)

    def fetch(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        if not ids:
            return {}
        self._collection()
        out: dict[str, np.ndarray] = {}
        step = self.settings.page_rows
        for start in range(0, len(ids), step):
            chunk = list(ids[start:start + step])
            doc = self._post("/get", {"ids": chunk, "include": ["embeddings"]})
            out.update(parse_get(doc, self.dim, len(chunk)))
        return out

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        total = self.count()
        if n <= 0 or total == 0:
            return []
        offsets = np.sort(np.random.default_rng().choice(total, size=min(n, total), replace=False)).tolist()
        rows: list[tuple[str, np.ndarray]] = []
        for offset in offsets:  # one row per offset: Chroma has no random sample
            rows.extend(parse_get(self._post("/get", {"limit": 1, "offset": offset, "include": ["embeddings"]}),
                                  self.dim, 1))
        return list(dict(rows).items())  # a row met twice (rows moved under a write) counts once

    def count(self) -> int:
        base = self._collection()
        try:
            return parse_count(self._request("GET", base + "/count"))
        except ConnectorError as exc:
            if exc.reason in ("missing_table", "unreachable"):
                self._base = None
            raise

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        if not ids:
            return {}
        doc = self._post("/get", {"ids": list(ids), "include": ["documents"]})
        got, documents = (doc.get("ids"), doc.get("documents")) if isinstance(doc, dict) else (None, None)
        if not isinstance(got, list) or not isinstance(documents, list) or len(got) != len(documents):
            raise ConnectorError("bad_result", "a get answer without matching ids and documents")
        return {parse_id(i): t for i, t in zip(got, documents, strict=True) if isinstance(t, str)}

    def distance(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """Chroma's: l2 squared, ip 1 - x·q (base: -x·q), cosine 1 - cos."""
        base = distances(self.metric, query, vectors)
        if self.metric == "l2":
            return base**2
        return base + 1.0 if self.metric == "dot" else base

    def close(self) -> None:
        self._base = None
