"""The HTTP port's settings, ``http:``, and what the server is built with from them (:func:`http_security`,
:func:`http_limits`). Light: pydantic only; the server's modules load when a check or a helper needs them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from monitor.settings_base import Section

logger = logging.getLogger(__name__)

_HTTP_BUFFER_BUDGET = 256 * 2**20  # what request buffers may take at most (the sidecar's limit is 1.5 GiB)


class HttpSettings(Section):
    """The HTTP port. TLS, basic auth and the admin token are described in docs/operations.md."""

    host: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the pod from outside (docs/deployment.md)
    port: int = Field(9464, ge=0, le=65535)
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    tls_client_cafile: Path | None = None  # when set, clients must present a certificate it signed
    # user -> "pbkdf2_sha256$<iterations>$<salt>$<base64 sha256 key>" (python -m monitor.server.security hash)
    basic_auth_users: dict[str, SecretStr] = Field(default_factory=dict)
    admin_token: SecretStr | None = None  # bearer token for /admin/* routes
    admin_token_file: Path | None = None  # or a file holding it (Kubernetes secret volume)
    # what one client can hold (docs/operations.md, "Connection limits"; monitor/server/http_server.py)
    max_connections: int = Field(
        512, ge=1, le=100_000,
        description="open connections at most (Prometheus' --web.max-connections default); at the cap a new one "
        "evicts the connection that has waited longest without a request in service",
    )
    max_header_bytes: int = Field(65_536, ge=1024, le=16 * 2**20, description="a request head larger gets 431")
    read_timeout_seconds: float = Field(
        10.0, gt=0, le=3600,
        description="a request's head and body must arrive within this of the connection's start (or of the "
        "request's first byte on a kept-alive connection); TLS handshakes too",
    )
    idle_timeout_seconds: float = Field(
        120.0, gt=0, le=86_400, description="a kept-alive connection is closed after this long without a request",
    )
    write_timeout_seconds: float = Field(30.0, gt=0, le=3600, description="a response must be taken within this")
    workers: int = Field(4, ge=1, le=64, description="threads that run requests (connections need none)")
    auth_failures_before_backoff: int = Field(
        5, ge=0, le=1_000_000,
        description="basic-auth failures from one address before it gets 429 for auth_backoff_seconds (0: never)",
    )
    auth_backoff_seconds: float = Field(60.0, gt=0, le=86_400)
    auth_concurrent_verifications: int = Field(
        1, ge=1, le=64, description="PBKDF2 checks at once (one core each); more get 429 at once",
    )

    @field_validator("admin_token", mode="before")
    @classmethod
    def _strip_token(cls, value: Any) -> Any:
        # `echo token > file`, `$(cat file)` and YAML block scalars leave a newline or spaces that no
        # client sends: kept, the right token would always get 401. read_token_file strips alike.
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_security(self) -> HttpSettings:
        from monitor.server.security import check_password_hash_format

        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile must be set together")
        if self.tls_client_cafile is not None and self.tls_certfile is None:
            raise ValueError("tls_client_cafile needs tls_certfile and tls_keyfile")
        for name in ("tls_certfile", "tls_keyfile", "tls_client_cafile", "admin_token_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: file {str(path)!r} does not exist")
        for user, hashed in self.basic_auth_users.items():
            if not user or ":" in user:
                raise ValueError(f"basic_auth_users: user name {user!r} must be non-empty and without ':'")
            problem = check_password_hash_format(hashed.get_secret_value())
            if problem:
                raise ValueError(f"basic_auth_users.{user}: {problem}")
        if self.admin_token is not None and self.admin_token_file is not None:
            raise ValueError("set admin_token or admin_token_file, not both")
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < 16:
            raise ValueError("admin_token must be at least 16 characters (surrounding whitespace is stripped)")
        return self

    @model_validator(mode="after")
    def _check_buffers(self) -> HttpSettings:
        from monitor.server.framing import MAX_BODY_BYTES

        buffered = self.max_connections * (self.max_header_bytes + MAX_BODY_BYTES)
        if buffered > _HTTP_BUFFER_BUDGET:
            raise ValueError(
                f"max_connections × (max_header_bytes + {MAX_BODY_BYTES // 1024} KiB body) = "
                f"{buffered / 2**20:.0f} MiB of request buffers, over {_HTTP_BUFFER_BUDGET // 2**20} MiB: "
                "lower max_connections or max_header_bytes"
            )
        return self


def http_security(http: HttpSettings) -> dict[str, Any]:
    """The HTTP server's TLS context, basic-auth users and admin token, from the ``http:`` settings."""
    from monitor.server.security import is_loopback_host, read_token_file, server_ssl_context

    token: str | None = None
    if http.admin_token is not None:
        token = http.admin_token.get_secret_value()
    elif http.admin_token_file is not None:
        token = read_token_file(http.admin_token_file)
    context = None
    if http.tls_certfile is not None and http.tls_keyfile is not None:
        context = server_ssl_context(http.tls_certfile, http.tls_keyfile, http.tls_client_cafile)
    credentials = [name for name, present in (("the admin token", token is not None),
                                              ("basic-auth passwords", bool(http.basic_auth_users))) if present]
    if credentials and context is None and not is_loopback_host(http.host):
        logger.warning(
            "http: %s will cross the network in clear text: http.host is %r and no TLS is configured "
            "(set http.tls_certfile and http.tls_keyfile, or bind 127.0.0.1 behind a TLS proxy)",
            " and ".join(credentials), http.host,
        )
    return {
        "ssl_context": context,
        "basic_auth_users": {u: h.get_secret_value() for u, h in http.basic_auth_users.items()} or None,
        "admin_token": token,
    }


def http_limits(http: HttpSettings) -> dict[str, Any]:
    """What one HTTP client may hold and how failed basic-auth guesses are refused, from the ``http:`` settings."""
    from monitor.server.http_server import ConnectionLimits
    from monitor.server.security import AuthLimits

    return {
        "limits": ConnectionLimits(
            max_connections=http.max_connections, max_header_bytes=http.max_header_bytes,
            read_timeout=http.read_timeout_seconds, idle_timeout=http.idle_timeout_seconds,
            write_timeout=http.write_timeout_seconds, workers=http.workers,
        ),
        "auth_limits": AuthLimits(
            failures_before_backoff=http.auth_failures_before_backoff, backoff_seconds=http.auth_backoff_seconds,
            concurrent_verifications=http.auth_concurrent_verifications,
        ),
    }
