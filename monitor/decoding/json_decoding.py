"""JSON embedding events to grouped, validated rows: the half of decoding that needs no state.

Parsing and checking JSON events depends only on the bytes and a few limits, never on what the
daemon has seen, so it can run in a worker process (``monitor.decoding.json_workers``) and keep JSON work
off the interpreter that runs kafka-python. What does need state (each model's dimension, the
label budget) is decided afterwards by ``Decoder`` from the per-group counts kept here, in the
order the rules had when everything ran in one place.

Nothing here raises on input. The checks reject what they know under its reason, and each record
is also a boundary: an exception nobody foresaw (a bug, or a value no check anticipated) rejects
that record alone under ``decode_error`` and the rest of the poll goes on, in a worker process
and in-process alike (both run :meth:`JsonCollector.collect`).

This module imports neither the settings nor torch: a worker process stays small.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from monitor.decoding.json_events import fast_events
from monitor.decoding.records import EmbeddingBatch

__all__ = [
    "DECODE_ERROR", "JsonCollection", "JsonCollector", "JsonGroup", "Rejections", "check_timestamp", "failure_detail",
    "finite_number", "parse_json", "shown_value", "timestamp_detail", "to_matrix", "validate_rows",
]  # fmt: skip

MAX_ID_LENGTH = 512
INVALID = object()
"""What :func:`parse_json` returns for bytes that are no JSON at all."""
DECODE_ERROR = "decode_error"
"""The reason of a record whose decoding raised: what no check foresaw (see :func:`failure_detail`)."""


@dataclass
class Rejections:
    """Rejected records by (stream, reason), and one detail per reason for the log."""

    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (stream, reason) -> records
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one detail, for the log

    def reject(self, stream: str, reason: str, count: int = 1, detail: str = "") -> None:
        self.rejected[(stream, reason)] += count
        if detail and reason not in self.examples:
            self.examples[reason] = detail

    def merge(self, other: Rejections) -> None:
        """Add ``other``'s rejections (its details where this has none for a reason)."""
        self.rejected.update(other.rejected)
        for reason, detail in other.examples.items():
            self.examples.setdefault(reason, detail)


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

    def split(self) -> Iterator[JsonGroup]:
        """The same records as smaller groups: one with the rows that failed a check, then one per
        valid row (the retry when judging the whole group raised)."""
        failed = self.collected - (0 if self.batch is None else self.batch.size)
        if failed:
            yield dataclasses.replace(self, collected=failed, batch=None)
        if self.batch is not None:
            for i in range(self.batch.size):
                yield JsonGroup(self.model, self.stream, self.length, 1, 0, 0, 0, _row_batch(self.batch, i))


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

    def add(self, row: _Row) -> None:
        self.vectors.append(row.vector)
        self.ids.append(row.rid)
        self.timestamps.append(row.ts)
        self.slices.append(row.slice)
        self.pair_ids.append(row.pair_id)

    def row(self, i: int) -> _Row:
        return _Row(self.vectors[i], self.ids[i], self.timestamps[i], self.slices[i], self.pair_ids[i])


@dataclass(slots=True)
class _Row:
    """One event that passed the checks on its fields, before its vector is converted."""

    vector: Any
    rid: str
    ts: float  # NaN when absent
    slice: str | None
    pair_id: str | None


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
        """Parse, check and group the values of one poll's JSON messages (none is None or oversize).

        Never raises: a message whose parsing raised counts one ``decode_error``, an event whose
        checks raised counts one, and a group whose conversion raised is retried row by row so
        that only the rows that raise alone are lost.
        """
        out = JsonCollection()
        pending: dict[tuple[str, str, int], _Pending] = {}
        for value in values:
            try:
                events = self._events(value, out.rejections)
            except Exception as exc:  # noqa: BLE001 - the record boundary: see the module docstring
                out.rejections.reject(self.default_stream, DECODE_ERROR, detail=failure_detail(exc, "a JSON message"))
                continue
            for event in events:
                try:
                    self._collect_event(event, pending, out.rejections)
                except Exception as exc:  # noqa: BLE001 - the record boundary
                    out.rejections.reject(self._stream_of(event), DECODE_ERROR,
                                          detail=failure_detail(exc, "a JSON embedding event"))  # fmt: skip
        for (model, stream, length), rows in pending.items():
            out.groups.extend(self._finish_contained(model, stream, length, rows, out.rejections))
        return out

    def _events(self, value: bytes, rejections: Rejections) -> list[Any]:
        """The events of one message; [] when the message was rejected as a whole."""
        doc = fast_events(value)
        if doc is None:
            doc = parse_json(value)
        if doc is INVALID:
            rejections.reject(self.default_stream, "bad_json", detail=repr(bytes(value[:80])))
            return []
        events = doc if isinstance(doc, list) else [doc]
        if len(events) > self.max_rows_per_message:
            rejections.reject(self.default_stream, "oversize", count=len(events), detail=f"{len(events)} events")
            return []
        return events

    def _stream_of(self, event: Any) -> str:
        """The stream an event names when it is a valid label, for counting it; else the default."""
        stream = event.get("stream") if isinstance(event, dict) else None
        return stream if isinstance(stream, str) and self.is_label_value(stream) else self.default_stream

    def _collect_event(self, event: Any, pending: dict[tuple[str, str, int], _Pending], rejections: Rejections) -> None:
        """Check one event and add it to its group, or count it under a reason. Everything that
        can raise comes before the appends, so an exception leaves the groups as they were."""
        if not isinstance(event, dict):
            rejections.reject(self.default_stream, "not_object", detail=type(event).__name__)
            return
        stream = event.get("stream", self.default_stream)
        if not self.is_label_value(stream):
            rejections.reject(self.default_stream, "bad_label", detail=f"stream {shown_value(stream)}")
            return
        try:
            model, vector, rid = event["model"], event["vector"], event["id"]
        except KeyError:
            missing = [name for name in ("id", "model", "vector") if name not in event]
            rejections.reject(stream, "missing_field", detail=f"missing {', '.join(missing)}")
            return
        if not self.is_label_value(model):
            rejections.reject(stream, "bad_label", detail=f"model {shown_value(model)}")
            return
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or len(str(rid)) > MAX_ID_LENGTH:
            rejections.reject(stream, "bad_field", detail="id must be a string or integer")
            return
        reason, ts = check_timestamp(event.get("ts"))
        if reason is not None:
            rejections.reject(stream, reason, detail=timestamp_detail(reason, event.get("ts")))
            return
        slice_ = event.get("slice")
        if slice_ is not None and not self.is_label_value(slice_):
            rejections.reject(stream, "bad_label", detail=f"slice {shown_value(slice_)}")
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
        rid, pair_id = str(rid), None if pair_id is None else str(pair_id)
        rows = pending.get(key)
        if rows is None:
            rows = pending[key] = _Pending()
        rows.vectors.append(vector)
        rows.ids.append(rid)
        rows.timestamps.append(ts)
        rows.slices.append(slice_)
        rows.pair_ids.append(pair_id)

    def _finish_contained(
        self, model: str, stream: str, length: int, rows: _Pending, rejections: Rejections
    ) -> list[JsonGroup]:
        """:meth:`_finish_group`, and where it raises, the rows one by one: those that raise
        alone count ``decode_error``, the others make the group."""
        try:
            return [self._finish_group(model, stream, length, rows)]
        except Exception as exc:  # noqa: BLE001 - the record boundary
            first = exc
        survivors = _Pending()
        for i in range(len(rows.vectors)):
            single = _Pending()
            single.add(rows.row(i))
            try:
                self._finish_group(model, stream, length, single)
            except Exception as exc:  # noqa: BLE001 - the record boundary
                rejections.reject(stream, DECODE_ERROR, detail=failure_detail(exc, "a JSON embedding row"))
            else:
                survivors.add(single.row(0))
        if not survivors.vectors:
            return []
        try:
            return [self._finish_group(model, stream, length, survivors)]
        except Exception:  # noqa: BLE001 - rows that pass alone but not together: none is kept
            rejections.reject(stream, DECODE_ERROR, count=len(survivors.vectors),
                              detail=failure_detail(first, "a group of JSON embedding rows"))  # fmt: skip
            return []

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


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a JSON number (not a boolean) that float64 holds finitely;
    else None. Integers beyond float64's range give None, never ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_timestamp(value: Any) -> tuple[str | None, float]:
    """(reason, seconds) for an event's ``ts``: (None, NaN) when absent, ("bad_field", NaN) when
    not a number, ("bad_timestamp", NaN) when a number that is not finite in float64 (NaN,
    Infinity, an integer too large for a float), else (None, the value as a float)."""
    if value is None:
        return None, math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "bad_field", math.nan
    number = finite_number(value)
    if number is None:
        return "bad_timestamp", math.nan
    return None, number


def failure_detail(exc: BaseException, what: str) -> str:
    """What the log says about an exception caught at a record boundary: its type, the line that
    raised it and the start of its message; never the record itself."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    try:
        message = str(exc)[:100]
    except Exception:  # noqa: BLE001 - an exception whose message itself raises
        message = "?"
    return f"{type(exc).__name__}{where} while decoding {what}: {message!r}"


def timestamp_detail(reason: str, value: Any) -> str:
    """The log's detail for a ``ts`` that :func:`check_timestamp` rejected under ``reason``."""
    if reason == "bad_field":
        return "ts must be a number (unix seconds)"
    return f"ts must be finite unix seconds, got {shown_value(value)}"


def _row_batch(batch: EmbeddingBatch, i: int) -> EmbeddingBatch:
    """Row ``i`` of ``batch`` as a batch of its own."""

    def one(values: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
        return None if values is None else _optional([values[i]])

    return dataclasses.replace(
        batch,
        vectors=np.ascontiguousarray(batch.vectors[i : i + 1]),
        ids=None if batch.ids is None else (batch.ids[i],),
        timestamps=None if batch.timestamps is None or np.isnan(batch.timestamps[i]) else batch.timestamps[i : i + 1],
        slices=one(batch.slices),
        pair_ids=one(batch.pair_ids),
        norms=None if batch.norms is None else batch.norms[i : i + 1],
    )


def shown_value(value: Any, limit: int = 80) -> str:
    """The start of a rejected field's value for the log (``str`` of a nested value may be huge)."""
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)}>"
    return repr(str(value)[:limit])


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
    # The stdlib's nesting limit is the recursion limit less the caller's stack, which differs
    # between a worker process and the poll thread (and hypothesis raises the limit): a fixed
    # limit first, so that a message gets the same verdict wherever it is decoded.
    if _nesting(value) > STDLIB_MAX_DEPTH:
        return INVALID
    try:
        return json.loads(value)
    except (ValueError, RecursionError, TypeError):
        return INVALID


STDLIB_MAX_DEPTH = 512
"""Deepest nesting the stdlib fallback of :func:`parse_json` reads (orjson's own limit is 1024)."""
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _nesting(value: bytes) -> int:
    """How deep ``value``'s arrays and objects nest, brackets inside strings left out."""
    codes = np.frombuffer(_JSON_STRING.sub(b"", value), dtype=np.uint8)
    step = ((codes == ord("[")) | (codes == ord("{"))).astype(np.int32)
    step -= (codes == ord("]")) | (codes == ord("}"))
    return int(np.cumsum(step).max(initial=0))


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
