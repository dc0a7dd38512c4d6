"""JSON embedding events to grouped, validated rows: the half of decoding that needs no state.

Parsing and checking JSON events depends only on the bytes and a few limits, never on what the
daemon has seen, so it can run in a worker process (``monitor.json_workers``) and keep JSON work
off the interpreter that runs kafka-python. What does need state (each model's dimension, the
label budget) is decided afterwards by ``Decoder`` from the per-group counts kept here, in the
order the rules had when everything ran in one place.

This module imports neither the settings nor torch: a worker process stays small.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from monitor.json_events import fast_events
from monitor.records import EmbeddingBatch

__all__ = ["JsonCollection", "JsonCollector", "JsonGroup", "Rejections", "parse_json", "to_matrix", "validate_rows"]

MAX_ID_LENGTH = 512
INVALID = object()
"""What :func:`parse_json` returns for bytes that are no JSON at all."""


@dataclass
class Rejections:
    """Rejected records by (stream, reason), and one detail per reason for the log."""

    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (stream, reason) -> records
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one detail, for the log

    def reject(self, stream: str, reason: str, count: int = 1, detail: str = "") -> None:
        self.rejected[(stream, reason)] += count
        if detail and reason not in self.examples:
            self.examples[reason] = detail


@dataclass
class JsonGroup:
    """The events of one (model, stream, vector length) in one poll, checked as far as data allows.

    ``collected`` events reached the group; ``bad_vector`` of them had components that are no
    numbers; of the numeric rows ``non_finite`` and ``zero`` failed, and ``batch`` holds the rest
    (``None`` when none is left).
    """

    model: str
    stream: str
    length: int
    collected: int
    bad_vector: int
    non_finite: int
    zero: int
    batch: EmbeddingBatch | None


@dataclass
class JsonCollection:
    """What the JSON messages of one poll turned into, before any decision that needs state."""

    groups: list[JsonGroup] = field(default_factory=list)
    rejections: Rejections = field(default_factory=Rejections)


@dataclass
class _Pending:
    """Rows of one (model, stream, length) collected across the poll, before conversion."""

    vectors: list[Any] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    slices: list[str | None] = field(default_factory=list)
    pair_ids: list[str | None] = field(default_factory=list)


class JsonCollector:
    """Parses JSON embedding messages and groups their valid events into float32 matrices.

    Parameters mirror ``LimitSettings`` and the label rule, passed as plain values so that a
    worker process can build one without the settings module.
    """

    def __init__(self, max_rows_per_message: int, max_dimension: int, default_stream: str, label_pattern: str):
        self.max_rows_per_message = int(max_rows_per_message)
        self.max_dimension = int(max_dimension)
        self.default_stream = default_stream
        self._label = re.compile(label_pattern)

    def is_label_value(self, value: Any) -> bool:
        return isinstance(value, str) and self._label.match(value) is not None

    def collect(self, values: list[bytes]) -> JsonCollection:
        """Parse, check and group the values of one poll's JSON messages (none is None or oversize)."""
        out = JsonCollection()
        pending: dict[tuple[str, str, int], _Pending] = {}
        for value in values:
            self._collect_message(value, pending, out.rejections)
        for (model, stream, length), rows in pending.items():
            out.groups.append(self._finish_group(model, stream, length, rows))
        return out

    def _collect_message(self, value: bytes, pending: dict[tuple[str, str, int], _Pending], rejections: Rejections) -> None:
        doc = fast_events(value)
        if doc is None:
            doc = parse_json(value)
        if doc is INVALID:
            rejections.reject(self.default_stream, "bad_json", detail=repr(bytes(value[:80])))
            return
        events = doc if isinstance(doc, list) else [doc]
        if len(events) > self.max_rows_per_message:
            rejections.reject(self.default_stream, "oversize", count=len(events), detail=f"{len(events)} events")
            return
        for event in events:
            self._collect_event(event, pending, rejections)

    def _collect_event(self, event: Any, pending: dict[tuple[str, str, int], _Pending], rejections: Rejections) -> None:
        if not isinstance(event, dict):
            rejections.reject(self.default_stream, "not_object", detail=type(event).__name__)
            return
        stream = event.get("stream", self.default_stream)
        if not self.is_label_value(stream):
            rejections.reject(self.default_stream, "bad_label", detail=f"stream {str(stream)[:80]!r}")
            return
        try:
            model, vector, rid = event["model"], event["vector"], event["id"]
        except KeyError:
            missing = [name for name in ("id", "model", "vector") if name not in event]
            rejections.reject(stream, "missing_field", detail=f"missing {', '.join(missing)}")
            return
        if not self.is_label_value(model):
            rejections.reject(stream, "bad_label", detail=f"model {str(model)[:80]!r}")
            return
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or len(str(rid)) > MAX_ID_LENGTH:
            rejections.reject(stream, "bad_field", detail="id must be a string or integer")
            return
        ts = event.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            rejections.reject(stream, "bad_field", detail="ts must be a number (unix seconds)")
            return
        slice_ = event.get("slice")
        if slice_ is not None and not self.is_label_value(slice_):
            rejections.reject(stream, "bad_label", detail=f"slice {str(slice_)[:80]!r}")
            return
        pair_id = event.get("pair_id")
        if pair_id is not None and (not isinstance(pair_id, (str, int)) or len(str(pair_id)) > MAX_ID_LENGTH):
            rejections.reject(stream, "bad_field", detail="pair_id must be a string or integer")
            return
        if not isinstance(vector, (list, np.ndarray)):  # an array only from the fast path: flat float64
            rejections.reject(stream, "bad_vector", detail=f"vector is {type(vector).__name__}")
            return
        if len(vector) == 0:
            rejections.reject(stream, "empty_vector")
            return
        if len(vector) > self.max_dimension:
            rejections.reject(stream, "dim_too_large", detail=f"{len(vector)} components")
            return
        # Grouped by length too: for a model not seen before, rows of different lengths are
        # converted separately and the first group that holds valid rows fixes the dimension.
        key = (model, stream, len(vector))
        rows = pending.get(key)
        if rows is None:
            rows = pending[key] = _Pending()
        rows.vectors.append(vector)
        rows.ids.append(str(rid))
        rows.timestamps.append(math.nan if ts is None else float(ts))
        rows.slices.append(slice_)
        rows.pair_ids.append(None if pair_id is None else str(pair_id))

    def _finish_group(self, model: str, stream: str, length: int, rows: _Pending) -> JsonGroup:
        keep, matrix = to_matrix(rows.vectors)
        collected = len(rows.vectors)
        group = JsonGroup(model, stream, length, collected, collected - int(keep.sum()), 0, 0, None)
        if matrix.shape[0] == 0:
            return group
        good, sq_norms, group.non_finite, group.zero = validate_rows(matrix)
        idx = np.flatnonzero(keep)[good]
        if idx.size == 0:
            return group
        ts = np.asarray(rows.timestamps, dtype=np.float64)[idx]
        kept = matrix if idx.size == matrix.shape[0] else matrix[good]
        group.batch = EmbeddingBatch(
            model=model,
            stream=stream,
            vectors=np.ascontiguousarray(kept, dtype=np.float32),
            ids=tuple(rows.ids[i] for i in idx),
            timestamps=None if np.isnan(ts).all() else ts,
            slices=_optional([rows.slices[i] for i in idx]),
            pair_ids=_optional([rows.pair_ids[i] for i in idx]),
            norms=np.sqrt(sq_norms if idx.size == matrix.shape[0] else sq_norms[good]),
        )
        return group


def validate_rows(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(good mask, squared norms in float64, non-finite rows, zero rows) of a float32 matrix."""
    n = vectors.shape[0]
    finite = np.isfinite(vectors).all(axis=1)
    if finite.all():
        sq_norms = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64)
    else:
        safe = np.where(finite[:, None], vectors, 0.0)
        sq_norms = np.einsum("ij,ij->i", safe, safe, dtype=np.float64)
    nonzero = sq_norms > 0
    good = finite & nonzero
    return good, sq_norms, int(n - finite.sum()), int((finite & ~nonzero).sum())


def parse_json(value: bytes) -> Any:
    """The general parser: any JSON, or :data:`INVALID`."""
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    # orjson rejects NaN/Infinity tokens, which Python's json.dumps writes: read those with the
    # stdlib so that such a record is counted as non_finite, the reason an operator can act on.
    try:
        return json.loads(value)
    except (ValueError, RecursionError, TypeError):
        return INVALID


def to_matrix(vectors: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of equal length -> (keep mask, float32 matrix of the kept rows).

    One numpy conversion for the common case; a row-by-row pass only when some row holds
    something other than numbers (strings, nulls, nested lists).
    """
    n = len(vectors)
    try:
        matrix = np.array(vectors)
        if matrix.ndim == 2 and matrix.dtype.kind in "fiub":
            with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, counted as non_finite
                return np.ones(n, dtype=bool), matrix.astype(np.float32, copy=False)
    except (ValueError, TypeError, OverflowError):
        pass
    keep = np.zeros(n, dtype=bool)
    good: list[np.ndarray] = []
    for i, row in enumerate(vectors):
        try:
            arr = np.array(row)
        except (ValueError, TypeError, OverflowError):
            continue
        if arr.ndim == 1 and arr.dtype.kind in "fiub":
            keep[i] = True
            with np.errstate(over="ignore", invalid="ignore"):
                good.append(arr.astype(np.float32))
    width = len(vectors[0]) if vectors else 0
    return keep, (np.stack(good) if good else np.empty((0, width), dtype=np.float32))


def _optional(values: list[Any]) -> tuple[Any, ...] | None:
    return tuple(values) if any(v is not None for v in values) else None
