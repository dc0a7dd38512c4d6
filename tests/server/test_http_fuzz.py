"""Outside bytes at the HTTP port: what the hand-written parser died of, fuzzing
over raw sockets (plain and TLS), and what happens when the I/O loop itself stops.

The fuzz drives the daemon's real exporter (``HttpServer``: routes, admin token, the bounded server
under it) in this process, over loopback: hypothesis generates request heads and bodies from the
grammar (methods, targets in every form with IPv6 literals, versions, fields with odd bytes,
Content-Length and Transfer-Encoding variants, chunked bodies, pipelining) and arbitrary bytes. A
case sends its bytes, half-closes (TLS: a close_notify) and reads until the server closes. Every
answer is a status line the rules allow, never a 500; no connection ends in an exception; after
each batch ``/healthz`` answers 200, the server's threads are the ones it started with and the
process's open files are back where they were. The fast tier runs about 700 cases, the slow one
12,000 (the counts are printed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge

from monitor.server import framing
from monitor.server.exporter import HttpServer
from monitor.server.http_server import LOOP_FAILED_EXIT_STATUS, BoundedHttpServer, ConnectionLimits
from monitor.server.security import AuthLimits
from tests.support import daemons
from tests.support.tls import self_signed
from tests.support.waiting import wait_until

ALLOWED = {100, 200, 400, 401, 403, 404, 405, 413, 431, 501, 505}  # never 500: malformed input is the client's
STATUS = re.compile(rb"HTTP/1\.1 (\d{3}) ")
LIMITS = ConnectionLimits(max_connections=64, max_header_bytes=8192, read_timeout=5.0, idle_timeout=5.0,
                          write_timeout=5.0, workers=2)

# ---------------------------------------------------------------------- the grammar
def mostly(usual: st.SearchStrategy[bytes], odd: st.SearchStrategy[bytes], percent: int) -> st.SearchStrategy[bytes]:
    """``usual`` in ``percent`` % of draws, else ``odd``: enough well-formed parts to reach the deeper rules."""
    return st.integers(0, 99).flatmap(lambda n: usual if n < percent else odd)


EOL = mostly(st.just(b"\r\n"), st.sampled_from([b"\n", b"\r", b"\r\r\n", b"\n\r", b" \r\n"]), 97)
methods = mostly(
    st.sampled_from([b"GET", b"GET", b"HEAD", b"POST", b"PUT", b"OPTIONS", b"CONNECT", b"TRACE"]),
    st.one_of(st.sampled_from([b"get", b"G ET", b"", b"GET\x00"]), st.binary(min_size=1, max_size=8)), 92,
)
targets = mostly(
    st.sampled_from([
        b"/", b"/metrics", b"/healthz", b"/readyz", b"/admin/baseline?model=m&stream=s", b"/admin/x?token=t", b"*",
        b"http://h/metrics", b"https://h:1/healthz?x=1", b"http://[::1]:9100/metrics", b"http://[::1/metrics",
        b"http://[::1]x/metrics", b"http://[fe80::1%25eth0]/healthz", b"http://[v1.x]/", b"http://]/",
        b"http://[::1]:99999999999/", b"//h/metrics", b"h:80", b"/%zz", b"/%00", b"/\xff", b"/" + b"a" * 9000,
    ]),
    st.one_of(st.binary(max_size=30).map(lambda path: b"/" + path),
              st.builds(lambda host, path: b"http://" + host + b"/" + path, st.binary(max_size=16),
                        st.binary(max_size=16))),
    85,
)
versions = mostly(
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0"]),
    st.one_of(st.sampled_from([b"HTTP/1.9", b"HTTP/2.0", b"HTTP/0.9", b"http/1.1", b"HTTP/11", b"HTTP/1.", b""]),
              st.binary(max_size=9)),
    92,
)
names = mostly(
    st.sampled_from([b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Expect", b"Authorization",
                     b"Accept-Encoding", b"Accept", b"X_Forwarded", b"CONTENT-LENGTH", b"X-A"]),
    st.one_of(st.sampled_from([b" Host", b"Host ", b""]), st.binary(max_size=10)), 92,
)
values = mostly(
    st.sampled_from([
        b"h", b"0", b"5", b"16385", b"\xb2", b"1" * 5000, b"1" * 21, b"-1", b"1,1", b"1, 2", b" 5 ", b"0x10",
        b"chunked", b"gzip, chunked", b"chunked, gzip", b"Chunked", b"identity", b"close", b"keep-alive",
        b"100-continue", b"Bearer t", b"Bearer wrong", b"Basic Zm9vOmJhcg==", b"gzip", b"*/*", b"[::1]", b"[::1",
        b"h:99999999999999999999", b"\x80\xff",
    ]),
    st.one_of(st.sampled_from([b"a\rb", b"a\nb", b"a\x00b", b"a\r\n b"]), st.binary(max_size=24)), 85,
)
separators = mostly(st.just(b": "), st.sampled_from([b":", b" : ", b":\t", b"", b"::"]), 95)
fields = st.lists(st.tuples(names, separators, values), max_size=6)


@st.composite
def chunked(draw: st.DrawFn) -> bytes:
    """A chunked body: sizes right, wrong, huge or not hex; extensions, trailers, a last chunk or none."""
    out = b""
    for data in draw(st.lists(st.binary(max_size=40), max_size=4)):
        size = draw(st.sampled_from([b"%x" % len(data)] * 4 + [b"%X" % len(data), b"%x" % (len(data) + 1), b"f" * 17,
                                                               b"-1", b"zz", b"", b" 1"]))
        ext = draw(st.sampled_from([b""] * 4 + [b";a=b", b"; a", b";\xff", b";" + b"e" * 200]))
        out += size + ext + draw(EOL) + data + draw(EOL)
    if draw(st.booleans()):
        trailers = b"".join(n + b": " + v + b"\r\n" for n, _, v in draw(fields))
        out += b"0\r\n" + trailers + draw(EOL)
    return out


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One request (sometimes two, pipelined), mostly well formed enough to reach h11's deeper rules."""
    eol = draw(EOL)
    head = draw(methods) + b" " + draw(targets) + b" " + draw(versions) + eol
    framing_kind = draw(st.sampled_from(["none", "length", "length", "wrong length", "chunked", "both"]))
    body = draw(chunked()) if framing_kind in ("chunked", "both") else draw(st.binary(max_size=64))
    extra = []
    if draw(st.integers(0, 9)) < 8:
        extra.append((b"Host", b": ", draw(st.sampled_from([b"h", b"127.0.0.1:9", b"[::1]:9", b"[::1"]))))
    if framing_kind in ("length", "both"):
        extra.append((b"Content-Length", b": ", b"%d" % len(body)))
    if framing_kind == "wrong length":
        extra.append((b"Content-Length", b": ", b"%d" % (len(body) + draw(st.sampled_from([-1, 1, 10**6])))))
    if framing_kind in ("chunked", "both"):
        extra.append((b"Transfer-Encoding", b": ", b"chunked"))
    lines = draw(st.permutations(extra + draw(fields)))
    head += b"".join(name + sep + value + eol for name, sep, value in lines) + draw(EOL)
    request = head + body
    if draw(st.integers(0, 9)) == 0:
        request += draw(requests())
    return request


arbitrary = st.binary(max_size=2048)
after_a_request_line = st.builds(lambda tail, end: b"GET /healthz HTTP/1.1\r\nHost: h\r\n" + tail + end,
                                 st.binary(max_size=512), st.sampled_from([b"", b"\r\n\r\n"]))


# ---------------------------------------------------------------------- the port under test
class Port:
    """The daemon's exporter on a free port (TLS with ``cert``), and a client that sends a case's bytes."""

    def __init__(self, server: HttpServer, client: ssl.SSLContext | None):
        self.server, self.client = server, client
        self.cases = 0
        self.statuses: Counter[int] = Counter()

    def exchange(self, data: bytes, handshake: bool = True) -> bytes:
        """Send ``data``, half-close, read until the server closes; fails if it neither answers nor closes."""
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=20) as raw:
            sock: socket.socket = raw
            if self.client is not None and handshake:
                sock = self.client.wrap_socket(raw, server_hostname="localhost")
            try:
                # the server may answer and close before it all went (ENOTCONN: a handshake it refused)
                with contextlib.suppress(ConnectionError, OSError):
                    sock.sendall(data)
                    _half_close(sock)
                out = b""
                with contextlib.suppress(ConnectionError, ssl.SSLError):
                    while chunk := sock.recv(65536):
                        out += chunk
            finally:
                if sock is not raw:
                    sock.close()
        return out

    def check(self, data: bytes, handshake: bool = True) -> None:
        out = self.exchange(data, handshake)
        self.cases += 1
        if not handshake:  # bytes where a ClientHello belongs: no HTTP answer, only a TLS alert at most
            assert not out.startswith(b"HTTP/"), out[:200]
            return
        codes = [int(code) for code in STATUS.findall(out)]
        assert not out or out.startswith(b"HTTP/1.1 "), out[:300]
        assert set(codes) <= ALLOWED, (data[:300], out[:600])
        self.statuses.update(codes or [0])

    def healthz(self) -> int:
        context = self.client if self.client is not None else None
        scheme = "https" if context is not None else "http"
        with urllib.request.urlopen(f"{scheme}://localhost:{self.server.port}/healthz", timeout=10,
                                    context=context) as response:
            return int(response.status)


def _half_close(sock: socket.socket) -> None:
    """No more bytes from the client: a FIN (over TLS too, without a close_notify, which the server
    takes as the end; ``SSLSocket.shutdown`` would drop the TLS state the answer is still read with)."""
    socket.socket.shutdown(sock, socket.SHUT_WR)


class ErrorLog(logging.Handler):
    """Records at ERROR and above from the server's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def server_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("embmon-http"))


@contextlib.contextmanager
def port(tmp_path: Path, tls: bool) -> Iterator[Port]:
    registry = CollectorRegistry(auto_describe=True)
    Gauge("embmon_fuzz_gauge", "a gauge for /metrics to show", ["model"], registry=registry).labels("m").set(1.5)
    server_context, client_context = None, None
    if tls:
        cert, key = self_signed(tmp_path)
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(str(cert), str(key))
        client_context = ssl.create_default_context(cafile=str(cert))
    server = HttpServer(registry, "127.0.0.1", 0, health=lambda: (True, "ok"), readiness=lambda: (True, "ready"),
                        limits=LIMITS, auth_limits=AuthLimits(5, 60.0, 1), ssl_context=server_context,
                        admin_token="t")  # noqa: S106
    server.add_route("/admin/baseline", lambda env: (200, "text/plain", env["QUERY_STRING"].encode()),
                     methods=("GET", "POST"))
    errors = ErrorLog()
    logging.getLogger("monitor.server").addHandler(errors)
    server.start()
    try:
        target = Port(server, client_context)
        assert target.healthz() == 200
        yield target
        assert not errors.records, [r.getMessage() for r in errors.records]
    finally:
        server.stop()
        logging.getLogger("monitor.server").removeHandler(errors)


def fuzz(target: Port, strategy: st.SearchStrategy[bytes], examples: int, handshake: bool, batch: int) -> None:
    """``examples`` cases, the same on every run (a seed per batch: batches of one strategy differ)."""
    @seed(batch)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def case(data: bytes) -> None:
        target.check(data, handshake)

    case()


def batches(target: Port, runs: list[tuple[st.SearchStrategy[bytes], int, bool]]) -> None:
    """Each run: ``examples`` cases from the strategy (``handshake`` False: raw bytes at a TLS port),
    then the port must answer and hold what it held before the batch."""
    # other tests' threads (a kafka client's, a hung resolver's) may still be ending: the bound is
    # against what the process held when this test began, not against the server's threads alone
    threads, files, baseline = server_threads(), open_files(), threading.active_count()
    for batch, (strategy, examples, handshake) in enumerate(runs):
        before = target.cases
        fuzz(target, strategy, examples, handshake, batch)
        assert target.healthz() == 200
        bounded = target.server.server
        wait_until(lambda: bounded.open_connections() == 0, timeout=30, message="every fuzz connection closed")  # noqa: B023
        assert bounded.counts.failed == 0
        assert server_threads() == threads and threading.active_count() <= baseline + 8, threading.enumerate()
        assert open_files() <= files + 2, (open_files(), files)
        print(f"\n{target.cases - before} cases ({'TLS' if target.client else 'plain'}, "
              f"{'handshake' if handshake else 'no handshake'}); statuses so far {dict(target.statuses)}; "
              f"rejected {bounded.counts.rejected}; threads {len(threads)}; open files {files} -> {open_files()}")


# ---------------------------------------------------------------------- fuzz: fast tier and slow tier
def test_fuzzed_requests_plain(tmp_path: Path) -> None:
    # 150 cases in the fast tier (500 took 3.9 s of CPU, up to 8.8 s under its workers); the slow tier's
    # below send 9,500 and 2,500
    with port(tmp_path, tls=False) as target:
        batches(target, [(requests(), 90, True), (arbitrary, 30, True), (after_a_request_line, 30, True)])
        assert target.cases == 150


@pytest.mark.slow  # 2.7 s of CPU; the plain fuzz stays in the fast tier
def test_fuzzed_requests_tls(tmp_path: Path) -> None:
    with port(tmp_path, tls=True) as target:
        batches(target, [(requests(), 120, True), (arbitrary, 40, True), (arbitrary, 40, False)])
        assert target.cases == 200


@pytest.mark.slow
def test_ten_thousand_fuzzed_requests_plain(tmp_path: Path) -> None:
    with port(tmp_path, tls=False) as target:
        batches(target, [(requests(), 2500, True)] * 3 + [(arbitrary, 1000, True), (after_a_request_line, 1000, True)])
        assert target.cases == 9500


@pytest.mark.slow
def test_thousands_of_fuzzed_requests_tls(tmp_path: Path) -> None:
    with port(tmp_path, tls=True) as target:
        batches(target, [(requests(), 1500, True), (arbitrary, 500, True), (arbitrary, 500, False)])
        assert target.cases == 2500


# ---------------------------------------------------------------------- one connection's exception
def test_an_exception_while_serving_one_connection_closes_only_that_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parse = framing._request

    def broken(event: object) -> framing.Request:
        request = parse(event)  # type: ignore[arg-type]
        if request.path == "/boom":
            raise RuntimeError("a bug in reading this request")
        return request

    monkeypatch.setattr(framing, "_request", broken)
    with port(tmp_path, tls=False) as target:
        out = target.exchange(b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in out
        assert target.server.server.counts.failed == 1
        assert target.healthz() == 200


def test_when_the_io_loop_fails_the_owner_is_told_why() -> None:
    reasons: list[str] = []
    server = BoundedHttpServer(lambda environ, start: [], "127.0.0.1", 0, LIMITS, on_failure=reasons.append)

    def sweep(now: float) -> None:
        raise OSError("the selector broke")

    server._sweep = sweep  # type: ignore[method-assign]
    server.start()
    try:
        wait_until(lambda: bool(reasons), timeout=10, message="on_failure called")
        assert "I/O loop failed (OSError: the selector broke)" in reasons[0]
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass  # the listener is closed: the owner must exit, not linger portless
    finally:
        server.stop()


# ---------------------------------------------------------------------- the daemon process
ISSUE_27 = {
    "Content-Length: \\xb2": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
    "Content-Length of 5,000 digits": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"7" * 5000 + b"\r\n\r\n",
    "http://[::1/metrics": b"GET http://[::1/metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    "bare CR in a value": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n",
    "bare LF": b"GET /metrics HTTP/1.1\nHost: x\n\n",
    "HTTP/1.9": b"GET /metrics HTTP/1.9\r\nHost: x\r\n\r\n",
    "no Host": b"GET /metrics HTTP/1.1\r\n\r\n",
}


def raw_exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def healthz(port: int, path: str = "/healthz") -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


# the I/O loop breaks, outside any connection, once the file the test names exists
BREAK_THE_LOOP = """
import os, pathlib
from monitor.server.http_server import BoundedHttpServer
_sweep = BoundedHttpServer._sweep
def _broken_sweep(self, now):
    if pathlib.Path(os.environ["HTTP_LOOP_BREAKS_AT"]).exists():
        raise RuntimeError("injected: the I/O loop broke")
    _sweep(self, now)
BoundedHttpServer._sweep = _broken_sweep
"""


@pytest.mark.slow  # 5.3 s in all and 2.4 s of CPU in the daemon; the fuzzed requests stay in the fast tier
def test_a_daemon_answers_the_parser_killers_with_400_and_exits_70_only_when_its_io_loop_breaks(tmp_path: Path) -> None:
    """Each request the hand-written parser died of (three times: one used to close the port for good) gets 400 and the
    port serves on, with nothing logged at ERROR; then a bug in the loop itself (injected) ends the
    process with status 70, the reason in its log, after a clean shutdown."""
    trigger = tmp_path / "break"
    env = {"EMBMON_SOURCE": "synthetic", "EMBMON_SYNTHETIC__MODELS": '[{"name": "m", "dim": 8}]',
           "EMBMON_HTTP__HOST": "127.0.0.1", "EMBMON_CHECKPOINT__ENABLED": "true",
           "HTTP_LOOP_BREAKS_AT": str(trigger)}
    with daemons.process("--state-dir", str(tmp_path / "state"), "--refresh-seconds", "0.5",
                         log=tmp_path / "daemon.log", env=env, prelude=BREAK_THE_LOOP) as proc:
        wait_until(lambda: proc.returncode is not None or healthz(proc.port, "/readyz") == 200, timeout=60,
                   message="the daemon is ready", on_timeout=lambda: proc.output()[-3000:])
        for name, request in ISSUE_27.items():
            for _ in range(3):
                out = raw_exchange(proc.port, request)
                assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (name, out[:200])
            assert healthz(proc.port) == 200, name
        assert "Traceback" not in proc.output() and " ERROR " not in proc.output(), proc.output()[-3000:]
        trigger.touch()
        assert proc.wait(timeout=60) == LOOP_FAILED_EXIT_STATUS
    log = proc.output()
    assert "the HTTP server's I/O loop failed (RuntimeError: injected: the I/O loop broke)" in log, log[-3000:]
    assert f"shutting down, to exit with status {LOOP_FAILED_EXIT_STATUS}" in log
    assert "embedding-monitor stopped" in log  # a clean shutdown: the checkpoint written, offsets committed
    assert healthz(proc.port) == 0


def run_reader(data: bytes, max_header_bytes: int = 8192) -> framing.Request | None:
    reader = framing.RequestReader(max_header_bytes)
    reader.feed(data)
    return reader.next_request()


def test_what_h11_lets_by_is_refused_here() -> None:
    """The framing module's own rules, without a socket: each h11 would have accepted."""
    ok = run_reader(b"GET http://[::1]:9/metrics?a=b HTTP/1.1\r\nHost: h\r\n\r\n")
    assert ok is not None and (ok.path, ok.query, ok.version) == ("/metrics", "a=b", "HTTP/1.1")
    refused: Callable[[bytes], int] = lambda data: _status(lambda: run_reader(data))  # noqa: E731
    assert refused(b"GET / HTTP/1.1\nHost: h\r\n\r\n") == 400
    assert refused(b"GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n") == 400  # obs-fold: h11 unfolds it
    assert run_reader(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n\n b") is not None  # not in a body
    assert refused(b"GET / HTTP/1.9\r\nHost: h\r\n\r\n") == 400
    assert refused(b"GET / HTTP/3.0\r\n\r\n") == 505
    assert refused(b"GET http://[::1/metrics HTTP/1.1\r\nHost: h\r\n\r\n") == 400
    assert refused(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n") == 400
    assert refused(b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"a" * 9000 + b"\r\n\r\n") == 431


def _status(call: Callable[[], object]) -> int:
    with pytest.raises(framing.Reject) as refused:
        call()
    return refused.value.status
