"""A Qdrant-shaped HTTP API in front of a real LanceDB table: the test bed of the HTTP template.

It answers the four calls monitor/index/connectors/qdrant.py makes with Qdrant's JSON shapes,
computed by LanceDB (``exact: true`` is ``bypass_vector_index()``; a cosine score is 1 - the
LanceDB distance). It stands in for a Qdrant server, which cannot run here; what it verifies is
the template's request and response handling, not Qdrant itself. ``body`` overrides every answer
with fixed bytes (the fuzz tests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import numpy as np


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.server.body is not None:
            return self._send(200, self.server.body)
        prefix = f"/collections/{self.server.collection}"
        if not self.path.startswith(prefix):
            return self._send(404, b'{"status": {"error": "Not found: Collection"}}')
        try:
            answer = self.server.answer(self.path[len(prefix):], json.loads(raw))
        except ValueError as exc:
            return self._send(400, json.dumps({"status": {"error": str(exc)}}).encode())
        return self._send(200, json.dumps({"result": answer, "status": "ok"}).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QdrantShaped(ThreadingHTTPServer):
    def __init__(self, table: Any, collection: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.table = table
        self.collection = collection
        self.body: bytes | None = None
        self.dim = int(table.schema.field("vector").type.list_size)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/points/search":
            vector = np.asarray(body["vector"], dtype=np.float32)
            if vector.size != self.dim:
                raise ValueError(f"Wrong input: Vector dimension error: expected dim: {self.dim}, got {vector.size}")
            query = self.table.search(vector).distance_type("cosine").limit(int(body["limit"]))
            must = (body.get("filter") or {}).get("must") or []
            if must:
                where = " AND ".join(f"{m['key']} = '{m['match']['value']}'" for m in must)
                query = query.where(where, prefilter=True)
            params = body.get("params") or {}
            if params.get("exact"):
                query = query.bypass_vector_index()
            elif params.get("hnsw_ef"):
                query = query.nprobes(max(1, int(params["hnsw_ef"]) // 10))
            result = query.select(["id", "_distance"]).to_arrow()
            return [{"id": i, "score": 1.0 - d, "version": 0} for i, d in
                    zip(result["id"].to_pylist(), result["_distance"].to_pylist(), strict=True)]
        if path == "/points":
            listed = ", ".join(f"'{i}'" for i in body["ids"])
            result = self.table.search().where(f"id IN ({listed})").select(["id", "vector"]).limit(
                len(body["ids"])).to_arrow()
            return [{"id": i, "vector": v, "payload": {}} for i, v in
                    zip(result["id"].to_pylist(), result["vector"].to_pylist(), strict=True)]
        if path == "/points/query":
            n = self.table.count_rows()
            offsets = sorted(np.random.default_rng().choice(n, size=min(int(body["limit"]), n), replace=False).tolist())
            result = self.table.take_offsets(offsets).select(["id", "vector"]).to_arrow()
            return {"points": [{"id": i, "vector": v} for i, v in
                               zip(result["id"].to_pylist(), result["vector"].to_pylist(), strict=True)]}
        if path == "/points/count":
            return {"count": self.table.count_rows()}
        raise ValueError(f"no route {path}")


@contextmanager
def serving(table: Any, collection: str = "docs") -> Iterator[QdrantShaped]:
    with running(QdrantShaped(table, collection)) as server:
        yield server


S = TypeVar("S", bound=ThreadingHTTPServer)


@contextmanager
def running(server: S) -> Iterator[S]:
    """``server`` answering in a thread of its own until the block ends."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
