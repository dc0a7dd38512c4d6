"""The HTTP/1.1 server under the daemon's port: every resource a client can make it hold is bounded.

The standard library's threading WSGI server gave each connection a thread for as long as the
client kept it open, read headers with no timeout and no bound on their total, and listened with a
backlog of 5 (issue 18, point 7): 1,000 idle connections held 1,000 threads, 50 header floods
pushed the process to 1.9 GiB, and releasing thousands of held connections at once starved the
poll thread for up to 80 s. Here:

* one I/O thread (``embmon-http``) accepts, reads requests, writes responses and closes, all
  non-blocking through :mod:`selectors`: an idle or slow connection costs a descriptor and its
  buffer, never a thread, and closing thousands at once is a loop in that one thread (one thread's
  share of the GIL, whatever the number of connections);
* ``workers`` threads (``embmon-http-N``) run the WSGI application on complete requests only;
* at most ``max_connections`` are open. At the cap a new connection evicts the one that has waited
  longest without a request in a worker (as nginx reuses idle keep-alive connections), so a flood
  of idle connections cannot lock out a scrape; with none to evict the new one is closed at once;
* a request's head and body must arrive within ``read_timeout`` of the connection's start (or of
  the request's first byte on a kept-alive connection); a kept-alive connection may idle
  ``idle_timeout`` between requests; a response must be taken within ``write_timeout``;
* a request head over ``max_header_bytes`` or with more than 100 fields gets 431, a body over
  16 KiB gets 413 (no route reads a body; admin routes take query parameters), so the buffered
  bytes are at most ``max_connections`` × (``max_header_bytes`` + 16 KiB);
* TLS handshakes run non-blocking in the I/O thread, within the read timeout;
* the listen backlog is the kernel's ``somaxconn`` (as Go's net/http), not 5.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import io
import logging
import queue
import re
import resource
import selectors
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

MAX_BODY_BYTES = 16 * 1024
MAX_HEADER_FIELDS = 100  # as the standard library's http.client
DESCRIPTOR_RESERVE = 256  # descriptors the rest of the daemon may need besides the connections
_RECV_BYTES = 64 * 1024
_SEND_BYTES = 256 * 1024
_SWEEP_SECONDS = 0.25  # how often deadlines are checked
_ACCEPTS_PER_WAKE = 128
_ACCEPT_PAUSE_SECONDS = 0.1  # after EMFILE: let descriptors free up instead of spinning
_LINGER_SECONDS = 2.0  # after an error answer, read what the client still sends so it sees the answer
_LINGER_BYTES = 1 << 20
_WARN_EVERY_SECONDS = 60.0
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)\Z")
_REASONS = {
    400: "Bad Request", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
    431: "Request Header Fields Too Large", 501: "Not Implemented", 505: "HTTP Version Not Supported",
}

# connection states
_HANDSHAKE, _READING, _IDLE, _BUSY, _WRITING, _LINGER, _CLOSED = range(7)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold (settings: ``http.*``, docs/operations.md "Connection limits")."""

    max_connections: int
    max_header_bytes: int
    read_timeout: float
    idle_timeout: float
    write_timeout: float
    workers: int


@dataclass
class ConnectionCounts:
    """Tallies since start: connections accepted, evicted at the cap, refused, timed out."""

    accepted: int = 0
    evicted: int = 0
    refused: int = 0
    timed_out: int = 0
    rejected: dict[int, int] = field(default_factory=dict)  # error answers by status (400, 413, 431, ...)


class _Reject(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    content_length: int
    head_bytes: int  # the head's length in the buffer, terminator included
    keep_alive: bool
    expect_continue: bool
    body: bytes = b""


class _Conn:
    __slots__ = ("buf", "deadline", "events", "keep_alive", "linger", "lingered", "out", "peer", "request", "scanned",
                 "sent", "sock", "state")

    def __init__(self, sock: socket.socket, peer: Any, state: int, deadline: float):
        self.sock, self.peer, self.state, self.deadline = sock, peer, state, deadline
        self.buf = bytearray()
        self.scanned = 0  # how far the buffer was searched for the head's end
        self.request: _Request | None = None  # a parsed head whose body is still arriving
        self.out = b""
        self.sent = 0
        self.keep_alive = False
        self.linger = False
        self.lingered = 0
        self.events = 0


def listen_backlog() -> int:
    """The kernel's ``somaxconn`` (what Go's net/http listens with), 128 where it cannot be read."""
    try:
        with open("/proc/sys/net/core/somaxconn", encoding="ascii") as f:
            return max(128, min(int(f.read().strip()), 65535))
    except (OSError, ValueError):
        return 128


def ensure_descriptors(max_connections: int) -> None:
    """Raise the soft RLIMIT_NOFILE (up to the hard one) when it leaves too few descriptors for
    ``max_connections`` plus the rest of the daemon, as Go programs do at start-up; warn if it can't."""
    wanted = max_connections + DESCRIPTOR_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
    if raised > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        logger.info("raised the open-file limit from %d to %d for http.max_connections=%d", soft, raised,
                    max_connections)
    if raised < wanted:
        logger.warning("http.max_connections=%d wants about %d open files but the hard limit is %d: a flood "
                       "can use up the daemon's descriptors; lower http.max_connections", max_connections, wanted,
                       raised)


class BoundedHttpServer:
    """Serves ``app`` (WSGI) on ``host:port`` within ``limits``; :meth:`start` binds, :meth:`stop` closes."""

    def __init__(self, app: WsgiApp, host: str, port: int, limits: ConnectionLimits,
                 ssl_context: ssl.SSLContext | None = None, access_log: Callable[[str], None] | None = None):
        self._app = app
        self._access_log = access_log  # called with each request's line, status and body size
        self._host, self._port = host, port
        self.limits = limits
        self._ssl = ssl_context
        self.counts = ConnectionCounts()
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # open, not in a worker; oldest first
        self._open = 0
        self._work: queue.SimpleQueue[tuple[_Conn, _Request] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[_Conn] = queue.SimpleQueue()
        self._wake_r: socket.socket | None = None  # a worker's byte wakes the I/O thread
        self._wake_w: socket.socket | None = None
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._accept_paused_until = 0.0
        self._warned_at = 0.0
        self._warned_counts = (0, 0, 0)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1]) if self._listener is not None else self._port

    def open_connections(self) -> int:
        return self._open

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind and listen (OSError when the port cannot be bound), then start the threads."""
        ensure_descriptors(self.limits.max_connections)
        listener = socket.socket(socket.AF_INET6 if ":" in self._host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self._host, self._port))
            listener.listen(listen_backlog())
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._threads = [threading.Thread(target=self._serve, name="embmon-http", daemon=True)]
        self._threads += [threading.Thread(target=self._work_loop, name=f"embmon-http-{i}", daemon=True)
                          for i in range(self.limits.workers)]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._listener is None or self._stopping:
            return
        self._stopping = True
        self._wake()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        while True:  # answers finished after the I/O thread left
            try:
                conn = self._done.get_nowait()
            except queue.Empty:
                break
            _close_quietly(conn.sock)
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # full: a wake-up is already pending
            self._wake_w.send(b"\0")  # type: ignore[union-attr]

    # ------------------------------------------------------------------ the I/O thread
    def _serve(self) -> None:
        assert self._sel is not None
        next_sweep = time.monotonic() + _SWEEP_SECONDS
        try:
            while not self._stopping:
                for key, mask in self._sel.select(max(0.0, next_sweep - time.monotonic())):
                    if key.data is None:
                        self._accept()
                    elif key.data is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._ready(key.data, mask)
                self._take_back()
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + _SWEEP_SECONDS
        except Exception:  # a bug here must be seen, and must not take the daemon down
            logger.exception("the HTTP server's I/O loop failed; the port no longer answers")
        finally:
            self._shut()

    def _shut(self) -> None:
        assert self._sel is not None and self._listener is not None
        for conn in list(self._waiting):
            self._close(conn)
        while True:  # requests no worker took yet
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                _close_quietly(item[0].sock)
        for _ in range(self.limits.workers):
            self._work.put(None)
        self._sel.close()
        self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._pause_accepting()
                    return
                continue  # ECONNABORTED and the like: that client is gone
            self.counts.accepted += 1
            if self._open >= self.limits.max_connections and not self._evict_oldest():
                self.counts.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            now = time.monotonic()
            if self._ssl is not None:
                try:
                    sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (ssl.SSLError, OSError):
                    sock.close()
                    continue
                conn = _Conn(sock, peer, _HANDSHAKE, now + self.limits.read_timeout)
            else:
                conn = _Conn(sock, peer, _READING, now + self.limits.read_timeout)
            self._open += 1
            self._waiting[conn] = None
            self._watch(conn, selectors.EVENT_READ)

    def _pause_accepting(self) -> None:
        """Out of descriptors: free the oldest waiting connection and stop accepting for a moment
        (the listener would otherwise stay readable and spin this thread)."""
        assert self._sel is not None and self._listener is not None
        self._evict_oldest()
        if not self._accept_paused_until:
            self._sel.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE_SECONDS

    def _evict_oldest(self) -> bool:
        if not self._waiting:
            return False
        self.counts.evicted += 1
        self._close(next(iter(self._waiting)))
        return True

    def _ready(self, conn: _Conn, mask: int) -> None:
        if conn.state == _CLOSED:  # evicted earlier in this same batch of events
            return
        if conn.state == _HANDSHAKE:
            self._handshake(conn)
        elif conn.state in (_READING, _IDLE):
            self._read(conn)
        elif conn.state == _WRITING:
            self._write(conn)
        elif conn.state == _LINGER:
            self._drain(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (ssl.SSLError, OSError) as exc:
            logger.debug("TLS handshake with %s failed: %s", conn.peer, exc)
            self._close(conn)
            return
        conn.state = _READING  # the read timeout, counted from the connection's start, goes on
        self._watch(conn, selectors.EVENT_READ)
        self._read(conn)  # the request may have come with the handshake's last flight

    def _read(self, conn: _Conn) -> None:
        # an incomplete request holds less than this (head, its terminator, a body): room is never 0
        room = self.limits.max_header_bytes + MAX_BODY_BYTES + 16 - len(conn.buf)
        got = False
        while room > 0:
            try:
                chunk = conn.sock.recv(min(_RECV_BYTES, room))
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._close(conn)
                return
            if not chunk:
                self._close(conn)
                return
            got = True
            conn.buf += chunk
            room -= len(chunk)
            if not (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                break  # plain sockets: one recv per readiness event; TLS: drain what OpenSSL decrypted
        if got and conn.state == _IDLE:
            conn.state = _READING
            conn.deadline = time.monotonic() + self.limits.read_timeout
            self._waiting.move_to_end(conn)
        if got:
            self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Dispatch the buffered request once complete; answer an error at once."""
        try:
            request = conn.request
            if request is None:
                start = max(0, conn.scanned - 3)
                end = _HEAD_END.search(conn.buf, start)
                if end is None:
                    conn.scanned = len(conn.buf)
                    if len(conn.buf) > self.limits.max_header_bytes:
                        raise _Reject(431)
                    return
                if end.start() > self.limits.max_header_bytes:
                    raise _Reject(431)
                request = conn.request = _parse_head(bytes(conn.buf[: end.start()]), end.end())
                if request.expect_continue and len(conn.buf) < request.head_bytes + request.content_length:
                    with contextlib.suppress(OSError):  # a courtesy: the client sends the body anyway
                        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            total = request.head_bytes + request.content_length
            if len(conn.buf) < total:
                return
        except _Reject as reject:
            self.counts.rejected[reject.status] = self.counts.rejected.get(reject.status, 0) + 1
            conn.request = None
            conn.out, conn.keep_alive, conn.linger = _error_answer(reject.status), False, True
            self._start_writing(conn)
            return
        request.body = bytes(conn.buf[request.head_bytes : total])
        del conn.buf[:total]
        conn.scanned, conn.request = 0, None
        conn.state = _BUSY
        self._watch(conn, 0)
        del self._waiting[conn]
        self._work.put((conn, request))

    def _start_writing(self, conn: _Conn) -> None:
        conn.state = _WRITING
        conn.deadline = time.monotonic() + self.limits.write_timeout
        conn.sent = 0
        self._waiting[conn] = None
        self._waiting.move_to_end(conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        view = memoryview(conn.out)
        while conn.sent < len(view):
            try:
                # TLS must retry a write with the same bytes: the chunk depends on ``sent`` alone
                conn.sent += conn.sock.send(view[conn.sent : conn.sent + _SEND_BYTES])
            except (BlockingIOError, ssl.SSLWantWriteError):
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                return
            except OSError:
                self._close(conn)
                return
        conn.out, conn.sent = b"", 0
        now = time.monotonic()
        if conn.linger:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            conn.state, conn.deadline = _LINGER, now + _LINGER_SECONDS
            self._watch(conn, selectors.EVENT_READ)
        elif not conn.keep_alive or self._stopping:
            self._close(conn)
        else:
            conn.state, conn.deadline = _IDLE, now + self.limits.idle_timeout
            self._watch(conn, selectors.EVENT_READ)
            if conn.buf:  # a pipelined request came with the last one
                conn.state, conn.deadline = _READING, now + self.limits.read_timeout
                self._advance(conn)

    def _drain(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            chunk = b""
        conn.lingered += len(chunk)
        if not chunk or conn.lingered > _LINGER_BYTES:
            self._close(conn)

    def _take_back(self) -> None:
        """Answers the workers finished: write them from this thread."""
        while True:
            try:
                conn = self._done.get_nowait()
            except queue.Empty:
                return
            if self._stopping:
                self._close(conn)
            else:
                self._start_writing(conn)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._waiting if c.deadline <= now]:
            if conn.state != _LINGER:
                self.counts.timed_out += 1
            self._close(conn)
        if self._accept_paused_until and now >= self._accept_paused_until:
            assert self._sel is not None
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, None)  # type: ignore[arg-type]
        self._warn_under_pressure(now)

    def _warn_under_pressure(self, now: float) -> None:
        if now - self._warned_at < _WARN_EVERY_SECONDS:
            return
        counts = (self.counts.evicted, self.counts.refused, self.counts.timed_out)
        evicted, refused, timed_out = (a - b for a, b in zip(counts, self._warned_counts, strict=True))
        if evicted or refused:
            logger.warning(
                "http: at the cap of %d connections, %d evicted and %d refused (%d timed out) since the last "
                "report: a flood of idle connections? (docs/operations.md, Connection limits)",
                self.limits.max_connections, evicted, refused, timed_out,
            )
        self._warned_at, self._warned_counts = now, counts

    def _watch(self, conn: _Conn, events: int) -> None:
        assert self._sel is not None
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        if conn.state == _CLOSED:
            return
        conn.state = _CLOSED
        if conn.events:
            assert self._sel is not None
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
            conn.events = 0
        self._waiting.pop(conn, None)
        self._open -= 1
        _close_quietly(conn.sock)

    # ------------------------------------------------------------------ the workers
    def _work_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            conn, request = item
            conn.out, conn.keep_alive = self._answer(conn, request)
            self._done.put(conn)
            self._wake()

    def _answer(self, conn: _Conn, request: _Request) -> tuple[bytes, bool]:
        """Run the application on ``request``: the answer's bytes and whether to keep the connection."""
        answer: dict[str, Any] = {}
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            if exc_info is not None and answer:
                raise exc_info[1].with_traceback(exc_info[2])
            answer["status"], answer["headers"] = status, headers
            return chunks.append

        try:
            result = self._app(self._environ(conn, request), start_response)
            try:
                chunks.extend(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            status, headers, body = answer["status"], answer["headers"], b"".join(chunks)
        except Exception:  # an application bug answers 500, the server goes on
            logger.exception("http: the application failed on %s %s", request.method, request.target)
            status, headers, body = "500 Internal Server Error", [("Content-Type", "text/plain")], b"internal error\n"
        if self._access_log is not None:
            peer = conn.peer[0] if isinstance(conn.peer, tuple) else conn.peer
            self._access_log(f'{peer} "{request.method} {request.target} {request.version}" {status[:3]} {len(body)}')
        keep_alive = request.keep_alive and not self._stopping
        lines = [f"HTTP/1.1 {status}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection", "date")]
        lines += [f"Date: {email.utils.formatdate(usegmt=True)}", f"Content-Length: {len(body)}"]
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return (head if request.method == "HEAD" else head + body), keep_alive

    def _environ(self, conn: _Conn, request: _Request) -> dict[str, Any]:
        target = request.target
        if "://" in target:  # absolute form
            target = urllib.parse.urlsplit(target)._replace(scheme="", netloc="").geturl() or "/"
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": urllib.parse.unquote(path, "iso-8859-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": self._host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": request.version,
            "REMOTE_ADDR": str(conn.peer[0]) if isinstance(conn.peer, tuple) else "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if self._ssl is not None else "http",
            "wsgi.input": io.BytesIO(request.body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for name, value in request.headers:
            if "_" in name:
                continue  # as wsgiref: X_Forwarded would otherwise pass for X-Forwarded
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ


def _parse_head(head: bytes, head_bytes: int) -> _Request:
    """The request line and header fields (RFC 9112), or a :class:`_Reject` with the status to answer."""
    lines = head.split(b"\n")
    parts = lines[0].rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1]:
        raise _Reject(400)
    version = _VERSION.match(parts[2])
    if version is None:
        raise _Reject(400)
    if version.group(1) != b"1":
        raise _Reject(505)
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise _Reject(431)
    headers: list[tuple[str, str]] = []
    fields: dict[str, list[str]] = {}
    for line in lines[1:]:
        raw_name, sep, raw_value = line.rstrip(b"\r").partition(b":")
        if not sep or not _TOKEN.match(raw_name):  # also a folded line: it starts with whitespace
            raise _Reject(400)
        name, value = raw_name.decode("latin-1"), raw_value.strip(b" \t").decode("latin-1")
        headers.append((name, value))
        fields.setdefault(name.lower(), []).append(value)
    if "transfer-encoding" in fields:
        raise _Reject(501)
    lengths = {v.strip() for value in fields.get("content-length", []) for v in value.split(",")}
    if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
        raise _Reject(400)
    content_length = int(lengths.pop()) if lengths else 0
    if content_length > MAX_BODY_BYTES:
        raise _Reject(413)
    tokens = {t.strip().lower() for value in fields.get("connection", []) for t in value.split(",")}
    http11 = version.group(2) != b"0"
    keep_alive = "keep-alive" in tokens if not http11 else "close" not in tokens
    expect = any(v.strip().lower() == "100-continue" for v in fields.get("expect", []))
    return _Request(parts[0].decode("latin-1"), parts[1].decode("latin-1"), parts[2].decode("latin-1"), headers,
                    content_length, head_bytes, keep_alive, expect and http11)


def _error_answer(status: int) -> bytes:
    body = f"{status} {_REASONS[status]}\n".encode()
    return (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def _close_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
