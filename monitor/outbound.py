"""The one HTTP client every outbound call of the daemon goes through: bounded in time, size and place.

The serving probe's endpoint, the golden probe's search endpoint and the Qdrant-shaped index API
are outside the daemon; what they answer is outside bytes. :func:`request` makes one HTTP/1.1
request on its own connection (``Connection: close``, no reuse) and holds it to four bounds:

* **time**: one monotonic deadline covers the whole call (resolving the name, connect, TLS handshake,
  sending, the head and the whole body). Every socket operation waits at most what is left, so a
  server that drips a byte just inside each read's timeout still ends at the deadline (the standard
  library's ``timeout`` is per read and never would). Reason ``timeout``.
* **size**: the caller says how many body bytes the question can need (``max_body``); at most
  that many are kept, and one more ends the call. The head is held to :data:`MAX_HEAD_BYTES`
  (h11's buffer limit). Reason ``oversized``. :func:`parse_json` then bounds what a body may cost
  in memory once parsed (its values, not its bytes: ``[],[],…`` costs about 26 times its size).
* **place**: no redirect is followed; a 3xx is reason ``redirect``, so the credentials in the
  headers never leave the configured origin (and an https endpoint never becomes http).
* **framing**: the answer is read by h11 (the same parser the exporter's server uses); a lying
  ``Content-Length``, a body cut short or garbage for a status line is reason ``protocol``.

A refused, reset or unresolvable connection is ``connect``. A 4xx/5xx answer is returned (its
body up to :data:`ERROR_BODY_BYTES`), not raised: each caller has its own reasons for codes.
:func:`check_url` and :func:`check_headers` are the start-up checks of what the settings configure.

Standard library and h11 only.
"""

from __future__ import annotations

import ipaddress
import json
import re
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h11

# why one call failed; each caller maps these onto its own error counter's reasons
REASONS = ("connect", "timeout", "oversized", "redirect", "protocol")
MAX_HEAD_BYTES = 64 * 1024  # status line and header fields together
ERROR_BODY_BYTES = 4096  # what is kept of a 4xx/5xx answer (a message, an HTML page's start)
_RECV = 65536
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field name
_FIELD_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*$")  # no CR, LF, NUL or other controls
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)


class OutboundError(Exception):
    """One call that did not produce an answer; ``reason`` is one of :data:`REASONS`. The message
    never holds a header value or the URL's query."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        assert reason in REASONS, reason
        self.reason = reason


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names; the last of a repeated field
    body: bytes


def check_url(url: str) -> str:
    """``url`` unchanged when it is an absolute http(s) URL with a host and a valid port;
    a ``ValueError`` saying what is wrong otherwise (settings validators call this)."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise ValueError("not an http(s) URL: it holds a space or a control character")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL: unsupported scheme {parts.scheme!r}")
    if not parts.hostname:
        raise ValueError("not an http(s) URL: no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("not an http(s) URL: the port is not a number from 1 to 65535") from None
    if port == 0:
        raise ValueError("not an http(s) URL: the port is 0")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL holds credentials (user:password@); configure them as a header or key file")
    return url


def check_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` unchanged when every name is a token and no value holds CR, LF or another
    control character; a ``ValueError`` naming the bad header otherwise (never its value)."""
    for name, value in headers.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ValueError(f"header name {name!r} is not a valid HTTP field name")
        if not isinstance(value, str) or not _FIELD_VALUE.match(value) or value != value.strip(" \t"):
            raise ValueError(f"the value of header {name!r} holds CR, LF, another control character or "
                             "leading/trailing blanks")
        if name.lower() in ("host", "content-length", "transfer-encoding", "connection"):
            raise ValueError(f"header {name!r} is set by the client itself")
    return headers


def request(
    url: str, *, method: str = "GET", body: bytes | None = None, headers: Mapping[str, str] | None = None,
    timeout: float, max_body: int, ssl_context: ssl.SSLContext | None = None,
    clock: Any = time.monotonic,
) -> Response:
    """One request, answered within ``timeout`` seconds in all, its body at most ``max_body`` bytes."""
    deadline = clock() + max(0.0, float(timeout))
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_field = parts.netloc.rpartition("@")[2]
    fields = [("Host", host_field), ("Connection", "close"), ("User-Agent", "embedding-monitor")]
    fields += [(k, v) for k, v in (headers or {}).items() if k.lower() not in ("host", "connection")]
    if body is not None:
        fields.append(("Content-Length", str(len(body))))
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    sock = _connect(parts.scheme, host, port, deadline, clock, ssl_context)
    try:
        try:
            data = conn.send(h11.Request(method=method, target=target, headers=fields))
            if body:
                data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
            data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as exc:
            raise OutboundError("protocol", f"the request cannot be sent: {exc}") from None
        _wait(sock, deadline, clock)
        try:
            sock.sendall(data)
        except TimeoutError:
            raise OutboundError("timeout", f"the request was not sent within {timeout:g} s") from None
        except OSError as exc:
            raise OutboundError("connect", f"sending failed: {type(exc).__name__}") from None
        return _receive(conn, sock, deadline, clock, timeout, max_body)
    finally:
        sock.close()


def parse_json(raw: bytes, max_values: int) -> Any:
    """``raw`` parsed as JSON, when it holds at most ``max_values`` containers and list/object
    items (counted outside strings, before parsing: what a parsed value costs is per value, so
    counting them bounds the memory). ``OutboundError('oversized')`` past the budget; a
    ``ValueError`` for what is not JSON (deep nesting included)."""
    bare = _STRING.sub(b'""', raw)
    values = bare.count(b"[") + bare.count(b"{") + bare.count(b",")
    del bare
    if values > max_values:
        raise OutboundError("oversized", f"the answer holds {values} values; at most {max_values} were asked for")
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("the answer nests too deeply") from None


def _remaining(deadline: float, clock: Any) -> float:
    left = deadline - clock()
    if left <= 0:
        raise OutboundError("timeout", "the call's deadline passed")
    return left


def _wait(sock: socket.socket, deadline: float, clock: Any) -> None:
    sock.settimeout(_remaining(deadline, clock))


def _resolve(host: str, port: int, deadline: float, clock: Any) -> list[Any]:
    """``getaddrinfo`` within the deadline: the system resolver has no timeout of its own, so a name
    is resolved in a thread of its own that the call stops waiting for (the thread ends when the
    resolver gives up). A numeric address needs no thread."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    answer: list[list[Any] | OSError] = []
    done = threading.Event()

    def work() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answer.append(exc)
        done.set()

    threading.Thread(target=work, name="embmon-resolve", daemon=True).start()
    if not done.wait(_remaining(deadline, clock)):
        raise OutboundError("timeout", f"{host} was not resolved before the deadline")
    result = answer[0]
    if isinstance(result, OSError):
        raise OutboundError("connect", f"{host} cannot be resolved: {type(result).__name__}")
    return result


def _connect(scheme: str, host: str, port: int, deadline: float, clock: Any,
             context: ssl.SSLContext | None) -> socket.socket:
    failure: OSError | None = None
    for family, kind, proto, _, address in _resolve(host, port, deadline, clock):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_remaining(deadline, clock))
            sock.connect(address)
            break
        except OutboundError:
            sock.close()
            raise
        except TimeoutError:
            sock.close()
            raise OutboundError("timeout", f"no connection to {host}:{port} before the deadline") from None
        except OSError as exc:
            sock.close()
            failure = exc
    else:
        why = type(failure).__name__ if failure is not None else "no address"
        raise OutboundError("connect", f"no connection to {host}:{port}: {why}")
    if scheme != "https":
        return sock
    try:
        tls = (context or ssl.create_default_context()).wrap_socket(
            sock, server_hostname=host, do_handshake_on_connect=False)
    except (ssl.SSLError, OSError, ValueError) as exc:
        sock.close()
        raise OutboundError("connect", f"TLS with {host} failed: {type(exc).__name__}") from None
    try:
        tls.setblocking(False)
        while True:  # every wait of the handshake against the one deadline
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                ready = select.select([tls], [], [], _remaining(deadline, clock))[0]
            except ssl.SSLWantWriteError:
                ready = select.select([], [tls], [], _remaining(deadline, clock))[1]
            if not ready:
                raise OutboundError("timeout", "the TLS handshake did not end before the deadline")
    except OutboundError:
        tls.close()
        raise
    except (ssl.SSLError, OSError) as exc:
        tls.close()
        raise OutboundError("connect", f"TLS with {host} failed: {type(exc).__name__}") from None


def _receive(conn: h11.Connection, sock: socket.socket, deadline: float, clock: Any, timeout: float,
             max_body: int) -> Response:
    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    size = 0
    limit = max_body
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if "buffer" in str(exc).lower():
                raise OutboundError("oversized", f"an answer head over {MAX_HEAD_BYTES} bytes") from None
            raise OutboundError("protocol", f"not a valid HTTP answer: {exc}") from None
        if event is h11.NEED_DATA:
            try:
                _wait(sock, deadline, clock)
                data = sock.recv(_RECV)
            except TimeoutError:
                raise OutboundError("timeout", f"no whole answer within {timeout:g} s") from None
            except OSError as exc:
                raise OutboundError("connect", f"reading failed: {type(exc).__name__}") from None
            conn.receive_data(data)
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            if 300 <= status < 400:
                raise OutboundError("redirect", f"HTTP {status}: redirects are not followed")
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
            if status >= 400:
                limit = min(max_body, ERROR_BODY_BYTES)
            continue
        if isinstance(event, h11.Data):
            size += len(event.data)
            if size > limit:
                if status >= 400:  # an error's body is only looked at: keep its start
                    chunks.append(event.data[: max(0, limit - (size - len(event.data)))])
                    return Response(status, headers, b"".join(chunks))
                raise OutboundError("oversized", f"an answer over {max_body} bytes")
            chunks.append(event.data)
            continue
        if isinstance(event, h11.EndOfMessage):
            return Response(status, headers, b"".join(chunks))
        raise OutboundError("protocol", "the connection closed before a whole answer")  # h11.ConnectionClosed
