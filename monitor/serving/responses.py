"""Reading an embedding endpoint's answer: bytes from outside, checked before any number is used.

:func:`parse_embeddings` turns a response body into one row per input text, or raises
:class:`ServingError` with the reason the whole answer is unusable (``html``, ``not_json``,
``bad_response``, ``ragged``, ``oversized``). A row that is there but unusable (``empty``, ``zero``,
``non_finite``, ``wrong_dimension``) is returned as ``None`` and its reason counted: the other rows
of the answer still count. Standard library and numpy only.

Examples
--------
>>> answer = b'{"data": [{"index": 1, "embedding": [0, 0]}, {"index": 0, "embedding": [1, 2]}]}'
>>> rows, invalid = parse_embeddings(answer, count=2, dim=2)
>>> [None if r is None else r.tolist() for r in rows], dict(invalid)
([[1.0, 2.0], None], {'zero': 1})
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.outbound import OutboundError, parse_json
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.ids_path import follow_path, parse_ids_path

MAX_RESPONSE_BYTES = 64 * 2**20
MAX_DIM = 16_384  # the dimension assumed before the first answer tells it
# why a whole request failed (embmon_serving_errors_total{reason}); bounded
ERROR_REASONS = ("connect", "timeout", "rate_limited", "auth", "http_error", "html", "not_json", "bad_response",
                 "ragged", "oversized", "encoder", "redirect")
# why one returned vector is unusable (embmon_serving_invalid_vectors_total{reason}); bounded
INVALID_REASONS = ("empty", "zero", "non_finite", "wrong_dimension")
OPENAI_PATH = parse_ids_path("data[*].embedding")


class ServingError(Exception):
    """A request whose answer cannot be used; ``reason`` is one of :data:`ERROR_REASONS`.
    The message never holds a header, an API key or a URL's query."""

    def __init__(self, reason: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        assert reason in ERROR_REASONS, reason
        self.reason = reason
        self.retry_after = retry_after


def parse_embeddings(
    raw: bytes, count: int, dim: int | None, steps: Sequence[tuple[str, str]] = OPENAI_PATH,
    content_type: str = "application/json", max_values: int | None = None,
) -> tuple[list[np.ndarray | None], Counter[str]]:
    """``count`` rows (float64) read from ``raw`` at ``steps``; see the module docstring. The answer
    may hold at most ``max_values`` JSON values (default: ``count`` rows of ``dim`` numbers, or of
    :data:`MAX_DIM` when ``dim`` is unknown, plus some wrapping): more is ``oversized``."""
    if len(raw) > MAX_RESPONSE_BYTES:
        raise ServingError("oversized", f"answer larger than {MAX_RESPONSE_BYTES} bytes")
    if max_values is None:
        max_values = count * ((dim or MAX_DIM) + 64) + 4096
    head = raw[:256].lstrip().lower()
    if "html" in content_type.lower() or head.startswith((b"<!doctype", b"<html", b"<")):
        raise ServingError("html", "the endpoint answered with HTML (a proxy or login page?)")
    try:
        document = parse_json(raw, max_values)
    except OutboundError as exc:
        raise ServingError("oversized", str(exc)) from None
    except ValueError:
        raise ServingError("not_json", f"the answer is not JSON ({len(raw)} bytes)") from None
    if steps == OPENAI_PATH:
        document = _in_index_order(document)
    try:
        nodes = follow_path(document, steps)
    except ProbeError as exc:
        raise ServingError("bad_response", str(exc)) from None
    if len(nodes) != count:
        raise ServingError("bad_response", f"{len(nodes)} vectors for {count} inputs")
    if not all(isinstance(node, list) for node in nodes):
        raise ServingError("bad_response", "a vector is not a JSON list")
    if len({len(node) for node in nodes if node}) > 1:
        raise ServingError("ragged", "the vectors of one answer differ in length")
    rows: list[np.ndarray | None] = []
    invalid: Counter[str] = Counter()
    for node in nodes:
        reason, row = _row(node, dim)
        if reason is not None:
            invalid[reason] += 1
        rows.append(row)
    return rows, invalid


def check_rows(rows: np.ndarray, dim: int | None) -> tuple[list[np.ndarray | None], Counter[str]]:
    """The same row checks for an in-process encoder's matrix."""
    out: list[np.ndarray | None] = []
    invalid: Counter[str] = Counter()
    for row in np.asarray(rows, dtype=np.float64).reshape(len(rows), -1):
        reason, checked = _array_row(row, dim)
        if reason is not None:
            invalid[reason] += 1
        out.append(checked)
    return out, invalid


def _in_index_order(document: Any) -> Any:
    """OpenAI's ``data`` sorted by each item's ``index`` when every item has a distinct integer one."""
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        items = document["data"]
        indexes = [item.get("index") if isinstance(item, dict) else None for item in items]
        if all(type(i) is int for i in indexes) and sorted(indexes) == list(range(len(items))):  # type: ignore[type-var]
            order: dict[int, Any] = dict(zip(indexes, items, strict=True))  # type: ignore[arg-type]
            return {**document, "data": [order[i] for i in range(len(items))]}
    return document


def _row(node: list[Any], dim: int | None) -> tuple[str | None, np.ndarray | None]:
    if not node:
        return "empty", None
    if not all(type(v) in (int, float) for v in node):
        raise ServingError("bad_response", "a vector holds something other than numbers")
    if not all(math.isfinite(v) for v in node if type(v) is float):
        return "non_finite", None
    try:
        row = np.asarray(node, dtype=np.float64)
    except OverflowError:  # an integer beyond float range
        return "non_finite", None
    return _array_row(row, dim)


def _array_row(row: np.ndarray, dim: int | None) -> tuple[str | None, np.ndarray | None]:
    if row.size == 0:
        return "empty", None
    if not np.all(np.isfinite(row)):
        return "non_finite", None
    if dim is not None and row.size != dim:
        return "wrong_dimension", None
    scale = float(np.max(np.abs(row)))
    if scale == 0.0 or not math.isfinite(float(np.linalg.norm(row / scale)) * scale):
        return ("zero", None) if scale == 0.0 else ("non_finite", None)
    return None, row
