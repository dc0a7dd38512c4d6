"""A real Chroma server for the index probes' tests: ``chroma run`` (the ``chromadb`` package, in its own
virtual environment ``.venv-chroma`` made by ``scripts/setup test``) on a free loopback port, and its
HTTP API (v2) to create collections and add rows. Nothing here stubs Chroma."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.broker import free_port
from tests.support.paths import REPO
from tests.support.waiting import wait_until

ROOT = "/api/v2/tenants/default_tenant/databases/default_database"


def chroma_binary() -> Path:
    path = REPO / ".venv-chroma" / "bin" / "chroma"
    if not path.exists():
        raise RuntimeError(f"{path} missing: run scripts/setup test (it makes .venv-chroma with chromadb)")
    return path


def call(url: str, method: str = "GET", body: Any = None, timeout: float = 60) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def _up(url: str) -> bool:
    try:
        call(f"{url}/api/v2/heartbeat", timeout=2)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def server() -> Iterator[str]:
    """``chroma run`` on a free loopback port with its data in a temporary directory; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="embmon-chroma-") as directory:
        port = free_port()
        log = Path(directory) / "chroma.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(chroma_binary()), "run", "--path", str(Path(directory) / "data"),
                                     "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _up(url), timeout=60, interval=0.2, message="chroma run",
                       on_timeout=lambda: log.read_text(errors="replace")[-2000:])
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def load(url: str, name: str, ids: Sequence[str], rows: np.ndarray, tenants: Sequence[str] | None = None,
         space: str = "cosine", ef_search: int = 100, max_neighbors: int = 16) -> str:
    """A collection ``name`` with HNSW settings, the rows added (metadata ``tenant``, document ``text of <id>``);
    returns its id."""
    hnsw = {"space": space, "ef_search": ef_search, "ef_construction": 100, "max_neighbors": max_neighbors}
    collection = call(f"{url}{ROOT}/collections", "POST", {"name": name, "configuration": {"hnsw": hnsw}})
    cid = collection["id"]
    for start in range(0, len(ids), 500):
        part = slice(start, start + 500)
        body: dict[str, Any] = {"ids": list(ids[part]), "embeddings": rows[part].astype(float).tolist(),
                                "documents": [f"text of {i}" for i in ids[part]]}
        if tenants is not None:
            body["metadatas"] = [{"tenant": t} for t in tenants[part]]
        call(f"{url}{ROOT}/collections/{cid}/add", "POST", body)
    return str(cid)


def update(url: str, cid: str, ids: Sequence[str], rows: np.ndarray) -> None:
    call(f"{url}{ROOT}/collections/{cid}/upsert", "POST", {"ids": list(ids), "embeddings": rows.astype(float).tolist()})


def delete(url: str, name: str) -> None:
    call(f"{url}{ROOT}/collections/{name}", "DELETE")


def description(name: str = "docs", dim: int = 4, space: str = "cosine") -> bytes:
    """What ``GET .../collections/{name}`` answers, in Chroma's shape (the connector's first call)."""
    return json.dumps({"id": f"{name}-0000", "name": name, "dimension": dim,
                       "configuration_json": {"hnsw": {"space": space, "ef_search": 100}}, "metadata": None}).encode()


class Front:
    """A :class:`~tests.support.hostile_http.HostileServer` in front of a Chroma server. While ``fault`` (a
    hostile behaviour) is set, it answers with it (every request, or with ``spare_description`` all but
    the collection's description); otherwise it forwards the request to ``upstream`` (a real ``chroma
    run``) and relays the answer. Without an upstream it answers the description with ``description``.
    A test sets and clears faults between cycles: the connector meets one server that misbehaves, then
    recovers."""

    def __init__(self, upstream: str | None = None, description: bytes | None = None):
        from tests.support import hostile_http

        self.upstream = upstream
        self.description = description
        self.fault: hostile_http.Behaviour | None = None
        self.spare_description = False
        self.server = hostile_http.HostileServer(self._answer)

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> Front:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()

    def _answer(self, conn: Any, stop: Any) -> None:
        received = self.server.requests[-1]
        method, target, _ = received.head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
        describing = method == "GET" and target.count("/") == 8  # /api/v2/tenants/t/databases/d/collections/c
        fault = self.fault
        if fault is not None and not (describing and self.spare_description):
            fault(conn, stop)
            return
        if self.upstream is None:
            status, body = (200, self.description or b"{}") if describing else (502, b"{}")
        else:
            request = urllib.request.Request(self.upstream + target, data=received.body or None, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    status, body = response.status, response.read()
            except urllib.error.HTTPError as exc:
                with exc:
                    status, body = exc.code, exc.read()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
