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
import math
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
MAX_TIMEOUT = 86_400.0  # seconds; a longer timeout is a mistake (the settings allow minutes)
MAX_INFORMATIONAL = 32  # 1xx answers before the real one: more is a storm (reason protocol)
MAX_LOOKUPS = 8  # names being resolved at once; a call past it fails at once (a resolver that hangs)
_SHOWN = 200  # what an error message shows of h11's reason for refusing an answer
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")  # RFC 9110 field name
_NOT_ASCII = re.compile(r"[^\x21-\x7e]+")  # what a request target cannot carry as it is
_FIELD_VALUE = re.compile(r"^[\t\x20-\x7e\x80-\xff]*\Z")  # no CR, LF, NUL or other controls
# a JSON string, or an unterminated one to the end: every match succeeds from its quote, so
# stripping them is linear (a pattern that needs the closing quote rescans the rest of the text
# from each quote of ``"\"\"\"…``: quadratic, hours for an answer of a few MB)
_STRING = re.compile(r'"(?:[^"\\]++|\\.?)*+"?', re.DOTALL)


class OutboundError(Exception):
    """One call that did not produce an answer; ``reason`` is one of :data:`REASONS`. The message
    never holds a header value, the URL's query or the bytes the server sent (a server may echo
    the request, credentials and all)."""

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
    """One request, answered within ``timeout`` seconds in all, its body at most ``max_body`` bytes.
    A ``timeout`` that is not a number of seconds up to :data:`MAX_TIMEOUT` is a ``ValueError``
    (infinity or NaN: the call would have no deadline). Characters past ASCII in the URL's path or query are sent
    percent-encoded (UTF-8), header values as Latin-1 (RFC 9110's obs-text)."""
    if not float(timeout) <= MAX_TIMEOUT:  # NaN too; one at or below 0 is out of time already
        raise ValueError(f"timeout must be a number of seconds up to {MAX_TIMEOUT:g}, not {timeout}")
    deadline = clock() + max(0.0, float(timeout))
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    target = _NOT_ASCII.sub(lambda m: urllib.parse.quote(m.group(), safe=""), target)
    host_field = parts.netloc.rpartition("@")[2]
    fields = [("Host", host_field), ("Connection", "close"), ("User-Agent", "embedding-monitor")]
    fields += [(k, v) for k, v in (headers or {}).items() if k.lower() not in ("host", "connection")]
    if body is not None:
        fields.append(("Content-Length", str(len(body))))
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    try:  # the request's bytes before any connection: one that cannot be sent opens none
        latin = [(k.encode("ascii"), v.encode("latin-1")) for k, v in fields]
        data = conn.send(h11.Request(method=method, target=target.encode("ascii"), headers=latin))
        if body:
            data = (data or b"") + (conn.send(h11.Data(data=body)) or b"")
        data = (data or b"") + (conn.send(h11.EndOfMessage()) or b"")
    except (h11.LocalProtocolError, UnicodeError):  # h11's message would show the bad value: a key
        raise OutboundError("protocol", "the request cannot be sent: its target or a header "
                            "is not valid HTTP") from None
    sock = _connect(parts.scheme, host, port, deadline, clock, ssl_context)
    try:
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
    ``ValueError`` for what is not JSON (deep nesting and bytes that are not text included).

    The values are counted in the decoded text (UTF-8, or the UTF-16/32 that ``json.loads``
    detects), never in the bytes: in UTF-16 a character can hold a quote's or a backslash's byte,
    which would hide structure from a count of bytes."""
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    bare = _STRING.sub('""', text)
    values = bare.count("[") + bare.count("{") + bare.count(",")
    del bare
    if values > max_values:
        raise OutboundError("oversized", f"the answer holds {values} values; at most {max_values} were asked for")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the answer nests too deeply") from None


def _remaining(deadline: float, clock: Any) -> float:
    left = deadline - clock()
    if left <= 0:
        raise OutboundError("timeout", "the call's deadline passed")
    return left


def _wait(sock: socket.socket, deadline: float, clock: Any) -> None:
    sock.settimeout(_remaining(deadline, clock))


@dataclass
class _Lookup:
    done: threading.Event
    answer: list[Any] | OSError | None = None


_lookups: dict[tuple[str, int], _Lookup] = {}  # the names being resolved now, each by one thread
_lookups_lock = threading.Lock()


def _resolve(host: str, port: int, deadline: float, clock: Any) -> list[Any]:
    """``getaddrinfo`` within the deadline: the system resolver has no timeout of its own, so a name
    is resolved in a thread of its own that the call stops waiting for (the thread ends when the
    resolver gives up). A numeric address needs no thread. Calls for a name already being resolved
    wait for that lookup instead of starting one more, and at most :data:`MAX_LOOKUPS` names are
    resolved at once: a resolver that hangs costs a few threads, not one per timed-out call."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    key = (host, port)
    with _lookups_lock:
        lookup = _lookups.get(key)
        if lookup is None:
            if len(_lookups) >= MAX_LOOKUPS:
                raise OutboundError("timeout", f"{host} was not resolved: {MAX_LOOKUPS} names are being "
                                    "resolved already (the resolver does not answer?)")
            lookup = _lookups[key] = _Lookup(threading.Event())
            try:
                threading.Thread(target=_lookup, args=(key, lookup), name="embmon-resolve", daemon=True).start()
            except RuntimeError:
                del _lookups[key]
                raise OutboundError("connect", f"{host} cannot be resolved: no thread for it") from None
    if not lookup.done.wait(_remaining(deadline, clock)):
        raise OutboundError("timeout", f"{host} was not resolved before the deadline")
    result = lookup.answer
    if not isinstance(result, list):
        raise OutboundError("connect", f"{host} cannot be resolved: {type(result).__name__}")
    return result


def _lookup(key: tuple[str, int], lookup: _Lookup) -> None:
    try:
        lookup.answer = socket.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM)
    except OSError as exc:
        lookup.answer = exc
    finally:
        with _lookups_lock:
            _lookups.pop(key, None)
        lookup.done.set()


def _ready(sock: socket.socket, write: bool, deadline: float, clock: Any) -> bool:
    """Whether ``sock`` can be read (written) before the deadline; ``poll``, which has no limit on
    the descriptor's number (``select`` fails past 1023, as in a daemon with many files open)."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(math.ceil(_remaining(deadline, clock) * 1000)))


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
                write = False
            except ssl.SSLWantWriteError:
                write = True
            if not _ready(tls, write, deadline, clock):
                raise OutboundError("timeout", "the TLS handshake did not end before the deadline")
    except (ssl.SSLError, OSError) as exc:
        tls.close()
        raise OutboundError("connect", f"TLS with {host} failed: {type(exc).__name__}") from None
    except BaseException:
        tls.close()
        raise


def _receive(conn: h11.Connection, sock: socket.socket, deadline: float, clock: Any, timeout: float,
             max_body: int) -> Response:
    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    size = 0
    limit = max_body
    informational = 0
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            if "buffer" in str(exc).lower():
                raise OutboundError("oversized", f"an answer head over {MAX_HEAD_BYTES} bytes") from None
            # h11's words without the bytes it quotes: a server may echo the request, key and all
            what = str(exc).partition(":")[0][:_SHOWN]
            raise OutboundError("protocol", f"not a valid HTTP answer: {what}") from None
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
            informational += 1
            if informational > MAX_INFORMATIONAL:
                raise OutboundError("protocol", f"over {MAX_INFORMATIONAL} informational (1xx) answers")
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            if 300 <= status < 400:
                raise OutboundError("redirect", f"HTTP {status}: redirects are not followed")
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
            if status >= 400:
                limit = min(max_body, ERROR_BODY_BYTES)
            elif int(headers.get("content-length") or 0) > max_body:  # h11 checked: digits, 20 at most
                raise OutboundError("oversized", f"an answer of {headers['content-length']} bytes; at most "
                                    f"{max_body} were asked for")
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
        if event is h11.PAUSED:  # a 101 Switching Protocols nobody asked for
            raise OutboundError("protocol", "the server switched protocols")
        raise OutboundError("protocol", "the connection closed before a whole answer")  # h11.ConnectionClosed
