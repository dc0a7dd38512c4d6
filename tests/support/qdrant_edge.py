"""Qdrant's own engine behind Qdrant's REST shapes: a loopback HTTP shim over ``qdrant-edge-py``.

``qdrant-edge-py`` embeds Qdrant's storage and search engine (segments, HNSW, payload indexes, the
filter planner) in-process, with no HTTP server of its own. This shim answers the calls
monitor/index/connectors/qdrant.py makes, in the JSON shapes of Qdrant's REST API, by handing each to
an :class:`qdrant_edge.EdgeShard`: the searches, filters, exact mode, retrieval, random sampling and
counts are Qdrant's, only the HTTP framing is ours. An engine error becomes what the server answers
for it: an unknown collection 404, a request the engine refuses (a dimension, an id that is neither an
integer nor a UUID) 400 with the engine's message (the HTTP framing is tests/support/qdrant_shaped.py's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.qdrant_shaped import _Handler, running


def _filter(doc: Any) -> Any:
    import qdrant_edge as q

    must = (doc or {}).get("must") or []
    if not must:
        return None
    return q.Filter(must=[q.FieldCondition(m["key"], match=q.MatchValue(m["match"]["value"])) for m in must])


class QdrantEdgeServer(ThreadingHTTPServer):
    """One collection: an EdgeShard (unnamed dense vector, cosine) answering over loopback HTTP."""

    def __init__(self, shard: Any, collection: str):
        super().__init__(("127.0.0.1", 0), _Handler)  # the shaped server's framing: 404, 400 for a ValueError
        self.body: bytes | None = None  # fixed bytes answering every call (none here)
        self.shard = shard
        self.collection = collection
        self.lock = threading.Lock()  # one engine call at a time (the shard is not shared across threads here)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, path: str, body: dict[str, Any]) -> Any:
        try:
            return self._answer(path, body)
        except Exception as exc:  # noqa: BLE001 - the engine's refusal, answered 400 with its message
            raise ValueError(f"Wrong input: {exc}") from None

    def _answer(self, path: str, body: dict[str, Any]) -> Any:
        import qdrant_edge as q

        with self.lock:
            if path == "/points/search":
                vector = body["vector"]
                vector = vector["vector"] if isinstance(vector, dict) else vector
                params = body.get("params") or {}
                found = self.shard.search(q.SearchRequest(
                    query=q.Query.Nearest([float(x) for x in vector]), limit=int(body["limit"]),
                    filter=_filter(body.get("filter")),
                    params=q.SearchParams(hnsw_ef=params.get("hnsw_ef"), exact=bool(params.get("exact"))),
                    with_vector=False, with_payload=False))
                return [{"id": p.id, "version": p.version, "score": p.score} for p in found]
            if path == "/points":
                records = self.shard.retrieve(list(body["ids"]), with_payload=False,
                                              with_vector=bool(body.get("with_vector")))
                return [{"id": r.id, "vector": r.vector, "payload": {}} for r in records]
            if path == "/points/query":
                if (body.get("query") or {}).get("sample") != "random":
                    raise ValueError("only the random sample query is served here")
                found = self.shard.query(q.QueryRequest(limit=int(body["limit"]), query=q.Sample.Random,
                                                        with_vector=bool(body.get("with_vector")), with_payload=False))
                return {"points": [{"id": p.id, "vector": p.vector, "payload": {}} for p in found]}
            if path == "/points/count":
                return {"count": self.shard.count(q.CountRequest(exact=bool(body.get("exact", True)),
                                                                 filter=_filter(body.get("filter"))))}
            if path == "/facet":
                response = self.shard.facet(q.FacetRequest(body["key"], limit=int(body.get("limit", 10)),
                                                           exact=bool(body.get("exact")),
                                                           filter=_filter(body.get("filter"))))
                return {"hits": [{"value": h.value, "count": h.count} for h in response.hits]}
        raise ValueError(f"no route {path}")


def load(path: Path, ids: Sequence[str], rows: np.ndarray, payload: dict[str, Sequence[Any]],
         keyword_fields: Sequence[str] = ()) -> Any:
    """A new EdgeShard at ``path`` (cosine, dimension of ``rows``) holding the rows as points with integer
    ids and ``payload`` columns, keyword indexes on ``keyword_fields``, optimized (HNSW built)."""
    import qdrant_edge as q

    config = q.EdgeConfig(vectors={"": q.EdgeVectorParams(size=int(rows.shape[1]), distance=q.Distance.Cosine)})
    shard = q.EdgeShard.create(str(path), config)
    points = [q.Point(int(ident), rows[i].astype(float).tolist(), {k: v[i] for k, v in payload.items()})
              for i, ident in enumerate(ids)]
    for start in range(0, len(points), 500):
        shard.update(q.UpdateOperation.upsert_points(points[start:start + 500]))
    for name in keyword_fields:
        shard.update(q.UpdateOperation.create_field_index(name, q.PayloadSchemaType.Keyword))
    shard.optimize()
    return shard


@contextmanager
def serving(shard: Any, collection: str = "docs") -> Iterator[QdrantEdgeServer]:
    with running(QdrantEdgeServer(shard, collection)) as server:
        yield server
