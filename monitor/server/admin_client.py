"""Calling a running daemon's token-protected admin routes from the command line.

``baseline capture --url``, ``canary repin`` and ``drift explain`` share this: the flags, reading
the token file, TLS verification, and turning HTTP failures into one line and exit status 1. The
call goes through :mod:`monitor.outbound` (``--timeout`` bounds the whole call; no redirects).
"""

from __future__ import annotations

import argparse
import json
import ssl
import urllib.parse
from pathlib import Path
from typing import Any, TextIO

from monitor import outbound

MAX_ANSWER_BYTES = 256 * 2**20  # an admin answer (a drift explanation, a baseline's summary) is far smaller


class AdminCallFailed(Exception):
    """The daemon refused or could not be reached; the message says which."""


def add_admin_flags(parser: argparse.ArgumentParser, url_required: bool = True) -> None:
    if url_required:
        parser.add_argument("--url", required=True, help="the daemon's HTTP address, e.g. http://127.0.0.1:9464")
    parser.add_argument("--token-file", metavar="FILE", help="file holding the admin bearer token (http.admin_token)")
    parser.add_argument("--cafile", metavar="FILE", help="CA bundle to verify an https daemon")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S", help="HTTP timeout (default 30)")


def post_admin(args: argparse.Namespace, path: str, query: dict[str, str]) -> Any:
    """POST to ``path`` with the bearer token from ``--token-file``; the decoded JSON answer.

    Raises ValueError for a missing or unreadable token file (a usage error) and
    :class:`AdminCallFailed` when the daemon answers an error or cannot be reached.
    """
    return call_admin(args, "POST", path, query)


def get_admin(args: argparse.Namespace, path: str, query: dict[str, str]) -> Any:
    """GET ``path`` with the bearer token, like :func:`post_admin` (for read-only admin routes)."""
    return call_admin(args, "GET", path, query)


def call_admin(args: argparse.Namespace, method: str, path: str, query: dict[str, str]) -> Any:
    """One authenticated request to an admin route; the decoded JSON answer (see :func:`post_admin`)."""
    from monitor.server.security import read_token_file

    if urllib.parse.urlsplit(args.url).scheme not in ("http", "https"):
        raise ValueError(f"--url must be the daemon's http:// or https:// address, not {args.url!r}")
    if not args.token_file:
        raise ValueError("--token-file is required with --url (the daemon's http.admin_token)")
    try:
        token = read_token_file(Path(args.token_file))
    except OSError as exc:
        raise ValueError(str(exc)) from None
    url = f"{args.url.rstrip('/')}{path}?{urllib.parse.urlencode(query)}"
    body = b"" if method == "POST" else None
    headers = {"Authorization": f"Bearer {token}"}
    context = ssl.create_default_context(cafile=args.cafile) if args.cafile else None
    try:
        response = outbound.request(url, method=method, body=body, headers=headers, timeout=args.timeout,
                                    max_body=MAX_ANSWER_BYTES, ssl_context=context)
    except outbound.OutboundError as exc:
        raise AdminCallFailed(f"cannot reach {args.url}: {exc}") from None
    if response.status >= 300:
        # shown on a terminal: no escape sequence of the answer's reaches it
        detail = "".join(c if c.isprintable() else " " for c in response.body.decode(errors="replace")).strip()
        raise AdminCallFailed(f"the daemon answered {response.status}: {detail}")
    try:
        return json.loads(response.body.decode())
    except (ValueError, RecursionError):  # RecursionError: an answer nested too deeply
        raise AdminCallFailed(f"the daemon's answer is not JSON ({len(response.body)} bytes)") from None


def fail(command: str, message: str, stderr: TextIO) -> int:
    print(f"embedding-monitor {command}: {message}", file=stderr)
    return 1
