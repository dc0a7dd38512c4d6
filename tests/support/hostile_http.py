"""HTTP servers that misbehave on purpose, on a free loopback port, for the outbound client's tests.

Each :class:`HostileServer` reads one request per connection (its head, and a body as long as its
``Content-Length``), records it, and answers with a *behaviour*: a function that writes raw bytes to
the socket. The behaviours are what an endpoint, a proxy or an attacker can do to a client:

* :func:`answer`: a well-formed answer (the attacker's server in the redirect tests uses it);
* :func:`raw`: exactly these bytes, then close (the fuzz tests);
* :func:`drip`: a well-formed head, then the body one byte every ``every`` seconds;
* :func:`bloat`: a body of ``size`` bytes of ``[],`` (what costs a JSON parser most per byte);
* :func:`huge_headers`: header fields without end; :func:`endless_chunked`: chunks without end;
* :func:`redirect`: a 3xx to another URL;
* :func:`lie_length`: a ``Content-Length`` longer than the body, then close;
* :func:`slowloris_headers`: the head one byte every ``every`` seconds;
* :func:`close_mid_body`: half of the promised body, then close.

Every endless behaviour stops when the client goes away or the server is stopped, and at a bound.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Behaviour = Callable[[socket.socket, threading.Event], None]


@dataclass
class Received:
    head: bytes
    body: bytes

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode("latin-1")
        return None


@dataclass
class HostileServer:
    behaviour: Behaviour
    requests: list[Received] = field(default_factory=list)
    port: int = 0
    tls: ssl.SSLContext | None = None  # serve https with this server-side context
    _stop: threading.Event = field(default_factory=threading.Event)
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _conns: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> HostileServer:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept, "hostile-accept")
        return self

    def stop(self) -> None:
        """Stops accepting, cuts every connection and waits for the server's threads (a test that
        leaves one running fails: tests/conftest.py)."""
        self._stop.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
            self._listener.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(timeout=5)

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            self._spawn(self._serve, "hostile-conn", conn)

    def _serve(self, plain: socket.socket) -> None:
        conn = plain
        with contextlib.ExitStack() as closing:
            closing.callback(plain.close)
            conn.settimeout(10)
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(plain, server_side=True)
                    closing.callback(conn.close)
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 1 << 20:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                received = Received(head, body)
                length = int(received.header("content-length") or 0)
                while len(received.body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    received.body += chunk
                self.requests.append(received)
                self.behaviour(conn, self._stop)
            except OSError:  # the client went away: what a hostile server hopes for
                return


@contextlib.contextmanager
def serving(behaviour: Behaviour, tls: ssl.SSLContext | None = None) -> Iterator[HostileServer]:
    with HostileServer(behaviour, tls=tls) as server:
        yield server


def silent_listener() -> tuple[socket.socket, str]:
    """A socket that accepts connections (the kernel's backlog) and never says a word: a TLS
    handshake or an answer that never comes. Close it when done."""
    listener = socket.create_server(("127.0.0.1", 0))
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


def _head(status: int = 200, headers: tuple[tuple[str, str], ...] = (), length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Content-Type: application/json", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(body: bytes, status: int = 200, headers: tuple[tuple[str, str], ...] = ()) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(status, headers, len(body)) + body)
    return run


def raw(data: bytes) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
    return run


def drip(body: bytes, every: float) -> Behaviour:
    """The head at once, then ``body`` a byte at a time, ``every`` seconds apart."""
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(length=len(body)))
        for i in range(len(body)):
            if stop.wait(every):
                return
            conn.sendall(body[i:i + 1])
    return run


def slowloris_headers(every: float, fields: int = 1000) -> Behaviour:
    """The status line, then header bytes one at a time, ``every`` seconds apart."""
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for byte in b"X-Slow: a\r\n" * fields:
            if stop.wait(every):
                return
            conn.sendall(bytes([byte]))
    return run


def bloat(size: int, unit: bytes = b"[],", declare: bool = True) -> Behaviour:
    """``[`` then ``size`` bytes of ``unit`` then ``[]]``: valid JSON, as dear to parse as bytes come."""
    def run(conn: socket.socket, stop: threading.Event) -> None:
        block = unit * (65536 // len(unit))
        count = size // len(block)
        conn.sendall(_head(length=1 + count * len(block) + 3 if declare else None))
        conn.sendall(b"[")
        for _ in range(count):
            if stop.is_set():
                return
            conn.sendall(block)
        conn.sendall(b"[]]")
    return run


def huge_headers(limit: int = 64 << 20) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Bloat: " + b"a" * 1000 + b"\r\n"
        for _ in range(limit // len(line)):
            if stop.is_set():
                return
            conn.sendall(line * 64)
    return run


def endless_chunked(limit: int = 256 << 20) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b"[]," * 21845 + b"[\r\n"
        for _ in range(limit // 65536):
            if stop.is_set():
                return
            conn.sendall(chunk)
    return run


def redirect(location: str, status: int = 302) -> Behaviour:
    return answer(b"", status, (("Location", location),))


def lie_length(body: bytes, claimed: int) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(length=claimed) + body)
    return run


def close_mid_body(body: bytes) -> Behaviour:
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(length=len(body)) + body[: len(body) // 2])
    return run
