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
* basic-auth failures are cheap to refuse: remembered results, a back-off per client address (429)
  and a bound on concurrent PBKDF2 checks (``security.BasicAuth``).

Connections are served by :class:`monitor.server.http_server.BoundedHttpServer`: one I/O thread and a small
worker pool, with a connection cap, read/idle/write timeouts and a bound on header bytes (TLS
handshakes run non-blocking in the I/O thread).
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from monitor.redaction import mask_query_secrets
from monitor.server.http_server import BoundedHttpServer, ConnectionLimits
from monitor.server.security import AuthLimits, BasicAuth, bearer_matches

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
    429: "429 Too Many Requests",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


@dataclass(frozen=True)
class Route:
    path: str
    methods: frozenset[str]
    handler: Handler
    bearer_token: str | None = None  # required "Authorization: Bearer <token>" when set


def _access_log(line: str) -> None:
    if logger.isEnabledFor(logging.DEBUG):  # the request line, without the value of any ?token=...
        logger.debug("http: %s", mask_query_secrets(line))


class HttpServer:
    """A threaded WSGI server with the metrics app and a small route table."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        health: Callable[[], tuple[bool, str]],
        readiness: Callable[[], tuple[bool, str]],
        limits: ConnectionLimits,
        auth_limits: AuthLimits,
        ssl_context: ssl.SSLContext | None = None,
        basic_auth_users: dict[str, str] | None = None,
        admin_token: str | None = None,
    ):
        self._metrics_app = make_wsgi_app(registry)
        self._routes: dict[str, Route] = {}
        self._health = health
        self._readiness = readiness
        self._basic = BasicAuth(basic_auth_users, auth_limits) if basic_auth_users else None
        self._admin_token = admin_token
        self._auth_failures: Counter[str] = Counter()
        self._auth_lock = threading.Lock()
        self.tls = ssl_context is not None
        self.add_route("/healthz", lambda env: _probe(self._health()), methods=("GET", "HEAD"))
        self.add_route("/readyz", lambda env: _probe(self._readiness()), methods=("GET", "HEAD"))
        self._server = BoundedHttpServer(self._app, host, port, limits, ssl_context, access_log=_access_log)
        self._started = False

    @property
    def port(self) -> int:
        """The bound port once started (the configured one before; 0 means "any free port")."""
        return self._server.port

    @property
    def server(self) -> BoundedHttpServer:
        """The connection-level server (its limits and counts)."""
        return self._server

    def start(self) -> None:
        """Bind the port and serve in threads. Raises OSError when the port cannot be bound."""
        self._server.start()
        self._started = True

    def stop(self) -> None:
        if self._started:
            self._started = False
            self._server.stop()

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

    def _throttle(self, kind: str, start_response: StartResponse, retry_after: float) -> list[bytes]:
        with self._auth_lock:
            self._auth_failures[kind] += 1
        body = b"too many failed or concurrent authentication attempts\n"
        return _respond(start_response, 429, "text/plain", body, [("Retry-After", str(math.ceil(retry_after)))])

    def _app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        route: Route | None
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
            elif self._basic is not None:
                verdict = self._basic.check(header, environ.get("REMOTE_ADDR", ""))
                kind = "metrics" if path == "/metrics" else "other"
                if verdict.retry_after > 0:
                    return self._throttle(kind, start_response, verdict.retry_after)
                if not verdict.ok:
                    return self._deny(kind, start_response, 401, 'Basic realm="embedding-monitor", charset="UTF-8"')
            if path == "/metrics":
                return self._metrics_app(environ, start_response)
        if route is None:
            return _respond(start_response, 404, "text/plain", b"not found\n")
        if environ.get("REQUEST_METHOD", "GET") not in route.methods:
            return _respond(start_response, 405, "text/plain", b"method not allowed\n")
        try:
            status, content_type, body = route.handler(environ)
        except Exception:  # a handler bug must not take the server down
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
