"""The shared client's own contract (monitor/outbound.py): a GET carries no body, https is
verified and bounded by the same deadline as the rest of the call, an error status is returned with
the start of its body, and a server that never speaks ends at the deadline."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path

import pytest

from monitor import outbound
from tests.support import hostile_http as hostile
from tests.support.tls import self_signed


def test_a_get_sends_no_body_and_reads_the_answer() -> None:
    with hostile.serving(hostile.answer(b'{"ok": true}', headers=(("X-Seen", "1"),))) as server:
        response = outbound.request(server.url + "/s?q=a%20b", timeout=5, max_body=100)
    assert (response.status, response.body, response.headers["x-seen"]) == (200, b'{"ok": true}', "1")
    head = server.requests[0].head.decode()
    assert head.startswith("GET /s?q=a%20b HTTP/1.1\r\n")
    assert server.requests[0].header("Transfer-Encoding") is None and server.requests[0].body == b""
    assert server.requests[0].header("Connection") == "close"


def test_an_error_status_is_returned_with_the_start_of_its_body() -> None:
    with hostile.serving(hostile.answer(b"<html>" + b"x" * 100_000, status=503,
                                        headers=(("Retry-After", "7"),))) as server:
        response = outbound.request(server.url, method="POST", body=b"{}", timeout=5, max_body=1 << 20)
    assert response.status == 503 and response.headers["retry-after"] == "7"
    assert response.body.startswith(b"<html>") and len(response.body) == outbound.ERROR_BODY_BYTES


def test_https_is_verified_and_answers(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    with hostile.serving(hostile.answer(b"[]"), tls=server_side) as server:
        trusting = ssl.create_default_context(cafile=str(cert))
        assert outbound.request(server.url, timeout=5, max_body=10, ssl_context=trusting).body == b"[]"
        with pytest.raises(outbound.OutboundError) as caught:  # the system's CAs do not know it
            outbound.request(server.url, timeout=5, max_body=10)
    assert caught.value.reason == "connect"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_server_that_never_speaks_ends_at_the_deadline(scheme: str) -> None:
    listener, address = hostile.silent_listener()
    try:
        start = time.monotonic()
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.request(f"{scheme}://{address}/", timeout=0.8, max_body=10)
        took = time.monotonic() - start
    finally:
        listener.close()
    assert caught.value.reason == "timeout"
    assert 0.7 < took < 0.8 + 1.5, took


def test_a_refused_connection_is_connect() -> None:
    listener, address = hostile.silent_listener()
    listener.close()
    with pytest.raises(outbound.OutboundError) as caught:
        outbound.request(f"http://{address}/", timeout=5, max_body=10)
    assert caught.value.reason == "connect"


def test_a_head_that_drips_inside_the_limit_still_ends_at_the_deadline() -> None:
    with hostile.serving(hostile.slowloris_headers(every=0.05, fields=10_000)) as server:
        start = time.monotonic()
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.request(server.url, timeout=1.0, max_body=10)
    assert caught.value.reason == "timeout" and time.monotonic() - start < 2.5


def test_a_name_is_resolved_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that never answers (a DNS server that drops queries cannot run here: the system
    resolver is replaced by one that blocks) still ends the call at its deadline; a name that
    resolves is called as before."""
    with hostile.serving(hostile.answer(b"[]")) as server:
        assert outbound.request(f"http://localhost:{server.port}/", timeout=5, max_body=10).body == b"[]"
    released = threading.Event()
    real = socket.getaddrinfo

    def hanging(host: str, *args: object, **kwargs: object) -> object:
        if host == "hangs.example":
            released.wait(30)
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    start = time.monotonic()
    try:
        with pytest.raises(outbound.OutboundError) as caught:
            outbound.request("http://hangs.example/", timeout=0.5, max_body=10)
    finally:
        released.set()
    assert caught.value.reason == "timeout" and time.monotonic() - start < 2.0
