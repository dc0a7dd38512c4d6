"""A Qdrant-shaped HTTP API: the template for engines with an exact mode over HTTP.

It is tested against Qdrant's own engine (qdrant-edge-py, in-process) behind a loopback shim of the
test suite speaking Qdrant's REST shapes (tests/index/test_connector_suite.py), and against the same
shapes served from a LanceDB table (tests/index/test_qdrant_template.py); not against a Qdrant
server's own HTTP layer. It speaks:

* ``POST /collections/{c}/points/search`` with ``{"vector", "limit", "filter": {"must": [{"key",
  "match": {"value"}}]}, "params": {"hnsw_ef", "exact"}}`` -> ``{"result": [{"id", "score"}]}``
  (``exact: true`` is the brute force; a cosine score is a similarity, the distance is 1 - score);
* ``POST /collections/{c}/points`` with ``{"ids", "with_vector": true}`` -> ``{"result": [{"id",
  "vector"}]}``;
* ``POST /collections/{c}/points/query`` with ``{"query": {"sample": "random"}, "limit",
  "with_vector": true}`` -> ``{"result": {"points": [{"id", "vector"}]}}``;
* ``POST /collections/{c}/points/count`` with ``{"exact": true}`` -> ``{"result": {"count"}}``;
* ``POST /collections/{c}/facet`` with ``{"key", "limit", "exact": true}`` -> ``{"result": {"hits": [{"value",
  "count"}]}}`` (rows per scope value; 400 without a payload index on the key: ``unsupported``).

Another engine is the same four calls in its own shapes (docs/index.md, "Other engines"):
OpenSearch/Elasticsearch (``knn`` query vs ``script_score`` with ``cosineSimilarity``), Weaviate
(``nearVector`` vs ``flat`` index), Milvus (``search`` vs ``FLAT``/``params.ef`` large).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

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
    MAX_SCOPE_VALUES,
    OUTBOUND_REASONS,
    Answer,
    Connector,
    ConnectorError,
    Filter,
    FilterValue,
    Mode,
    Reason,
    check_number,
    check_query,
    check_text,
    integer_id,
    parse_count,
    parse_distance,
    parse_id,
    parse_rows,
    parse_scope_counts,
    parse_vector_rows,
)
from monitor.index.settings import QdrantSettings


def similarity_to_distance(metric: str, score: float) -> float:
    """Qdrant scores are similarities (higher is nearer) except Euclid, which is a distance."""
    if metric == "cosine":
        return 1.0 - score
    if metric == "dot":
        return -score
    return score


def point_id(ident: str) -> int | str | None:
    """An id as a Qdrant point id: ASCII digits within uint64 as an integer, a UUID as its canonical
    (lower-case, hyphenated) string, the form Qdrant answers with; None for any other id, which no
    collection can hold (Qdrant refuses the whole request that names one, so it is never sent).

    >>> point_id("42"), point_id("550E8400-E29B-41D4-A716-446655440000"), point_id("²36"), point_id("d3")
    (42, '550e8400-e29b-41d4-a716-446655440000', None, None)
    """
    number = integer_id(ident, "uint64")
    if number is not None:
        return number
    if len(ident) != 36:  # the hyphenated form only: the one Qdrant answers with, so the one an id can match
        return None
    try:
        return str(uuid.UUID(ident))
    except ValueError:
        return None


def match_value(key: str, value: FilterValue) -> FilterValue:
    """A filter value as Qdrant's ``match`` takes it (keyword, 64-bit integer, boolean), or ``bad_filter``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        check_text(key, value)
        return value
    if isinstance(value, float):
        raise ConnectorError("bad_filter", f"filter field {key!r}: match takes no fractional numbers")
    return check_number(key, value, "int64")


def parse_search(doc: Any, metric: str, k: int) -> Answer:
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), list):
        raise ConnectorError("bad_result", "a search answer without a result list")
    rows = []
    for point in doc["result"]:
        if not isinstance(point, dict):
            raise ConnectorError("bad_result", "a point that is not an object")
        rows.append((parse_id(point.get("id")), similarity_to_distance(metric, parse_distance(point.get("score")))))
    return parse_rows(rows, k)


def parse_points(doc: Any, dim: int | None, limit: int, nested: bool = False) -> list[tuple[str, np.ndarray]]:
    result = doc.get("result") if isinstance(doc, dict) else None
    if nested:
        result = result.get("points") if isinstance(result, dict) else None
    if not isinstance(result, list):
        raise ConnectorError("bad_result", "an answer without a list of points")
    rows = []
    for point in result:
        if not isinstance(point, dict):
            raise ConnectorError("bad_result", "a point that is not an object")
        rows.append((point.get("id"), point.get("vector")))
    return parse_vector_rows(rows, dim, limit)


def parse_facet(doc: Any) -> dict[str, int]:
    """A facet answer ``{"result": {"hits": [{"value", "count"}]}}`` as rows per value (values as ``str``)."""
    result = doc.get("result") if isinstance(doc, dict) else None
    hits = result.get("hits") if isinstance(result, dict) else None
    if not isinstance(hits, list):
        raise ConnectorError("bad_result", "a facet answer without a list of hits")
    rows = []
    for hit in hits:
        if not isinstance(hit, dict) or isinstance(hit.get("value"), (dict, list)):
            raise ConnectorError("bad_result", "a facet hit that is not {value, count}")
        rows.append((hit.get("value"), hit.get("count")))
    return parse_scope_counts(rows)


class QdrantConnector(Connector):
    engine = "qdrant"

    def __init__(self, settings: QdrantSettings):
        self.settings = settings
        self.metric = settings.metric
        self.filter_columns = frozenset(settings.filter_columns)
        self.dim: int | None = None
        self._base = f"{settings.url}/collections/{settings.collection}"
        self._key = settings.api_key_file.read_text().strip() if settings.api_key_file is not None else None
        if self._key is not None and not (self._key.isascii() and self._key.isprintable()):
            raise ValueError("index: qdrant api_key_file: the key holds characters a header cannot carry "
                             "(a line break, a control or non-ASCII character)")

    def _post(self, path: str, body: dict[str, Any], rows: int = 0, vectors: bool = False) -> Any:
        """One call through :mod:`monitor.outbound` (one deadline, no redirects), its answer capped by
        what was asked: ``rows`` points, with their vectors when ``vectors``."""
        dim = (self.dim or HTTP_MAX_DIM) if vectors else 0
        try:
            response = outbound.request(
                self._base + path, method="POST", body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", **({"api-key": self._key} if self._key else {})},
                timeout=self.call_timeout(self.settings.timeout_seconds),
                max_body=HTTP_ANSWER_FLOOR_BYTES + rows * (HTTP_ROW_BYTES + dim * HTTP_BYTES_PER_NUMBER),
            )
            if response.status >= 300:
                reason: Reason = HTTP_STATUS_REASONS.get(response.status, "other")
                if response.status == 400 and b"dimension" in response.body.lower():
                    reason = "dimension"
                raise ConnectorError(reason, f"HTTP {response.status} from {path}")
            return outbound.parse_json(response.body, HTTP_VALUES_FLOOR + rows * (HTTP_VALUES_PER_ROW + dim))
        except outbound.OutboundError as exc:
            raise ConnectorError(OUTBOUND_REASONS[exc.reason], f"{path}: {exc}") from None
        except ValueError:
            raise ConnectorError("bad_result", "an answer that is not JSON") from None

    def admit(self, filter_: Filter) -> Filter:
        out = []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            out.append((key, match_value(key, value)))
        return tuple(out)

    def _filter(self, filter_: Filter) -> dict[str, Any] | None:
        must = [{"key": key, "match": {"value": value}} for key, value in self.admit(filter_)]
        return {"must": must} if must else None

    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        if mode == "exact_quantized":
            raise ConnectorError("unsupported", "qdrant template: no exact search in the quantized space")
        q = check_query(query, self.dim)
        vector: Any = q.tolist() if self.settings.vector_name is None else {
            "name": self.settings.vector_name, "vector": q.tolist()}
        params: dict[str, Any] = {"exact": mode == "exact"}
        if mode == "served" and self.settings.hnsw_ef is not None:
            params["hnsw_ef"] = self.settings.hnsw_ef
        body: dict[str, Any] = {"vector": vector, "limit": k, "params": params,
                                "with_payload": False, "with_vector": False}
        where = self._filter(filter_)
        if where is not None:
            body["filter"] = where
        return parse_search(self._post("/points/search", body, rows=k), self.metric, k)

    def fetch(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        if not ids:
            return {}
        # the ids a collection can hold, as Qdrant writes them back -> as asked; the others are absent
        asked = {str(key): ident for ident in ids if (key := point_id(ident)) is not None}
        if not asked:
            return {}
        keys = [point_id(ident) for ident in asked.values()]
        doc = self._post("/points", {"ids": keys, "with_vector": True, "with_payload": False},
                         rows=len(keys), vectors=True)
        return {asked.get(ident, ident): vector for ident, vector in parse_points(doc, self.dim, len(keys))}

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        if n <= 0:
            return []
        doc = self._post("/points/query", {"query": {"sample": "random"}, "limit": n, "with_vector": True},
                         rows=n, vectors=True)
        return parse_points(doc, self.dim, n, nested=True)

    def scope_counts(self, field_name: str) -> dict[str, int]:
        """Qdrant's exact facet of ``field_name``: it needs a keyword (or integer, boolean) payload index
        on the field; without one Qdrant answers 400 and fill rates are ``unsupported``."""
        try:
            doc = self._post("/facet", {"key": field_name, "limit": MAX_SCOPE_VALUES + 1, "exact": True},
                             rows=MAX_SCOPE_VALUES + 1)
        except ConnectorError as exc:
            if str(exc).startswith("HTTP 400 "):  # no index to facet on (or a server before facets)
                raise ConnectorError("unsupported", f"qdrant: no facet of {field_name!r}: {exc}") from None
            raise
        return parse_facet(doc)

    def count(self) -> int:
        doc = self._post("/points/count", {"exact": True})
        result = doc.get("result") if isinstance(doc, dict) else None
        return parse_count(result.get("count") if isinstance(result, dict) else None)
