"""What the admin endpoints share: JSON answers and the ``model``/``stream`` query they take.

Components answer admin requests as ``(status, content type, body)`` (see ``exporter.py``); these
helpers keep every endpoint's JSON and its 400 for a missing ``model`` the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

Response = tuple[int, str, bytes]


def json_response(status: int, body: Any) -> Response:
    return status, "application/json", (json.dumps(body, indent=2) + "\n").encode()


def model_and_stream(environ: Mapping[str, Any], *, stream_allowed: bool = True) -> tuple[str, str, Response | None]:
    """The request's ``model`` and optional ``stream``, or the 400 answer when ``model`` is missing."""
    query = parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True)
    model = (query.get("model") or [""])[0]
    stream = (query.get("stream") or [""])[0] if stream_allowed else ""
    if not model:
        wanted = "the query parameter model is required" + (" (and optionally stream)" if stream_allowed else "")
        return model, stream, json_response(400, {"error": wanted})
    return model, stream, None
