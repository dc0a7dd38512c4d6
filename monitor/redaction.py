"""What must never be printed or logged: secret-looking names, and secret query parameters in a line.

The settings redact with it (``config.py``: what ``--print-config`` and error messages show) and
the HTTP server masks request lines with it before logging them, so it lives below both.
"""

from __future__ import annotations

import re

SECRET_WORDS = ("password", "passwd", "secret", "token", "key", "credential", "authorization", "sasl_oauth")
_QUERY_SECRET = re.compile(r"([?&;]([^=&;\s\"]+)=)[^&;\s\"]*")


def looks_secret(name: str) -> bool:
    """Whether a setting, option, header or query parameter called ``name`` holds a secret whose value
    must never be printed or logged (``sasl_plain_password``, ``ssl_keyfile``, ``Authorization``, ...)."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


def mask_query_secrets(text: str) -> str:
    """``text`` with the values of secret-looking URL query parameters replaced by ``***``.

    >>> mask_query_secrets('"GET /admin/x?model=m&token=abc123&api_key=k HTTP/1.1" 401 13')
    '"GET /admin/x?model=m&token=***&api_key=*** HTTP/1.1" 401 13'
    """
    return _QUERY_SECRET.sub(lambda m: m.group(1) + "***" if looks_secret(m.group(2)) else m.group(0), text)
