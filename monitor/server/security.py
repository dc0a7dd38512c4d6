"""Credentials for the HTTP port: password hashes for basic auth, the admin token, TLS contexts.

Passwords are stored as PBKDF2-HMAC-SHA256 hashes in Django's format, verifiable with the
standard library alone::

    pbkdf2_sha256$<iterations>$<salt>$<base64 of the 32-byte derived key>

Make one with ``python -m monitor.server.security hash`` (reads the password from stdin or a prompt).
Every comparison of a secret is constant-time (``hmac.compare_digest``).

Examples
--------
>>> hashed = hash_password("correct horse", salt="saltsaltsalt", iterations=100_000)
>>> hashed.split("$")[:3]
['pbkdf2_sha256', '100000', 'saltsaltsalt']
>>> verify_password("correct horse", hashed), verify_password("wrong", hashed)
(True, False)
"""

from __future__ import annotations

import argparse
import base64
import binascii
import getpass
import hashlib
import hmac
import ipaddress
import re
import secrets
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from monitor.errors import ConfigError

ALGORITHM = "pbkdf2_sha256"
MIN_TOKEN_LENGTH = 16
# parts of a name that mark its value as secret (settings keys, kafka options, headers, query parameters)
DEFAULT_ITERATIONS = 600_000  # OWASP 2023 recommendation for PBKDF2-HMAC-SHA256
MIN_ITERATIONS = 100_000
_CACHE_LIMIT = 64  # remembered credentials that passed
_REFUSED_LIMIT = 256  # and that failed
_ADDRESS_LIMIT = 4096  # client addresses whose failures are counted


def hash_password(password: str, salt: str | None = None, iterations: int = DEFAULT_ITERATIONS) -> str:
    """The ``pbkdf2_sha256$...`` hash of ``password`` (a fresh random salt unless given)."""
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"iterations must be at least {MIN_ITERATIONS}")
    salt = salt or secrets.token_urlsafe(16)
    if "$" in salt:
        raise ValueError("salt must not contain '$'")
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"{ALGORITHM}${iterations}${salt}${base64.b64encode(key).decode()}"


def check_password_hash_format(hashed: str) -> str | None:
    """None when ``hashed`` is a usable hash, else what is wrong with it (never echoes the hash)."""
    parts = hashed.split("$")
    if len(parts) != 4 or parts[0] != ALGORITHM:
        return (
            f"must be {ALGORITHM}$<iterations>$<salt>$<base64 key>"
            " (make one with python -m monitor.server.security hash)"
        )
    if not parts[1].isdigit() or int(parts[1]) < MIN_ITERATIONS:
        return f"iterations must be an integer >= {MIN_ITERATIONS}"
    if not parts[2]:
        return "the salt is empty"
    try:
        key = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return "the key is not valid base64"
    if len(key) != 32:
        return "the key must be 32 bytes (sha256)"
    return None


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches ``hashed`` (constant-time comparison of the derived keys)."""
    if check_password_hash_format(hashed) is not None:
        return False
    _, iterations, salt, encoded = hashed.split("$")
    expected = base64.b64decode(encoded)
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), int(iterations))
    return hmac.compare_digest(key, expected)


@dataclass(frozen=True)
class AuthLimits:
    """How failed basic-auth guesses are refused (settings ``http.auth_*``, docs/operations.md)."""

    failures_before_backoff: int  # PBKDF2-checked failures from one address before it waits; 0: never
    backoff_seconds: float  # how long it then waits (429 without a hash)
    concurrent_verifications: int  # PBKDF2 checks running at once; more get 429 at once


class Verdict(NamedTuple):
    """What :meth:`BasicAuth.check` decided: ``ok``, else refused; ``retry_after`` > 0: not even checked
    (the address is backing off, or the verifications are all busy): answer 429 with Retry-After."""

    ok: bool
    retry_after: float = 0.0


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against ``{user: hash}``, cheaply for what it saw before.

    * Unknown users are checked against a dummy hash with the users' iteration count (the largest,
      should they differ), so the answer's timing does not tell which user names exist.
    * Every PBKDF2 result is remembered under a keyed digest of the header and the stored hash (as
      Prometheus' exporter-toolkit caches its bcrypt results): a scrape every 15 s costs one hash
      per process, a scraper with a wrong password one hash in all. Successes and failures are
      kept apart, so a flood of distinct guesses cannot push a working credential out.
    * After ``failures_before_backoff`` failures from one client address (within
      ``backoff_seconds`` of each other), that address gets 429 for ``backoff_seconds`` without a
      hash being run; remembered credentials still pass (the scraper may share the address).
    * At most ``concurrent_verifications`` hashes run at once (hashlib releases the GIL: one hash
      is one core); one more gets 429 at once instead of waiting, so a flood cannot take every
      core or every HTTP worker.
    """

    def __init__(self, users: Mapping[str, str], limits: AuthLimits, clock: Callable[[], float] = time.monotonic):
        self._users = dict(users)
        self._limits = limits
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._passed: OrderedDict[bytes, None] = OrderedDict()
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._failures: OrderedDict[str, tuple[int, float, float]] = OrderedDict()  # address -> count, last, until
        self._lock = threading.Lock()
        self._hashing = threading.BoundedSemaphore(limits.concurrent_verifications)
        iterations = max((int(h.split("$")[1]) for h in self._users.values() if check_password_hash_format(h) is None),
                         default=DEFAULT_ITERATIONS)
        self._dummy = hash_password(secrets.token_hex(8), iterations=iterations)

    def check(self, header: str, client: str = "") -> Verdict:
        """Whether ``header`` (an ``Authorization`` value) holds a configured user's password."""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic" or not encoded:
            return Verdict(False)
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError):
            return Verdict(False)
        user, sep, password = decoded.partition(":")
        if not sep:
            return Verdict(False)
        hashed = self._users.get(user)
        stored = self._dummy if hashed is None else hashed
        digest = hmac.new(self._key, f"{decoded}\0{stored}".encode(), hashlib.sha256).digest()
        now = self._clock()
        with self._lock:
            for seen, ok in ((self._passed, True), (self._refused, False)):
                if digest in seen:
                    seen.move_to_end(digest)
                    return Verdict(ok)
            wait = self._backing_off(client, now)
        if wait > 0:
            return Verdict(False, wait)
        if not self._hashing.acquire(blocking=False):
            return Verdict(False, 1.0)
        try:
            ok = verify_password(password, stored) and hashed is not None
        finally:
            self._hashing.release()
        with self._lock:
            _remember(self._passed if ok else self._refused, digest, _CACHE_LIMIT if ok else _REFUSED_LIMIT)
            self._count(client, ok, self._clock())
        return Verdict(ok)

    def _backing_off(self, client: str, now: float) -> float:
        until = self._failures.get(client, (0, 0.0, 0.0))[2]
        return until - now if until > now else 0.0

    def _count(self, client: str, ok: bool, now: float) -> None:
        limit = self._limits.failures_before_backoff
        if ok or limit == 0:
            self._failures.pop(client, None)
            return
        count, last, until = self._failures.pop(client, (0, 0.0, 0.0))
        if 0 < until <= now or now - last > self._limits.backoff_seconds:
            count = 0  # a served back-off, or failures long ago, start the count again
        count += 1
        until = now + self._limits.backoff_seconds if count >= limit else 0.0
        self._failures[client] = (count, now, until)
        while len(self._failures) > _ADDRESS_LIMIT:
            self._failures.popitem(last=False)


def _remember(seen: OrderedDict[bytes, None], digest: bytes, limit: int) -> None:
    seen[digest] = None
    seen.move_to_end(digest)
    while len(seen) > limit:
        seen.popitem(last=False)


def bearer_matches(header: str, token: str) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def is_loopback_host(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this machine only (``""`` is every interface).

    >>> [is_loopback_host(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "", "10.0.0.5")]
    [True, True, True, False, False, False]
    """
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" or a host name: it may resolve to anything


def read_token_file(path: Path, setting: str = "http.admin_token_file") -> str:
    """The token in ``path``, surrounding whitespace stripped. Raises :class:`ConfigError` (a ValueError)
    naming ``setting`` and the file, never showing the file's content, when it cannot be read, is not
    UTF-8 or is shorter than :data:`MIN_TOKEN_LENGTH` characters."""
    try:
        token = Path(path).read_bytes().decode("utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{setting}: {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}: {path} is not UTF-8 text") from None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{setting}: {path}: the token must be at least {MIN_TOKEN_LENGTH} characters (it has {len(token)} "
            "after stripping surrounding whitespace); python -m monitor.server.security token makes one"
        )
    return token


def server_ssl_context(certfile: Path, keyfile: Path, client_cafile: Path | None = None) -> ssl.SSLContext:
    """A TLS 1.2+ server context; with ``client_cafile``, clients must present a certificate.

    A file OpenSSL cannot load (not PEM, the wrong kind, an encrypted key, a key that does not match
    the certificate) raises :class:`ConfigError` naming the setting and the path; OpenSSL's own
    message ("[SSL] PEM lib") names neither.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=str(certfile), keyfile=str(keyfile), password=_no_key_password(keyfile))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(_cert_chain_problem(certfile, keyfile, exc)) from None
    if client_cafile is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(cafile=str(client_cafile))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"http.tls_client_cafile: {client_cafile}: cannot load the CA certificates "
                f"(PEM expected): {_ssl_reason(exc)}"
            ) from None
    return context


def _no_key_password(keyfile: Path) -> Callable[[], bytes]:
    """A password callback refusing an encrypted key: OpenSSL would otherwise prompt on the terminal."""

    def refuse() -> bytes:
        raise ConfigError(
            f"http.tls_keyfile: {keyfile}: the private key is encrypted; give the daemon an unencrypted one"
        )

    return refuse


def _cert_chain_problem(certfile: Path, keyfile: Path, exc: Exception) -> str:
    """Which of the two files is at fault, as far as their PEM headers tell."""
    reason = _ssl_reason(exc)
    if b"-----BEGIN CERTIFICATE-----" not in _head(certfile):
        return f"http.tls_certfile: {certfile} is not a PEM certificate: {reason}"
    if b"PRIVATE KEY-----" not in _head(keyfile):
        return f"http.tls_keyfile: {keyfile} is not a PEM private key: {reason}"
    return (
        f"http.tls_certfile {certfile} and http.tls_keyfile {keyfile}: cannot be loaded together "
        f"(does the key belong to the certificate?): {reason}"
    )


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return b""


def _ssl_reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(exc.reason or exc.strerror or exc))
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitor.server.security", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("hash", help="print the pbkdf2_sha256 hash of a password for http.basic_auth_users")
    make.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    sub.add_parser("token", help="print a random admin token")
    args = parser.parse_args(argv)
    if args.command == "token":
        print(secrets.token_urlsafe(32))
        return 0
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("empty password", file=sys.stderr)
        return 2
    print(hash_password(password, iterations=args.iterations))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
