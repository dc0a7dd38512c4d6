"""HTTP/1.1 framing for the daemon's port, by h11 (as uvicorn's ``protocols/http/h11_impl.py``).

A connection's bytes go into a :class:`RequestReader`; complete requests come out as
:class:`Request` (what the WSGI application sees), and the application's answer goes back through
the same reader as bytes to send. h11 parses the request line, the fields, ``Content-Length``
(at most 20 ASCII digits) and chunked bodies, refuses bare CR, obsolete or conflicting framing and
a missing ``Host``, and frames the answer (``Content-Length``, ``Connection: close``, nothing after
a ``HEAD``). This module adds what h11 lets by: a head over ``max_header_bytes`` (431), bare LF
line endings and folded field lines, HTTP/1.x versions other than 1.0 and 1.1 (400) and other
majors (505), more than 100 fields (431), ``Content-Length`` with ``Transfer-Encoding`` (400), a
body over 16 KiB (413) and an absolute-form target that is no URL (400). Every refusal is a
:class:`Reject` carrying the status; the server answers it and closes that connection
(``monitor/server/http_server.py``).
"""

from __future__ import annotations

import email.utils
import io
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import h11

MAX_BODY_BYTES = 16 * 1024
MAX_HEADER_FIELDS = 100  # as the standard library's http.client
REASONS = {
    400: "Bad Request", 408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
    431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
    505: "HTTP Version Not Supported",
}
# RFC 9112 lets a server accept a bare LF, and unfold a field line that starts with whitespace (obs-fold); h11
# does both, this server refuses them (400), as a proxy in front may read either differently
_BARE_LF_OR_FOLD = re.compile(rb"(?<!\r)\n|\r\n[ \t]")


class Reject(Exception):
    """The request cannot be served: answer ``status`` (one of :data:`REASONS`) and close."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status if status in REASONS else 400


@dataclass
class Request:
    method: str
    target: str
    version: str  # "HTTP/1.1"
    path: str  # the target's path, still percent-encoded
    query: str
    headers: list[tuple[str, str]]  # names in lower case, in arrival order
    body: bytearray = field(default_factory=bytearray)


class RequestReader:
    """One connection's requests, one at a time: the head is buffered here until its CRLF CRLF
    (to bound it and to refuse bare LF), then a fresh ``h11.Connection`` reads the request and
    frames its answer; :meth:`next_cycle` hands what the client sent after it to the next request."""

    __slots__ = ("_buf", "_http", "_max_header_bytes", "_request", "_scanned")

    def __init__(self, max_header_bytes: int):
        self._max_header_bytes = max_header_bytes
        self._buf = bytearray()  # a head still arriving (before ``_http`` takes the request)
        self._scanned = 0  # how far ``_buf`` was searched for the head's end
        self._http: h11.Connection | None = None
        self._request: Request | None = None  # a head whose body is still arriving

    def buffered(self) -> int:
        """Bytes of a head held here (h11 holds at most one read of a body beyond what it handed on)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        if self._http is None:
            self._buf += data
        else:
            self._http.receive_data(data)

    def next_request(self) -> Request | None:
        """The request once its head and body are in, None while they arrive; :class:`Reject` when bad."""
        if self._http is None:
            end = self._head_end()
            if end is None:
                return None
            self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_header_bytes)
            self._http.receive_data(bytes(self._buf))
            self._buf.clear()
            self._scanned = 0
        try:
            while True:
                event = self._http.next_event()
                if isinstance(event, h11.Request):
                    self._request = _request(event)
                elif isinstance(event, h11.Data):
                    assert self._request is not None
                    self._request.body += event.data
                    if len(self._request.body) > MAX_BODY_BYTES:  # a chunked body shows its length as it comes
                        raise Reject(413)
                elif isinstance(event, h11.EndOfMessage):
                    request, self._request = self._request, None
                    return request
                else:  # NEED_DATA (never PAUSED before a request's end, nor ConnectionClosed: EOF closes)
                    return None
        except h11.RemoteProtocolError as exc:
            raise Reject(exc.error_status_hint) from None

    def continue_answer(self) -> bytes:
        """``100 Continue`` when the client waits for it before sending the body, else nothing."""
        if self._http is None or not self._http.they_are_waiting_for_100_continue:
            return b""
        return self._http.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")) or b""

    def answer(self, request: Request, status: str, headers: list[tuple[str, str]], body: bytes,
               closing: bool) -> tuple[bytes, bool]:
        """The WSGI answer (h11 validates it: ValueError or h11.LocalProtocolError when invalid) as
        bytes, and whether the connection may carry another request; ``closing``: it may not."""
        assert self._http is not None
        fields = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers
                  if name.lower() not in ("content-length", "connection", "date")]
        fields += [(b"Date", email.utils.formatdate(usegmt=True).encode()), (b"Content-Length", b"%d" % len(body))]
        if closing:
            fields.append((b"Connection", b"close"))
        code, _, reason = status.partition(" ")
        response = h11.Response(status_code=int(code), reason=reason.encode("latin-1"), headers=fields)
        out = self._http.send(response) or b""
        if request.method != "HEAD" and body:
            out += self._http.send(h11.Data(data=body)) or b""
        out += self._http.send(h11.EndOfMessage()) or b""
        return out, self._http.our_state is h11.DONE  # else MUST_CLOSE: asked to, or HTTP/1.0

    def next_cycle(self) -> bool:
        """After an answer that keeps the connection: the bytes sent after the request start the
        next one's head. True when there are some."""
        if self._http is not None:
            self._buf = bytearray(self._http.trailing_data[0])
            self._http = None
        return bool(self._buf)

    def _head_end(self) -> int | None:
        """Where the buffered head ends (after its CRLF CRLF), None while it arrives; :class:`Reject`
        (431) past ``max_header_bytes``, (400) for a bare LF or a folded field line."""
        start = max(0, self._scanned - 3)
        end = self._buf.find(b"\r\n\r\n", start)
        if _BARE_LF_OR_FOLD.search(self._buf, start, len(self._buf) if end < 0 else end + 4):
            raise Reject(400)
        if end < 0:
            self._scanned = len(self._buf)
            if len(self._buf) > self._max_header_bytes:
                raise Reject(431)
            return None
        if end > self._max_header_bytes:
            raise Reject(431)
        return end + 4


def _request(event: h11.Request) -> Request:
    """What the application sees of h11's request head, or a :class:`Reject` for what h11 lets by."""
    version = event.http_version
    if not version.startswith(b"1."):
        raise Reject(505)
    if version not in (b"1.0", b"1.1"):
        raise Reject(400)  # HTTP/1.9 and the like
    if len(event.headers) > MAX_HEADER_FIELDS:
        raise Reject(431)
    names = {name for name, _ in event.headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise Reject(400)  # a smuggling attempt (RFC 9112, 6.1), which h11 would frame by the former
    if next((int(value) for name, value in event.headers if name == b"content-length"), 0) > MAX_BODY_BYTES:
        raise Reject(413)
    target = event.target.decode("latin-1")
    if target.startswith("/"):
        path, _, query = target.partition("?")
    else:  # absolute form (or "*"): the URL's path and query
        try:
            url = urllib.parse.urlsplit(target)
        except ValueError:  # http://[::1/metrics
            raise Reject(400) from None
        path, query = url.path or "/", url.query
    headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers]
    return Request(event.method.decode("latin-1"), target, f"HTTP/{version.decode()}", path, query, headers)


def wsgi_environ(request: Request, server: tuple[str, int], peer: Any, https: bool) -> dict[str, Any]:
    """PEP 3333's environ for ``request``, which came from ``peer`` to ``server`` (host, port)."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote(request.path, "iso-8859-1"),
        "QUERY_STRING": request.query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": request.version,
        "REMOTE_ADDR": str(peer[0]) if isinstance(peer, tuple) else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https" if https else "http",
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


def error_answer(status: int) -> bytes:
    """A refusal, for a request h11 could not read (so written here): the status and ``Connection: close``."""
    body = f"{status} {REASONS[status]}\n".encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body
