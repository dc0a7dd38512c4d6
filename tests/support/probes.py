"""Test support for the retrieval probes: a real HTTP search server and an in-memory source.

``SearchServer`` is a stdlib ``http.server`` on a free loopback port that answers
``POST /search {"vector": [...], "k": n}`` with exact cosine k-NN over known vectors, in
Elasticsearch's response shape (``hits.hits[*]._id``). ``mode`` makes it misbehave on purpose:
``slow`` sleeps before answering, ``garbage`` answers with bytes that are not JSON, ``wrong_shape``
answers JSON without the ids path.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from monitor.sources.base import Source, SourceMessage


def cosine_ranking(query: np.ndarray, documents: np.ndarray, k: int) -> list[int]:
    """Exact cosine top-k in float64, ties by index (the reference the tests compare against)."""
    q = np.asarray(query, dtype=np.float64)
    d = np.asarray(documents, dtype=np.float64)
    scores = (d / np.linalg.norm(d, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    order = np.lexsort((np.arange(len(scores)), -scores))
    return order[:k].tolist()


class SearchServer:
    def __init__(self, ids: Sequence[str], vectors: np.ndarray, mode: str = "ok", delay: float = 0.0):
        self.ids = list(ids)
        self.vectors = np.asarray(vectors, dtype=np.float64)
        self.mode = mode
        self.delay = delay
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                server.requests.append(body)
                if server.mode == "slow" or server.delay:
                    time.sleep(server.delay)  # the point: a search endpoint this slow
                if server.mode == "garbage":
                    payload = b"<html>502 Bad Gateway</html>"
                elif server.mode == "wrong_shape":
                    payload = json.dumps({"results": []}).encode()
                else:
                    top = cosine_ranking(np.asarray(body["vector"]), server.vectors, int(body["k"]))
                    hits = [{"_id": server.ids[i], "_score": 1.0} for i in top]
                    payload = json.dumps({"hits": {"total": len(hits), "hits": hits}}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout tests)
                    pass

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/search"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="search-server", daemon=True)

    def __enter__(self) -> SearchServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class ListSource(Source):
    """Serves prepared messages once, then nothing (an in-memory Kafka stand-in)."""

    name = "list"

    def __init__(self, messages: Sequence[SourceMessage] = (), batch: int = 500):
        self._pending = list(messages)
        self._lock = threading.Lock()
        self._batch = batch

    def poll(self, timeout: float) -> list[SourceMessage]:
        with self._lock:
            out, self._pending = self._pending[: self._batch], self._pending[self._batch :]
        if not out:
            time.sleep(min(timeout, 0.05))  # the point: an idle poll blocks for a while, as Kafka's does
        return out


def json_messages(kind: str, events: Sequence[dict[str, Any]]) -> list[SourceMessage]:
    return [SourceMessage(json.dumps(e).encode(), (), kind) for e in events]  # type: ignore[arg-type]


def paused_jobs(monitor: Any) -> list[str]:
    return [job.id for job in monitor.jobs.scheduler.get_jobs() if job.next_run_time is None]


def window_of(vectors: np.ndarray, ids: Sequence[str], model: str = "m", stream: str = "documents") -> Any:
    """A real window snapshot whose sample holds every row (reservoir at least the row count)."""
    from monitor.decoding.records import EmbeddingBatch
    from monitor.state.window import SlidingWindow

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    window = SlidingWindow(vectors.shape[1], window_seconds=3600, subwindows=1, reservoir_size=max(10, len(vectors)))
    window.add(EmbeddingBatch(model, stream, vectors, ids=tuple(ids)), now=1000.0)
    return window.snapshot(now=1000.0)


def probe_context(settings: Any, windows: dict[tuple[str, str], Any] | None = None, clock: Any = time.time) -> Any:
    """A MonitorContext for driving the probe component directly (no daemon)."""
    from pathlib import Path

    from monitor.component import MonitorContext
    from monitor.state.registry import StateRegistry

    published = dict(windows or {})
    return MonitorContext(settings=settings, registry=StateRegistry(settings), clock=clock,
                          state_dir=Path(settings.state_dir), latest_windows=lambda: published)


def collect(component: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The component's metric families as scrape-style samples, through a fresh registry."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    class _Adapter:
        def collect(self) -> Any:
            return component.collect()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Adapter())  # type: ignore[arg-type]
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out
