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
Every request goes through :mod:`monitor.outbound` and is bounded three ways:

* **time**: one total deadline per request (connect, send, head and whole body), the smaller of
  ``timeout_seconds`` and what is left of the probe's cycle (``deadline``); reason ``timeout``;
* **size**: the answer is capped by what was asked: ``rows x (dimension x 32 + 1 KiB) + 64 KiB``
  bytes for a search or a ``get`` (the largest dimension, 16,384, until the collection says its own),
  a small fixed cap for a count and for the collection's description, and the parsed JSON by its
  number of values; reason ``oversized``;
* **place**: no redirect is followed (``redirect``), so the bearer token never leaves the configured
  origin; an answer HTTP cannot frame is ``bad_result``.

Filter values are admitted before a query is sent (:meth:`ChromaConnector.admit`); ids Chroma cannot
hold are absent from a fetch, never an error. The collection is described again at each cycle
(:meth:`ChromaConnector.refresh`) and after a ``dimension`` or ``missing_table`` error, so a collection
deleted and re-created (a new id, another dimension) is measured at the next cycle.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from monitor import outbound
from monitor.index.connectors.base import (
    HTTP_ANSWER_FLOOR_BYTES,
    HTTP_BYTES_PER_NUMBER,
    HTTP_MAX_DIM,
    HTTP_ROW_BYTES,
    HTTP_STATUS_REASONS,
    HTTP_VALUES_FLOOR,
    HTTP_VALUES_PER_ROW,
    MAX_ID_CHARS,
    OUTBOUND_REASONS,
    REDESCRIBE,
    Answer,
    Connector,
    ConnectorError,
    Filter,
    FilterValue,
    Mode,
    check_number,
    check_query,
    check_text,
    distances,
    parse_count,
    parse_distance,
    parse_id,
    parse_rows,
    parse_vector_rows,
)
from monitor.index.settings import ChromaSettings

# answers are bounded by what was asked (base.py's HTTP_* budget per row); besides rows of vectors:
TEXT_BYTES = 64 * 1024  # a stored document, per row (texts())
DESCRIPTION_BYTES = 256 * 1024  # a collection's description (its configuration, schema and metadata)
DESCRIPTION_VALUES = DESCRIPTION_BYTES // 8  # JSON values in it (a value costs at least 2 bytes: `[]`, `,0`)
COUNT_BYTES = 1024  # a count: one integer
# Chroma's space -> this package's metric name
SPACES = {"cosine": "cosine", "l2": "l2", "ip": "dot"}


def where_value(key: str, value: FilterValue) -> FilterValue:
    """A filter value as Chroma's metadata holds it (a string, a 64-bit integer, a finite double, a
    boolean), or ``bad_filter``. A boolean stays a boolean (JSON ``true``: Chroma's ``true`` never
    equals ``1``); a string must be UTF-8 without NUL; an integer beyond int64 and NaN/infinity are refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        check_text(key, value)
        return value
    if isinstance(value, int):
        return check_number(key, value, "int64")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConnectorError("bad_filter", f"filter field {key!r}: a non-finite number")
        return value
    raise ConnectorError("bad_filter", f"filter field {key!r}: a {type(value).__name__}")


def chroma_id(ident: Any) -> bool:
    """Whether ``ident`` can be an id Chroma holds: a non-empty string of at most
    :data:`~monitor.index.connectors.base.MAX_ID_CHARS` characters, UTF-8 without NUL."""
    if not isinstance(ident, str) or not 0 < len(ident) <= MAX_ID_CHARS or "\x00" in ident:
        return False
    try:
        ident.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def where(filter_: Filter, allowed: frozenset[str]) -> dict[str, Any] | None:
    """The filter's equalities as a Chroma ``where`` (one ``$eq``, or an ``$and`` of several)."""
    clauses: list[dict[str, Any]] = []
    for key, value in filter_:
        if key not in allowed:
            raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
        clauses.append({key: {"$eq": where_value(key, value)}})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def classify_http(code: int, body: bytes, path: str) -> ConnectorError:
    """An HTTP error answer as a reason; the message shows the start of Chroma's own message (printable only)."""
    text = "".join(c if c.isprintable() else " " for c in body.decode("utf-8", "replace")[:300]).strip()
    lowered = text.lower()
    if code < 400:
        return ConnectorError("other", f"HTTP {code} from {path}")
    if "dimension" in lowered:
        return ConnectorError("dimension", f"HTTP {code} from {path}: {text}")
    if code == 404 or ("does not exist" in lowered and "collection" in lowered):
        return ConnectorError("missing_table", f"HTTP {code} from {path}: {text}")
    return ConnectorError(HTTP_STATUS_REASONS.get(code, "other"), f"HTTP {code} from {path}: {text}")


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
        if self._token is not None and not (self._token.isascii() and self._token.isprintable()):
            raise ValueError("index: chroma token_file: the token holds characters a header cannot carry "
                             "(a line break, a control or non-ASCII character)")

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, url: str, body: dict[str, Any] | None = None, *, max_body: int,
                 max_values: int) -> Any:
        """One call through :mod:`monitor.outbound` (one total deadline, no redirects), its answer at most
        ``max_body`` bytes and ``max_values`` JSON values."""
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        path = url[len(self.settings.url):]
        try:
            response = outbound.request(
                url, method=method, body=json.dumps(body, allow_nan=False).encode() if body is not None else None,
                headers=headers, timeout=self.call_timeout(self.settings.timeout_seconds), max_body=max_body)
            if response.status >= 300:
                raise classify_http(response.status, response.body, path)
            return outbound.parse_json(response.body, max_values)
        except outbound.OutboundError as exc:
            raise ConnectorError(OUTBOUND_REASONS[exc.reason], f"{path}: {exc}") from None
        except ValueError:
            raise ConnectorError("bad_result", f"{path}: an answer that is not JSON") from None

    def _collection(self) -> str:
        """The collection's URL; at the first call after :meth:`refresh`, its id, dimension and HNSW
        settings are read."""
        if self._base is not None:
            return self._base
        s = self.settings
        root = f"{s.url}/api/v2/tenants/{quote(s.tenant)}/databases/{quote(s.database)}"
        doc = self._request("GET", f"{root}/collections/{quote(s.collection)}", max_body=DESCRIPTION_BYTES,
                            max_values=DESCRIPTION_VALUES)
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not chroma_id(doc["id"]):
            raise ConnectorError("bad_result", "a collection without an id")
        config = doc.get("configuration_json") or {}
        hnsw = config.get("hnsw") if isinstance(config, dict) else None
        hnsw = hnsw if isinstance(hnsw, dict) else {}
        metadata = doc.get("metadata")
        space = hnsw.get("space") or (metadata.get("hnsw:space") if isinstance(metadata, dict) else None) or "l2"
        if not isinstance(space, str) or space not in SPACES:
            raise ConnectorError("unsupported", f"chroma: collection space {str(space)[:40]!r}")
        if SPACES[space] != s.metric:
            raise ConnectorError("unsupported", f"chroma: the collection's space is {space!r}, metric says {s.metric}")
        dim = doc.get("dimension")
        self.dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and 0 < dim <= HTTP_MAX_DIM else None
        self.hnsw = dict(hnsw)
        self._base = f"{root}/collections/{quote(doc['id'], safe='')}"
        return self._base

    def refresh(self) -> None:
        """Describe the collection again at the next call (each cycle; a collection re-created)."""
        self._base = None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, rows: int = 0,
              row_bytes: int | None = None, dim: int | None = None) -> Any:
        """A call on the collection, its answer capped for ``rows`` rows of ``row_bytes`` (default: an id,
        a distance and a vector of the collection's dimension) or :data:`COUNT_BYTES` for none."""
        base = self._collection()
        dim = self.dim or dim or HTTP_MAX_DIM  # the collection's, else the query's (its rows must have it)
        if rows:
            per_row = HTTP_ROW_BYTES + dim * HTTP_BYTES_PER_NUMBER if row_bytes is None else row_bytes
            max_body = HTTP_ANSWER_FLOOR_BYTES + rows * per_row
            max_values = HTTP_VALUES_FLOOR + rows * (HTTP_VALUES_PER_ROW + dim)
        else:
            max_body, max_values = COUNT_BYTES, 16
        try:
            return self._request(method, base + path, body, max_body=max_body, max_values=max_values)
        except ConnectorError as exc:
            if exc.reason in REDESCRIBE or exc.reason == "unreachable":
                self.refresh()  # a collection re-created (new id, another dimension), a server back
            raise

    def _post(self, path: str, body: dict[str, Any], rows: int, row_bytes: int | None = None,
              dim: int | None = None) -> Any:
        return self._call("POST", path, body, rows=rows, row_bytes=row_bytes, dim=dim)

    def admit(self, filter_: Filter) -> Filter:
        out = []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            out.append((key, where_value(key, value)))
        return tuple(out)

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
        return parse_query(self._post("/query", body, rows=k, row_bytes=HTTP_ROW_BYTES), k)

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
            page = parse_get(self._post("/get", body, rows=s.page_rows, dim=q.size), self.dim or q.size, s.page_rows)
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
        wanted = list(dict.fromkeys(i for i in ids if chroma_id(i)))  # an id Chroma cannot hold is absent
        out: dict[str, np.ndarray] = {}
        step = self.settings.page_rows
        for start in range(0, len(wanted), step):
            chunk = wanted[start:start + step]
            doc = self._post("/get", {"ids": chunk, "include": ["embeddings"]}, rows=len(chunk))
            out.update(parse_get(doc, self.dim, len(chunk)))
        return out

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        total = self.count()
        if n <= 0 or total == 0:
            return []
        offsets = np.sort(np.random.default_rng().choice(total, size=min(n, total), replace=False)).tolist()
        rows: list[tuple[str, np.ndarray]] = []
        for offset in offsets:  # one row per offset: Chroma has no random sample
            rows.extend(parse_get(self._post("/get", {"limit": 1, "offset": offset, "include": ["embeddings"]},
                                             rows=1), self.dim, 1))
        return list(dict(rows).items())  # a row met twice (rows moved under a write) counts once

    def count(self) -> int:
        return parse_count(self._call("GET", "/count"))

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(i for i in ids if chroma_id(i)))
        if not wanted:
            return {}
        doc = self._post("/get", {"ids": wanted, "include": ["documents"]}, rows=len(wanted),
                         row_bytes=HTTP_ROW_BYTES + TEXT_BYTES)
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
