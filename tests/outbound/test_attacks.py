"""An outsider's attacks on the shared client (monitor/outbound.py), with real servers on loopback:
time (drips at many rates, a TLS handshake that drips or never ends, a server that never reads the
request, a resolver that hangs), size (chunk lines, extensions and trailers without end, a
Content-Encoding bomb, heads at and past the cap, JSON that is deep, huge, quadratic to scan or
UTF-16 that hides its values), place (redirects of every kind, secrets in no message nor log line),
framing (HTTP/0.9 and HTTP/2 answers, 1xx storms, lying or doubled lengths, a reset mid-head, a bad
certificate) and leaks (descriptors and threads back to their baseline after 200 failed calls).

Each attack says what the client must do: end within the deadline (plus slack for a busy machine),
keep at most what was asked, and fail with one of :data:`monitor.outbound.REASONS`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor import outbound
from monitor.index.connectors.qdrant import QdrantConnector
from monitor.index.settings import QdrantSettings
from monitor.serving.backends import HttpBackend
from monitor.serving.responses import ServingError
from monitor.serving.settings import EndpointSettings
from tests.support import hostile_http as hostile
from tests.support.tls import self_signed
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SLACK = 1.5  # seconds past the deadline a busy machine may need
SECRET = "sk-attack-secret-0123456789"


def fails(url: str, reason: str, timeout: float = 2.0, **kwargs: Any) -> tuple[float, outbound.OutboundError]:
    """The call fails with ``reason`` within its deadline (and slack); (seconds it took, the error)."""
    kwargs.setdefault("max_body", 1 << 20)
    start = time.monotonic()
    with pytest.raises(outbound.OutboundError) as caught:
        outbound.request(url, timeout=timeout, **kwargs)
    took = time.monotonic() - start
    assert caught.value.reason == reason, (caught.value.reason, str(caught.value))
    assert took < timeout + SLACK, took
    return took, caught.value


def storm(unit: bytes, prefix: bytes = b"", limit: int = 64 << 20) -> hostile.Behaviour:
    """``prefix``, then ``unit`` again and again (at most ``limit`` bytes, until the client goes)."""
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(prefix)
        block = unit * max(1, 16384 // len(unit))
        for _ in range(limit // len(block)):
            if stop.is_set():
                return
            conn.sendall(block)
    return run


def hold(data: bytes, seconds: float = 8.0) -> hostile.Behaviour:
    """``data``, then the connection held open and silent."""
    def run(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)
        stop.wait(seconds)
    return run


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server_tls(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls_files)
    return context


@pytest.fixture(scope="module")
def trusting(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_files[0]))


@pytest.fixture
def raw_listener() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A TCP server whose only connection is handled by a function of the accepted socket (no HTTP
    read first: for TLS-level attacks); it gives ``host:port``."""
    listeners: list[socket.socket] = []

    def start(handle: Callable[[socket.socket], None], rcvbuf: int | None = None) -> str:
        listener = socket.socket()
        if rcvbuf is not None:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listeners.append(listener)

        def accept() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    handle(conn)
                except OSError:
                    pass
        threading.Thread(target=accept, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start  # type: ignore[misc]
    for listener in listeners:
        listener.close()


# -- time -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("every", [0.005, 0.05, 0.2, 0.45, 0.9])
def test_a_drip_at_any_rate_ends_at_the_deadline(every: float) -> None:
    """Each byte inside any per-read timeout, the whole answer 3 s long: the 1 s deadline ends it."""
    with hostile.serving(hostile.drip(b"x" * (int(3 / every) + 1), every=every)) as server:
        took, _ = fails(server.url, "timeout", timeout=1.0)
    assert took >= 0.9, took


def test_a_tls_handshake_that_drips_its_server_hello_ends_at_the_deadline(raw_listener: Any) -> None:
    def handle(conn: socket.socket) -> None:
        conn.recv(65536)  # the ClientHello
        hello = b"\x16\x03\x03\x40\x00\x02\x00\x3f\xfc\x03\x03" + b"\x00" * 2000
        for byte in hello:
            time.sleep(0.1)
            conn.sendall(bytes([byte]))
    address = raw_listener(handle)
    took, _ = fails(f"https://{address}/", "timeout", timeout=1.0)
    assert took >= 0.9


def test_a_tls_server_that_never_answers_the_hello_ends_at_the_deadline(raw_listener: Any) -> None:
    address = raw_listener(lambda conn: (conn.recv(65536), time.sleep(6)))
    fails(f"https://{address}/", "timeout", timeout=1.0)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_that_never_reads_a_large_request_ends_at_the_deadline(
        scheme: str, raw_listener: Any, server_tls: ssl.SSLContext, trusting: ssl.SSLContext) -> None:
    """16 MiB to send, a server that reads 2 KiB each 50 ms (TLS) or nothing at all (plain): the
    send is held to the call's deadline, not to a timeout per send."""
    def handle(conn: socket.socket) -> None:
        if scheme == "https":
            with server_tls.wrap_socket(conn, server_side=True) as tls:
                for _ in range(200):
                    tls.recv(2048)
                    time.sleep(0.05)
        else:
            time.sleep(6)
    address = raw_listener(handle, rcvbuf=4096)
    took, error = fails(f"{scheme}://{address}/", "timeout", timeout=1.0, method="POST", body=b"x" * (16 << 20),
                        ssl_context=trusting)
    assert took >= 0.9 and "sent" in str(error)


@pytest.mark.parametrize("data", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                  b"HTTP/1.1 200 OK\r\nX-Half"], ids=["100-continue", "half-body", "half-head"])
def test_a_connection_held_half_open_ends_at_the_deadline(data: bytes) -> None:
    with hostile.serving(hold(data)) as server:
        fails(server.url, "timeout", timeout=1.0)


def test_a_server_that_shuts_its_side_mid_head_is_protocol(raw_listener: Any) -> None:
    def handle(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
        conn.shutdown(socket.SHUT_WR)
        time.sleep(3)
    fails(f"http://{raw_listener(handle)}/", "protocol")


def test_a_reset_mid_head_is_connect(raw_listener: Any) -> None:
    def handle(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Le")
        time.sleep(0.2)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    _, error = fails(f"http://{raw_listener(handle)}/", "connect")
    assert "Reset" in str(error)


def test_a_resolver_that_hangs_costs_a_few_threads_not_one_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """50 calls to names whose lookups never end (a DNS server that drops queries; the system
    resolver replaced by one that blocks), each ending at its 50 ms deadline: calls for one name
    share its lookup and at most MAX_LOOKUPS lookups run, so the threads do not pile up. Before:
    one thread per call, 50 left waiting on the resolver."""
    released = threading.Event()
    real = socket.getaddrinfo

    def hanging(host: str, *args: Any, **kwargs: Any) -> Any:
        if host.endswith(".hangs.example"):
            released.wait(30)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    before = threading.active_count()
    try:
        for i in range(50):
            fails(f"http://n{i % 20}.hangs.example/", "timeout", timeout=0.05)
        piled = threading.active_count() - before
        same = [fails("http://n0.hangs.example/", "timeout", timeout=0.05) for _ in range(20)]
        assert threading.active_count() - before == piled and len(same) == 20
    finally:
        released.set()
    print(f"resolver threads after 70 timed-out calls: {piled}")
    assert piled <= outbound.MAX_LOOKUPS, piled
    wait_until(lambda: threading.active_count() <= before, timeout=10, message="resolver threads ended")
    with hostile.serving(hostile.answer(b"[]")) as server:  # and names resolve again
        assert outbound.request(f"http://localhost:{server.port}/", timeout=5, max_body=10).body == b"[]"


def test_an_unresolvable_name_is_connect() -> None:
    fails("http://nothing-here.invalid/", "connect", timeout=5.0)


# -- size -------------------------------------------------------------------------------------------

CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(("behaviour", "reason"), [
    (storm(b"f", CHUNKED), "oversized"),  # a chunk-size line of hex digits without end
    (storm(b"a", CHUNKED + b"1;ext="), "oversized"),  # a chunk extension without end
    (storm(b"X-T: " + b"t" * 1000 + b"\r\n", CHUNKED + b"0\r\n"), "oversized"),  # trailers of megabytes
    (storm(b"x", CHUNKED + b"ffffffffffffffffffff\r\n"), "oversized"),  # one chunk of 2**80 bytes
    (storm(b"h", b"HTTP/1.1 200 OK\r\nX-Line: "), "oversized"),  # a header line of megabytes, no newline
    (storm(b"A: b\r\n", b"HTTP/1.1 200 OK\r\n"), "oversized"),  # small headers without end
    (storm(b"HTTP/1.1 100 Continue\r\n\r\n"), "protocol"),  # 1xx without end
], ids=["chunk-size-line", "chunk-extension", "trailers", "huge-chunk", "header-line", "many-headers",
        "1xx-storm"])
def test_an_answer_without_end_stops_at_its_cap(behaviour: hostile.Behaviour, reason: str) -> None:
    with hostile.serving(behaviour) as server:
        took, _ = fails(server.url, reason, timeout=4.0, max_body=1000)
    assert took < 3.0, took  # stopped by the cap, not by the deadline


def test_a_head_just_under_the_cap_is_read_and_one_over_is_oversized() -> None:
    def head(size: int) -> bytes:
        start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        count = (size - len(start) - 2) // 10
        return start + b"X-F: 1234\r\n" * count + b"\r\n"
    fits = head(outbound.MAX_HEAD_BYTES - 200)
    with hostile.serving(hostile.raw(fits + b"ok")) as server:
        response = outbound.request(server.url, timeout=5, max_body=2)
    assert response.body == b"ok" and response.headers["x-f"] == "1234"
    with hostile.serving(hostile.raw(head(outbound.MAX_HEAD_BYTES * 2) + b"ok")) as server:
        fails(server.url, "oversized")


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_body_at_the_cap_is_read_and_one_byte_more_is_oversized(framing: str) -> None:
    def answer(body: bytes) -> bytes:
        if framing == "length":
            return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        if framing == "chunked":
            return CHUNKED + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body
    cap = 10_000
    with hostile.serving(hostile.raw(answer(b"y" * cap))) as server:
        assert outbound.request(server.url, timeout=5, max_body=cap).body == b"y" * cap
    with hostile.serving(hostile.raw(answer(b"y" * (cap + 1)))) as server:
        fails(server.url, "oversized", max_body=cap)


def test_a_content_encoding_bomb_is_not_inflated() -> None:
    """64 MiB of zeros in 64 KiB of gzip: the client asks for no encoding and inflates none; the
    caller sees bytes that are not JSON."""
    bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
    with hostile.serving(hostile.answer(bomb, headers=(("Content-Encoding", "gzip"),))) as server:
        response = outbound.request(server.url, timeout=5, max_body=1 << 20)
        assert response.body == bomb and len(bomb) < 1 << 20
        assert server.requests[0].header("Accept-Encoding") is None
        backend = HttpBackend(EndpointSettings(model="m", url=server.url + "/v1/embeddings", dim=4))
        with pytest.raises(ServingError) as caught:
            backend.embed(["a"], 5.0)
    assert caught.value.reason == "not_json"


def test_json_that_is_quadratic_to_scan_is_read_in_linear_time() -> None:
    """``"\\"\\"\\"…`` never closes a string: a pattern that needs the closing quote rescans the rest
    from every quote. Before: 2.5 s for 16 KB, hours for the 600 KB a serving answer may hold."""
    for raw in (b'"' + b'\\"' * 300_000, b'["' + b'\\"' * 300_000 + b"\\", b'"\\' * 300_000):
        start = time.monotonic()
        with pytest.raises(ValueError):
            outbound.parse_json(raw, 10)
        assert time.monotonic() - start < 1.0
    assert outbound.parse_json(b'["a\\"[,{", "\\\\", [1, 2]]', 5) == ['a"[,{', "\\", [1, 2]]


def test_utf16_json_cannot_hide_its_values_from_the_budget() -> None:
    """U+5C41's UTF-16LE bytes end in a backslash: a count of bytes takes the string's closing quote
    for an escaped one and every ``[]`` after it for string content. Before: 1,002 values parsed
    under a budget of 50."""
    text = '["\u5c41",' + "[]," * 1000 + '"x"]'
    for encoding in ("utf-16-le", "utf-16", "utf-32"):
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.parse_json(text.encode(encoding), 50)
        assert caught.value.reason == "oversized"
    assert outbound.parse_json('{"a": ["\u5c41"]}'.encode("utf-16"), 4) == {"a": ["\u5c41"]}
    assert outbound.parse_json(b'\xef\xbb\xbf{"bom": 1}', 4) == {"bom": 1}


@pytest.mark.parametrize(("raw", "expected"), [
    (b"1e999999", float("inf")), (b"[NaN, -Infinity]", None), (b'{"a": 1, "a": 2}', {"a": 2}),
    (b"9" * 4000, int("9" * 4000)),
])
def test_json_numbers_and_keys_that_parse(raw: bytes, expected: Any) -> None:
    value = outbound.parse_json(raw, 10)
    if expected is not None:
        assert value == expected
    else:
        assert value[0] != value[0] and value[1] == float("-inf")


@pytest.mark.parametrize("raw", [b"1" * 1_000_000, b"[" * 100_000 + b"]" * 100_000, b'["\xff\xfe\xfa"]',
                                 b'{"a": 1', b""], ids=["million-digits", "100k-deep", "bad-utf8", "cut", "empty"])
def test_json_that_cannot_be_read_is_a_value_error_also_in_a_thread(raw: bytes) -> None:
    """A ValueError (the callers' ``not_json``), never a RecursionError nor a crash, also in a
    worker thread's smaller stack."""
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            outbound.parse_json(raw, 1 << 20)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)
    worker = threading.Thread(target=work)
    worker.start()
    worker.join(30)
    assert outcome and isinstance(outcome[0], ValueError), outcome


# -- place: redirects and credentials ---------------------------------------------------------------


@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 307, 308])
@pytest.mark.parametrize("location", [None, "/same", "http://127.0.0.1:9/other", "http://evil.example/"])
def test_no_redirect_of_any_kind_is_followed(status: int, location: str | None) -> None:
    headers = (("Location", location),) if location else ()
    with hostile.serving(hostile.answer(b"{}", status, headers)) as server:
        fails(server.url, "redirect", headers={"Authorization": f"Bearer {SECRET}"})
        assert len(server.requests) == 1


def test_an_https_endpoint_redirecting_to_http_is_not_followed(
        server_tls: ssl.SSLContext, trusting: ssl.SSLContext) -> None:
    with hostile.serving(hostile.answer(b"{}")) as plain:
        with hostile.serving(hostile.redirect(plain.url + "/", 307), tls=server_tls) as server:
            fails(server.url, "redirect", ssl_context=trusting, headers={"api-key": SECRET})
    assert plain.requests == []


def test_a_401_with_a_challenge_is_returned_and_not_answered() -> None:
    with hostile.serving(hostile.answer(b"no", 401, (("WWW-Authenticate", 'Basic realm="x"'),))) as server:
        response = outbound.request(server.url, timeout=5, max_body=10)
        assert response.status == 401 and response.headers["www-authenticate"] == 'Basic realm="x"'
        assert len(server.requests) == 1


FAILURES: dict[str, Callable[[], hostile.Behaviour]] = {
    "redirect": lambda: hostile.redirect("http://evil.example/", 302),
    "garbage": lambda: hostile.raw(b"SSH-2.0 " + SECRET.encode() + b"\r\n\r\n"),  # a server echoing the key
    "oversized": lambda: hostile.bloat(4 << 20),
    "drip": lambda: hostile.drip(b"x" * 50, every=0.1),
    "cut": lambda: hostile.close_mid_body(b"x" * 100),
}


def test_no_secret_reaches_an_error_message_or_a_log_line(caplog: pytest.LogCaptureFixture,
                                                          tmp_path: Path) -> None:
    """The credentials of every caller (a bearer key, Qdrant's api-key, a custom header), through
    every failure, and a key that holds a line break (h11's own message would show it). Before: the
    error read ``Illegal header value b'<the key>\\n…'``."""
    caplog.set_level(logging.DEBUG)
    messages: list[str] = []
    for name, behaviour in FAILURES.items():
        with hostile.serving(behaviour()) as server:
            for headers in ({"Authorization": f"Bearer {SECRET}"}, {"api-key": SECRET}, {"X-Custom": SECRET},
                            {"api-key": f"{SECRET}\nX-Injected: 1"}, {"X-Custom": f"{SECRET}\r\n"}):
                with pytest.raises(outbound.OutboundError) as caught:
                    outbound.request(server.url + "/p?token=" + SECRET, timeout=0.5, max_body=10,
                                     headers=headers, method="POST", body=b"{}")
                messages.append(f"{name}: {caught.value}")
    key_file = tmp_path / "key"
    key_file.write_text(f"{SECRET}\nsecond line\n")
    with pytest.raises(ValueError) as refused:  # a key a header cannot carry is refused at start
        QdrantConnector(QdrantSettings(url="http://127.0.0.1:9", collection="c", api_key_file=key_file))
    messages.append(str(refused.value))
    assert "api_key_file" in str(refused.value)
    assert not [m for m in messages if SECRET in m], messages
    assert SECRET not in caplog.text
    assert all(len(m) < 600 for m in messages), max(messages, key=len)


# -- framing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "reason"), [
    (b"hello, HTTP/0.9 style\n", "protocol"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00", "protocol"),
    (b"\x00\x00\x12\x04\x00\x00\x00\x00\x00", "protocol"),  # an HTTP/2 SETTINGS frame
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n", "protocol"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello", "protocol"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\nhello", "protocol"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", "protocol"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "protocol"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nx", "protocol"),  # h11: 20 digits
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9999999999999999999\r\n\r\nx", "oversized"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "protocol"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "protocol"),
    (b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n", "protocol"),
    (b"HTTP/1.1 200 OK\r\n X-Folded: 1\r\n\r\n", "protocol"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "protocol"),
    (b"", "protocol"),
], ids=["http-0.9", "http2-preface", "http2-frame", "101-unasked", "length-plus", "length-spaces",
        "two-lengths", "negative-length", "huge-length", "long-length", "te-gzip", "bad-chunk", "header-no-colon",
        "leading-fold", "4-digit-status", "nothing"])
def test_a_broken_frame_is_counted_by_reason(data: bytes, reason: str) -> None:
    with hostile.serving(hostile.raw(data)) as server:
        fails(server.url, reason, max_body=1000)


@pytest.mark.parametrize(("data", "body"), [
    (b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", b""),  # 204 has no body, whatever it says
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n",
     b"hello"),  # chunked wins over the length (RFC 9112 6.3), extensions and trailers read
    (b"HTTP/1.0 200 OK\r\n\r\nclose-delimited", b"close-delimited"),
], ids=["204-with-body", "same-length-twice", "te-and-cl", "http-1.0"])
def test_framings_that_are_allowed_read_only_the_body(data: bytes, body: bytes) -> None:
    with hostile.serving(hostile.raw(data)) as server:
        assert outbound.request(server.url, timeout=5, max_body=1000).body == body


def test_an_answer_before_the_request_is_read(raw_listener: Any) -> None:
    def handle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        time.sleep(1)
    assert outbound.request(f"http://{raw_listener(handle)}/", timeout=5, max_body=10).body == b"ok"


def test_a_bad_certificate_fails_unless_trusted(server_tls: ssl.SSLContext, trusting: ssl.SSLContext) -> None:
    with hostile.serving(hostile.answer(b"[]"), tls=server_tls) as server:
        fails(server.url, "connect")  # the system's CAs do not know it
        fails(server.url.replace("127.0.0.1", "localhost"), "connect")
        assert outbound.request(server.url, timeout=5, max_body=10, ssl_context=trusting).body == b"[]"


# -- leaks ------------------------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_200_failed_calls_leave_no_descriptor_nor_thread(server_tls: ssl.SSLContext) -> None:
    """Refused, reset, garbage, oversized, redirected, timed out, TLS refused: 200 failed calls, then
    the process's descriptors and threads are back at their baseline."""
    refused, address = hostile.silent_listener()
    refused.close()
    servers = [hostile.HostileServer(b()).start() for b in FAILURES.values()]
    tls = hostile.HostileServer(hostile.answer(b"[]"), tls=server_tls).start()
    urls = [s.url for s in servers] + [tls.url, f"http://{address}/"]
    try:
        fds, threads = open_fds(), threading.active_count()
        reasons: dict[str, int] = {}
        for i in range(200):
            with pytest.raises(outbound.OutboundError) as caught:
                outbound.request(urls[i % len(urls)], timeout=0.3, max_body=1000)
            reasons[caught.value.reason] = reasons.get(caught.value.reason, 0) + 1
        print(f"200 failed calls by reason: {reasons}; fds {fds} -> {open_fds()}, threads {threads} -> "
              f"{threading.active_count()}")
        assert set(reasons) == {"connect", "timeout", "oversized", "redirect", "protocol"}
        # the servers' ends of the connections are in this process too: they close when each
        # behaviour sees the client gone
        wait_until(lambda: open_fds() <= fds and threading.active_count() <= threads, timeout=20,
                   message=f"descriptors back to {fds} and threads to {threads}",
                   on_timeout=lambda: f"fds {open_fds()}, threads {threading.active_count()}")
    finally:
        for server in [*servers, tls]:
            server.stop()


FD_SCRIPT = textwrap.dedent("""
    import os, resource, ssl, sys
    from monitor import outbound
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    context = ssl.create_default_context(cafile=sys.argv[2])
    before = len(os.listdir("/proc/self/fd"))
    body = outbound.request(sys.argv[1], timeout=5, max_body=10, ssl_context=context).body
    try:
        outbound.request(sys.argv[1], timeout=5, max_body=10)  # not trusted: refused
    except outbound.OutboundError as exc:
        print(exc.reason, body, len(os.listdir("/proc/self/fd")) - before)
""")


def test_https_works_in_a_process_with_over_1024_files_open(
        server_tls: ssl.SSLContext, tls_files: tuple[Path, Path]) -> None:
    """A daemon with many files open (partitions, segments, sockets): the handshake's wait took
    ``select``, which cannot wait on a descriptor past 1023. Before: ``ValueError: filedescriptor
    out of range in select()`` out of the call (no reason; the socket left open)."""
    with hostile.serving(hostile.answer(b"[]"), tls=server_tls) as server:
        done = subprocess.run([sys.executable, "-c", FD_SCRIPT, server.url, str(tls_files[0])], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["connect", "b'[]'", "0"], done.stdout


def test_the_admin_client_reads_a_deeply_nested_answer_as_not_json(tmp_path: Path) -> None:
    import argparse

    from monitor.server.admin_client import AdminCallFailed, call_admin
    token = tmp_path / "token"
    token.write_text("t" * 64)
    with hostile.serving(hostile.answer(b"[" * 100_000 + b"]" * 100_000)) as server:
        args = argparse.Namespace(url=server.url, token_file=str(token), cafile=None, timeout=5.0)
        with pytest.raises(AdminCallFailed) as caught:
            call_admin(args, "GET", "/admin/x", {})
    assert "not JSON" in str(caught.value)


def test_a_qdrant_answer_of_a_body_bigger_than_asked_is_oversized() -> None:
    body = json.dumps({"result": {"points": [{"id": i, "vector": [0.0] * 4} for i in range(50_000)]}}).encode()
    with hostile.serving(hostile.answer(body)) as server:
        connector = QdrantConnector(QdrantSettings(url=server.url, collection="docs", timeout_seconds=5))
        connector.dim = 4
        with pytest.raises(Exception) as caught:
            connector.sample(2)
    assert getattr(caught.value, "reason", None) == "oversized"


# -- what the caller hands over -----------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e300])
def test_a_timeout_that_is_no_deadline_is_refused_before_any_connection(timeout: float) -> None:
    """Before: infinity and 1e300 raised OverflowError out of the socket, NaN read as 'deadline passed'
    (the admin CLI's ``--timeout`` takes any float)."""
    with hostile.serving(hostile.answer(b"[]")) as server:
        with pytest.raises(ValueError, match="timeout"):
            outbound.request(server.url, timeout=timeout, max_body=10)
    assert server.requests == []
    fails("http://127.0.0.1:9/", "timeout", timeout=-1)  # out of time already: no connection tried


def test_a_path_query_or_header_past_ascii_is_sent_encoded_or_refused_by_reason() -> None:
    """check_url and check_headers let ``/é`` and ``café`` by; h11 takes only ASCII. Before: a
    UnicodeEncodeError out of the call (no reason), on every call of a probe so configured."""
    with hostile.serving(hostile.answer(b"[]")) as server:
        assert outbound.request(server.url + "/caf\u00e9?q=\u00e9 x", timeout=5, max_body=10,
                                headers={"X-Note": "caf\u00e9"}).body == b"[]"
        head = server.requests[0].head
        assert head.startswith(b"GET /caf%C3%A9?q=%C3%A9%20x HTTP/1.1\r\n") and b"X-Note: caf\xe9" in head
        for headers in ({"X-\u00e9": "1"}, {"X-A": "\u20ac" + SECRET}):
            _, error = fails(server.url, "protocol", headers=headers)
            assert SECRET not in str(error)
        _, error = fails(server.url, "protocol", method="G\u00c9T")
    assert len(server.requests) == 1  # a request that cannot be sent opens no connection



def test_the_admin_client_shows_no_terminal_escape_of_an_error_answer(tmp_path: Path) -> None:
    import argparse

    from monitor.server.admin_client import AdminCallFailed, call_admin
    token = tmp_path / "token"
    token.write_text("t" * 64)
    with hostile.serving(hostile.answer(b"bad\x1b]0;owned\x07\x1b[2J\r\nFAKE PROMPT $ ", 500)) as server:
        args = argparse.Namespace(url=server.url, token_file=str(token), cafile=None, timeout=5.0)
        with pytest.raises(AdminCallFailed) as caught:
            call_admin(args, "POST", "/admin/x", {})
    message = str(caught.value)
    assert "500" in message and "bad" in message and "FAKE PROMPT" in message
    assert not any(not c.isprintable() for c in message), repr(message)


# -- the JSON budget, fuzzed ------------------------------------------------------------------------


def values_of(document: Any) -> int:
    """What :func:`outbound.parse_json` counts for a parsed value: containers and separators."""
    if isinstance(document, list):
        return 1 + max(0, len(document) - 1) + sum(values_of(item) for item in document)
    if isinstance(document, dict):
        return 1 + max(0, len(document) - 1) + sum(values_of(item) for item in document.values())
    return 0


# characters whose UTF-16/32 code units hold a quote's or a backslash's byte
TRICKY = st.text(alphabet=st.sampled_from('ab"\\[],{}\u5c41\u5c5c\u2222\u225b\u5b22\u225c\U0001f600'), max_size=6)
DOCUMENTS = st.recursive(st.none() | st.integers() | TRICKY,
                         lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY, inner, max_size=4),
                         max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(document=DOCUMENTS, encoding=st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be",
                                                      "utf-32", "utf-32-le"]))
def test_the_budget_is_exact_in_every_encoding(document: Any, encoding: str) -> None:
    """Any document, any encoding ``json.loads`` reads: at its count it parses to itself, one
    below it is oversized. Before: UTF-16 strings could hide values from the count."""
    raw = json.dumps(document, ensure_ascii=False).encode(encoding)
    count = values_of(document)
    assert outbound.parse_json(raw, count) == document
    if count:
        with pytest.raises(outbound.OutboundError):
            outbound.parse_json(raw, count - 1)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200) | st.lists(st.sampled_from([b'"', b"\\", b"[", b",", b"{", b"]", b"}", b"1",
                                                               b"\x00", b"\xff"]), max_size=80).map(b"".join))
def test_whatever_the_bytes_a_parse_stays_within_its_budget(raw: bytes) -> None:
    try:
        document = outbound.parse_json(raw, 8)
    except (ValueError, outbound.OutboundError):
        return
    assert values_of(document) <= 8
