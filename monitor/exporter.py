"""The HTTP face of the daemon: ``/metrics``, ``/healthz``, ``/readyz`` (and admin routes) on one port.

Scrapes never compute: the collector turns the last published snapshot and a few counters into
metric families. Routes beyond the three built-in ones are registered by components (e.g. the
baseline admin endpoint) with :meth:`HttpServer.add_route`.

Access control (docs/operations.md, "Security"):

* ``/healthz`` and ``/readyz`` are always open (kubelet probes carry no credentials);
* every other route, ``/metrics`` included, needs HTTP basic auth when users are configured;
* ``/admin/*`` routes (and any route registered with a ``bearer_token``) need
  ``Authorization: Bearer <token>`` instead, compared in constant time; with no admin token
  configured they answer 403;
* with TLS configured, the handshake runs in the request's own thread (a slow or hostile client
  cannot stall the accept loop).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from monitor.security import BasicAuth, bearer_matches, mask_query_secrets

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
        if logger.isEnabledFor(logging.DEBUG):  # the request line, without the value of any ?token=...
            logger.debug("http: %s", mask_query_secrets(format % args))


class _Server(ThreadingWSGIServer):
    """ThreadingWSGIServer that, with TLS, wraps each connection in its handler thread."""

    ssl_context: ssl.SSLContext | None = None
    handshake_timeout = 10.0

    def finish_request(self, request: socket.socket, client_address: Any) -> None:  # type: ignore[override]
        if self.ssl_context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.handshake_timeout)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            logger.debug("TLS handshake with %s failed: %s", client_address, exc)
            return
        try:
            tls.settimeout(None)
            super().finish_request(tls, client_address)  # type: ignore[arg-type]
        finally:
            tls.close()


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
        basic_auth_users: dict[str, str] | None = None,
        admin_token: str | None = None,
    ):
        self._metrics_app = make_wsgi_app(registry)
        self._routes: dict[str, Route] = {}
        self._health = health
        self._readiness = readiness
        self._basic = BasicAuth(basic_auth_users) if basic_auth_users else None
        self._admin_token = admin_token
        self._auth_failures: Counter[str] = Counter()
        self._auth_lock = threading.Lock()
        self.tls = ssl_context is not None
        self.add_route("/healthz", lambda env: _probe(self._health()), methods=("GET", "HEAD"))
        self.add_route("/readyz", lambda env: _probe(self._readiness()), methods=("GET", "HEAD"))
        self._host = host
        self._port = port
        self._ssl_context = ssl_context
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._bound_port: int | None = None

    @property
    def port(self) -> int:
        """The bound port once started (the configured one before; 0 means "any free port")."""
        return self._bound_port if self._bound_port is not None else self._port

    def start(self) -> None:
        """Bind the port and serve in a thread. Raises OSError when the port cannot be bound."""
        server = make_server(self._host, self._port, self._app, _Server, handler_class=_QuietHandler)
        server.ssl_context = self._ssl_context
        self._server = server
        self._bound_port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, name="embmon-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        if self._thread is not None and self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        self._server = None

    def add_route(
        self, path: str, handler: Handler, methods: Iterable[str] = ("GET",), bearer_token: str | None = None
    ) -> None:
        self._routes[path] = Route(path, frozenset(methods), handler, bearer_token)

    def auth_failure_counts(self) -> dict[str, int]:
        """Rejected requests by endpoint kind (``metrics``, ``admin``, ``other``)."""
        with self._auth_lock:
            return dict(self._auth_failures)

    def _deny(self, kind: str, start_response: StartResponse, status: int, scheme: str) -> list[bytes]:
        with self._auth_lock:
            self._auth_failures[kind] += 1
        body = b"unauthorized\n" if status == 401 else b"forbidden: admin endpoints need http.admin_token\n"
        headers = [("WWW-Authenticate", scheme)] if status == 401 else []
        return _respond(start_response, status, "text/plain", body, headers)

    def _app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            route = self._routes[path]
        else:
            route = self._routes.get(path)
            token = route.bearer_token if route is not None else None
            if token is None and path.startswith("/admin/"):
                if self._admin_token is None:
                    return self._deny("admin", start_response, 403, "Bearer")
                token = self._admin_token
            header = environ.get("HTTP_AUTHORIZATION", "")
            if token is not None:
                if not bearer_matches(header, token):
                    return self._deny("admin", start_response, 401, "Bearer")
            elif self._basic is not None and not self._basic.check(header):
                kind = "metrics" if path == "/metrics" else "other"
                return self._deny(kind, start_response, 401, 'Basic realm="embedding-monitor", charset="UTF-8"')
            if path == "/metrics":
                return self._metrics_app(environ, start_response)
        if route is None:
            return _respond(start_response, 404, "text/plain", b"not found\n")
        if environ.get("REQUEST_METHOD", "GET") not in route.methods:
            return _respond(start_response, 405, "text/plain", b"method not allowed\n")
        try:
            status, content_type, body = route.handler(environ)
        except Exception:  # noqa: BLE001 - a handler bug must not take the server down
            logger.exception("handler for %s failed", path)
            status, content_type, body = 500, "text/plain", b"internal error\n"
        return _respond(start_response, status, content_type, body)


def _probe(result: tuple[bool, str]) -> tuple[int, str, bytes]:
    ok, detail = result
    return (200 if ok else 503), "text/plain; charset=utf-8", (detail + "\n").encode()


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
