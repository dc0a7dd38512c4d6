"""The HTTP/1.1 server under the daemon's port: every resource a client can make it hold is bounded.

It replaced the standard library's threading WSGI server (why, and what that one let a client
hold: docs/operations.md, "Connection limits"). The parts:

* one I/O thread (``embmon-http``) accepts, reads requests, writes responses and closes, all
  non-blocking through :mod:`selectors`: an idle or slow connection costs a descriptor and its
  buffer, never a thread, and closing thousands at once is a loop in that one thread (one thread's
  share of the GIL, whatever the number of connections);
* HTTP/1.1 framing is h11's, as in uvicorn (docs/architecture.md, "The HTTP boundary"): a fresh
  ``h11.Connection`` per request parses the request line, fields, ``Content-Length`` and chunked
  bodies and frames the answer. This module finds where a head ends (to bound it, and to refuse
  bare LF line endings, which h11 accepts) and owns the I/O, caps, deadlines and TLS;
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
* malformed input is answered 400 (or 413, 431, 501, 505) and that connection closed; an exception
  while serving one connection closes that connection (with a 400 when nothing was answered yet).
  If the I/O loop itself stops, ``on_failure`` is called with the reason (by default: logged, and
  the process exits with status 70, so that an orchestrator restarts it; never a portless daemon);
* TLS handshakes run non-blocking in the I/O thread, within the read timeout;
* the listen backlog is the kernel's ``somaxconn`` (as Go's net/http), not 5.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.logs import RateLimitedLog
from monitor.server.framing import MAX_BODY_BYTES, Reject, Request, RequestReader, error_answer, wsgi_environ

logger = logging.getLogger(__name__)
_rate_limited = RateLimitedLog(logger, interval=60.0)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

DESCRIPTOR_RESERVE = 256  # descriptors the rest of the daemon may need besides the connections
LOOP_FAILED_EXIT_STATUS = 70  # sysexits' EX_SOFTWARE: the I/O loop stopped, the process must be restarted
_RECV_BYTES = 64 * 1024
_SEND_BYTES = 256 * 1024
_SWEEP_SECONDS = 0.25  # how often deadlines are checked
_ACCEPTS_PER_WAKE = 128
_ACCEPT_PAUSE_SECONDS = 0.1  # after EMFILE: let descriptors free up instead of spinning
_LINGER_SECONDS = 2.0  # after an error answer, read what the client still sends so it sees the answer
_LINGER_BYTES = 1 << 20
_WARN_EVERY_SECONDS = 60.0
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
    """Tallies since start: connections accepted, evicted at the cap, refused, timed out, failed."""

    accepted: int = 0
    evicted: int = 0
    refused: int = 0
    timed_out: int = 0
    failed: int = 0  # closed after an exception while serving them (a bug, logged)
    rejected: dict[int, int] = field(default_factory=dict)  # error answers by status (400, 413, 431, ...)


class _Conn:
    __slots__ = ("deadline", "events", "keep_alive", "linger", "lingered", "out", "peer", "reader", "sent", "sock",
                 "state")

    def __init__(self, sock: socket.socket, peer: Any, state: int, deadline: float, max_header_bytes: int):
        self.sock, self.peer, self.state, self.deadline = sock, peer, state, deadline
        self.reader = RequestReader(max_header_bytes)
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


def exit_process(reason: str) -> None:
    """What a server does by default when its I/O loop stops: the process exits, so it is restarted."""
    logger.critical("%s: exiting with status %d", reason, LOOP_FAILED_EXIT_STATUS)
    logging.shutdown()
    os._exit(LOOP_FAILED_EXIT_STATUS)


class BoundedHttpServer:
    """Serves ``app`` (WSGI) on ``host:port`` within ``limits``; :meth:`start` binds, :meth:`stop` closes.

    ``on_failure`` is called, in the I/O thread, with the reason if the I/O loop stops other than by
    :meth:`stop` (never because of a client's bytes: those end their own connection);
    :func:`exit_process` unless given."""

    def __init__(self, app: WsgiApp, host: str, port: int, limits: ConnectionLimits,
                 ssl_context: ssl.SSLContext | None = None, access_log: Callable[[str], None] | None = None,
                 on_failure: Callable[[str], None] | None = None):
        self._app = app
        self._access_log = access_log  # called with each request's line, status and body size
        self._host, self._port = host, port
        self.limits = limits
        self._ssl = ssl_context
        self.on_failure = on_failure or exit_process
        self.counts = ConnectionCounts()
        self._listener: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # open, not in a worker; oldest first
        self._open = 0
        self._work: queue.SimpleQueue[tuple[_Conn, Request] | None] = queue.SimpleQueue()
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
        failure: str | None = None
        try:
            self._loop()
        except Exception as exc:  # a bug outside any one connection: the port would be gone, say so
            logger.exception("the HTTP server's I/O loop failed")
            failure = f"the HTTP server's I/O loop failed ({type(exc).__name__}: {exc}); the port no longer answers"
        finally:
            try:
                self._shut()
            except Exception:
                logger.exception("http: closing the listener and connections failed")
        if failure is not None:
            self.on_failure(failure)

    def _loop(self) -> None:
        assert self._sel is not None
        next_sweep = time.monotonic() + _SWEEP_SECONDS
        while not self._stopping:
            for key, mask in self._sel.select(max(0.0, next_sweep - time.monotonic())):
                if key.data is None:
                    self._accept()
                elif key.data is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    self._guarded(key.data, self._ready, mask)
            self._take_back()
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + _SWEEP_SECONDS

    def _guarded(self, conn: _Conn, step: Callable[..., None], *args: Any) -> None:
        """``step(conn, *args)``; an exception ends that connection (with a 400 when nothing was answered)."""
        try:
            step(conn, *args)
        except Exception as exc:
            self.counts.failed += 1
            _rate_limited.warning(f"failed:{type(exc).__name__}", "http: closed a connection from %s after %s: %s",
                                  conn.peer, type(exc).__name__, exc)
            logger.debug("http: the exception that closed a connection", exc_info=True)
            if conn.state in (_READING, _IDLE):  # nothing answered yet (a refusal failing too ends here closed)
                self._guarded(conn, self._refuse, 400)
            else:
                self._close(conn)

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
            now = time.monotonic()
            try:
                sock.setblocking(False)
                if self._ssl is not None:
                    sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (ssl.SSLError, OSError):
                sock.close()
                continue
            state = _READING if self._ssl is None else _HANDSHAKE
            conn = _Conn(sock, peer, state, now + self.limits.read_timeout, self.limits.max_header_bytes)
            self._open += 1
            self._waiting[conn] = None
            self._guarded(conn, self._watch, selectors.EVENT_READ)

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
        room = self.limits.max_header_bytes + MAX_BODY_BYTES + 16 - conn.reader.buffered()
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
            conn.reader.feed(chunk)
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
            request = conn.reader.next_request()
            if request is None:
                if waiting := conn.reader.continue_answer():
                    with contextlib.suppress(OSError):  # a courtesy: the client sends the body anyway
                        conn.sock.send(waiting)
                return
        except Reject as reject:
            self._refuse(conn, reject.status)
            return
        conn.state = _BUSY
        self._watch(conn, 0)
        del self._waiting[conn]
        self._work.put((conn, request))

    def _refuse(self, conn: _Conn, status: int) -> None:
        """Answer ``status`` and close (after lingering a moment, so that the client reads the answer)."""
        self.counts.rejected[status] = self.counts.rejected.get(status, 0) + 1
        conn.out, conn.keep_alive, conn.linger = error_answer(status), False, True
        self._start_writing(conn)

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
            if conn.reader.next_cycle():  # a pipelined request came with the last one
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
                self._guarded(conn, self._start_writing)

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
            try:
                conn.out, conn.keep_alive = self._answer(conn, request)
            except Exception:  # never a lost connection, never a dead worker
                logger.exception("http: answering %s %s failed", request.method, request.target)
                conn.out, conn.keep_alive = error_answer(500), False
            self._done.put(conn)
            self._wake()

    def _answer(self, conn: _Conn, request: Request) -> tuple[bytes, bool]:
        """Run the application on ``request``: the answer's bytes and whether to keep the connection."""
        answer: dict[str, Any] = {}
        chunks: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            if exc_info is not None and answer:
                raise exc_info[1].with_traceback(exc_info[2])
            answer["status"], answer["headers"] = status, headers
            return chunks.append

        environ = wsgi_environ(request, (self._host, self.port), conn.peer, self._ssl is not None)
        try:
            result = self._app(environ, start_response)
            try:
                chunks.extend(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            status, body = answer["status"], b"".join(chunks)
            out = conn.reader.answer(request, status, answer["headers"], body, self._stopping)
        except Exception:  # an application bug (or an answer h11 refuses) answers 500, the server goes on
            logger.exception("http: the application failed on %s %s", request.method, request.target)
            status, body = "500 Internal Server Error", b"internal error\n"
            out = conn.reader.answer(request, status, [("Content-Type", "text/plain")], body, self._stopping)
        if self._access_log is not None:
            peer = conn.peer[0] if isinstance(conn.peer, tuple) else conn.peer
            self._access_log(f'{peer} "{request.method} {request.target} {request.version}" {status[:3]} {len(body)}')
        return out


def _close_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
