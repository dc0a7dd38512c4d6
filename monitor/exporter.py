"""The HTTP face of the daemon: ``/metrics``, ``/healthz``, ``/readyz`` (and admin routes) on one port.

Scrapes never compute: the collector turns the last published snapshot and a few counters into
metric families. Routes beyond the three built-in ones are registered by components (e.g. the
baseline admin endpoint) with :meth:`HttpServer.add_route`.
"""

from __future__ import annotations

import hmac
import logging
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

logger = logging.getLogger(__name__)

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
Handler = Callable[[Environ], tuple[int, str, bytes]]  # -> (status, content type, body)

_STATUS = {
    200: "200 OK",
    202: "202 Accepted",
    400: "400 Bad Request",
    401: "401 Unauthorized",
    403: "403 Forbidden",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    409: "409 Conflict",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


@dataclass(frozen=True)
class Route:
    path: str
    methods: frozenset[str]
    handler: Handler
    bearer_token: str | None = None  # required "Authorization: Bearer <token>" when set


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("http: " + format, *args)


class HttpServer:
    """A threaded WSGI server with the metrics app and a small route table."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        health: Callable[[], tuple[bool, str]],
        readiness: Callable[[], tuple[bool, str]],
        ssl_context: ssl.SSLContext | None = None,
    ):
        self._metrics_app = make_wsgi_app(registry)
        self._routes: dict[str, Route] = {}
        self._health = health
        self._readiness = readiness
        self.add_route("/healthz", lambda env: _probe(self._health()), methods=("GET", "HEAD"))
        self.add_route("/readyz", lambda env: _probe(self._readiness()), methods=("GET", "HEAD"))
        self._server = make_server(host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler)
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="embmon-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def add_route(
        self, path: str, handler: Handler, methods: Iterable[str] = ("GET",), bearer_token: str | None = None
    ) -> None:
        self._routes[path] = Route(path, frozenset(methods), handler, bearer_token)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        route = self._routes.get(path)
        if route is None:
            return _respond(start_response, 404, "text/plain", b"not found\n")
        if environ.get("REQUEST_METHOD", "GET") not in route.methods:
            return _respond(start_response, 405, "text/plain", b"method not allowed\n")
        if route.bearer_token is not None and not _bearer_ok(environ, route.bearer_token):
            return _respond(start_response, 401, "text/plain", b"unauthorized\n", [("WWW-Authenticate", "Bearer")])
        try:
            status, content_type, body = route.handler(environ)
        except Exception:  # noqa: BLE001 - a handler bug must not take the server down
            logger.exception("handler for %s failed", path)
            status, content_type, body = 500, "text/plain", b"internal error\n"
        return _respond(start_response, status, content_type, body)


def _probe(result: tuple[bool, str]) -> tuple[int, str, bytes]:
    ok, detail = result
    return (200 if ok else 503), "text/plain; charset=utf-8", (detail + "\n").encode()


def _bearer_ok(environ: Environ, token: str) -> bool:
    header = environ.get("HTTP_AUTHORIZATION", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return False
    # Constant-time comparison: response timing must not reveal how much of the token matched.
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def _respond(
    start_response: StartResponse,
    status: int,
    content_type: str,
    body: bytes,
    extra_headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    start_response(_STATUS.get(status, f"{status} Status"), headers + (extra_headers or []))
    return [body]
