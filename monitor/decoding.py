"""Bytes to validated records, or a counted reason why not.

Two wire formats carry embeddings (see README "Message formats"):

* a JSON event ``{"id", "model", "vector", "ts"?, "stream"?, "slice"?, "pair_id"?}`` (or a JSON
  array of such events in one message);
* a binary batch: the value is little-endian float32 rows of one model, the headers carry
  ``model`` and ``dim`` (and optionally ``stream``). A ``dim`` header is what marks a message binary.

Decoding works on all the messages of one poll at once, so that the rows of a (model, stream)
become one float32 matrix with one numpy conversion, and validation (finite, non-zero, dimension)
is vectorised. Nothing here raises on bad input: every rejected record is counted by reason.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from monitor.config import LimitSettings
from monitor.labels import is_label_value
from monitor.records import EmbeddingBatch, InteractionEvent

logger = logging.getLogger(__name__)

# The closed set of rejection reasons (the `reason` label of embmon_records_invalid_total).
REASONS = (
    "oversize",  # message larger than limits.max_message_bytes, or too many rows in one message
    "bad_json",  # not parseable as JSON (or as text at all)
    "not_object",  # JSON that is not an object (or array of objects)
    "missing_field",  # id, model or vector absent
    "bad_field",  # a field of the wrong type (id not a string/number, ts not a number, ...)
    "bad_label",  # model/stream/slice not a valid label value (charset, 64 chars max)
    "bad_vector",  # vector not a flat list of numbers
    "empty_vector",
    "dim_too_large",  # more components than limits.max_dimension
    "dim_mismatch",  # not the dimension this model was declared with or first seen with
    "non_finite",  # NaN or +-Inf component
    "zero_vector",  # all zeros: no direction, cannot be normalised (a classic pooling bug)
    "bad_header",  # binary batch with missing or invalid model/dim headers
    "bad_binary",  # binary value whose length is not a whole number of rows
    "label_limit",  # a new model or stream beyond the label budget
)

MAX_RESULTS_PER_INTERACTION = 1000
MAX_ID_LENGTH = 512


@dataclass
class DecodeResult:
    """What one poll's messages turned into."""

    batches: list[EmbeddingBatch] = field(default_factory=list)
    interactions: list[InteractionEvent] = field(default_factory=list)
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)  # (stream, reason) -> records
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one detail, for the log

    def reject(self, stream: str, reason: str, count: int = 1, detail: str = "") -> None:
        self.rejected[(stream, reason)] += count
        if detail and reason not in self.examples:
            self.examples[reason] = detail


@dataclass
class _Pending:
    """Rows of one (model, stream) collected across the poll, before conversion."""

    vectors: list[Any] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    timestamps: list[float] = field(default_factory=list)
    slices: list[str | None] = field(default_factory=list)
    pair_ids: list[str | None] = field(default_factory=list)


AdmitFn = Callable[[str, str], bool]


class Decoder:
    """Turns raw message values into validated batches; remembers each model's dimension.

    ``admit(model, stream)`` is the label budget (the state registry's), asked before a new
    (model, stream) is let in. ``dims`` maps model -> dimension: declared ones come from the
    configuration, the others are fixed by the first valid record seen.
    """

    def __init__(
        self,
        limits: LimitSettings,
        default_stream: str = "default",
        declared_dims: dict[str, int] | None = None,
        admit: AdmitFn | None = None,
        admit_model: Callable[[str], bool] | None = None,
    ):
        self.limits = limits
        self.default_stream = default_stream
        self.dims: dict[str, int] = dict(declared_dims or {})
        self._admit = admit or (lambda model, stream: True)
        self._admit_model = admit_model or (lambda model: True)

    # ----------------------------------------------------------------- embeddings
    def decode_embeddings(self, messages: Iterable[tuple[bytes, Sequence[tuple[str, bytes]]]]) -> DecodeResult:
        """Decode the (value, headers) pairs of one poll from the embeddings topic."""
        result = DecodeResult()
        pending: dict[tuple[str, str, int], _Pending] = defaultdict(_Pending)
        binary: dict[tuple[str, str, int], list[np.ndarray]] = defaultdict(list)
        for value, headers in messages:
            if value is None:
                result.reject(self.default_stream, "bad_json", detail="empty (tombstone) message")
                continue
            if len(value) > self.limits.max_message_bytes:
                result.reject(self.default_stream, "oversize", detail=f"{len(value)} bytes")
                continue
            header_map = _headers(headers)
            if "dim" in header_map:
                self._collect_binary(value, header_map, binary, result)
            else:
                self._collect_json(value, pending, result)
        # All binary rows of a (model, stream) in this poll become one matrix: one validation pass
        # and one rank-k statistics update instead of one per message.
        for (model, stream, _dim), blocks in binary.items():
            matrix = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
            self._accept_rows(model, stream, matrix, None, None, None, None, result)
        for (model, stream, _length), rows in pending.items():
            self._finish_json_group(model, stream, rows, result)
        return result

    def _collect_binary(
        self,
        value: bytes,
        headers: dict[str, str],
        binary: dict[tuple[str, str, int], list[np.ndarray]],
        result: DecodeResult,
    ) -> None:
        stream = headers.get("stream") or self.default_stream
        model = headers.get("model")
        if not is_label_value(stream):
            result.reject(self.default_stream, "bad_label", detail=f"stream header {stream[:80]!r}")
            return
        if model is None:
            result.reject(stream, "bad_header", detail="binary batch without a model header")
            return
        if not is_label_value(model):
            result.reject(stream, "bad_label", detail=f"model header {model[:80]!r}")
            return
        try:
            dim = int(headers["dim"])
        except ValueError:
            result.reject(stream, "bad_header", detail=f"dim header {headers['dim'][:40]!r}")
            return
        if dim < 1:
            result.reject(stream, "bad_header", detail=f"dim header {dim}")
            return
        if dim > self.limits.max_dimension:
            result.reject(stream, "dim_too_large", detail=f"dim {dim}")
            return
        row_bytes = 4 * dim
        if not value or len(value) % row_bytes:
            result.reject(stream, "bad_binary", detail=f"{len(value)} bytes is not a multiple of 4*{dim}")
            return
        n = len(value) // row_bytes
        if n > self.limits.max_rows_per_message:
            result.reject(stream, "oversize", count=n, detail=f"{n} rows in one message")
            return
        vectors = np.frombuffer(value, dtype="<f4").reshape(n, dim)
        if vectors.dtype != np.float32:  # big-endian host
            vectors = vectors.astype(np.float32)
        binary[(model, stream, dim)].append(vectors)

    def _collect_json(self, value: bytes, pending: dict[tuple[str, str, int], _Pending], result: DecodeResult) -> None:
        doc = _parse_json(value)
        if doc is _INVALID:
            result.reject(self.default_stream, "bad_json", detail=_preview(value))
            return
        events = doc if isinstance(doc, list) else [doc]
        if len(events) > self.limits.max_rows_per_message:
            result.reject(self.default_stream, "oversize", count=len(events), detail=f"{len(events)} events")
            return
        for event in events:
            self._collect_event(event, pending, result)

    def _collect_event(self, event: Any, pending: dict[tuple[str, str, int], _Pending], result: DecodeResult) -> None:
        if not isinstance(event, dict):
            result.reject(self.default_stream, "not_object", detail=type(event).__name__)
            return
        stream = event.get("stream", self.default_stream)
        if not is_label_value(stream):
            result.reject(self.default_stream, "bad_label", detail=f"stream {str(stream)[:80]!r}")
            return
        try:
            model, vector, rid = event["model"], event["vector"], event["id"]
        except KeyError:
            missing = [name for name in ("id", "model", "vector") if name not in event]
            result.reject(stream, "missing_field", detail=f"missing {', '.join(missing)}")
            return
        if not is_label_value(model):
            result.reject(stream, "bad_label", detail=f"model {str(model)[:80]!r}")
            return
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or len(str(rid)) > MAX_ID_LENGTH:
            result.reject(stream, "bad_field", detail="id must be a string or integer")
            return
        ts = event.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            result.reject(stream, "bad_field", detail="ts must be a number (unix seconds)")
            return
        slice_ = event.get("slice")
        if slice_ is not None and not is_label_value(slice_):
            result.reject(stream, "bad_label", detail=f"slice {str(slice_)[:80]!r}")
            return
        pair_id = event.get("pair_id")
        if pair_id is not None and (not isinstance(pair_id, (str, int)) or len(str(pair_id)) > MAX_ID_LENGTH):
            result.reject(stream, "bad_field", detail="pair_id must be a string or integer")
            return
        if not isinstance(vector, list):
            result.reject(stream, "bad_vector", detail=f"vector is {type(vector).__name__}")
            return
        if not vector:
            result.reject(stream, "empty_vector")
            return
        if len(vector) > self.limits.max_dimension:
            result.reject(stream, "dim_too_large", detail=f"{len(vector)} components")
            return
        expected = self.dims.get(model)
        if expected is not None and len(vector) != expected:
            result.reject(stream, "dim_mismatch", detail=f"model {model} has dim {expected}, got {len(vector)}")
            return
        # Grouped by length too: for a model not seen before, rows of different lengths are
        # converted separately and the first group that holds valid rows fixes the dimension.
        rows = pending[(model, stream, len(vector))]
        rows.vectors.append(vector)
        rows.ids.append(str(rid))
        rows.timestamps.append(math.nan if ts is None else float(ts))
        rows.slices.append(slice_)
        rows.pair_ids.append(None if pair_id is None else str(pair_id))

    def _finish_json_group(self, model: str, stream: str, rows: _Pending, result: DecodeResult) -> None:
        keep, matrix = _to_matrix(rows.vectors)
        rejected_shape = len(rows.vectors) - int(keep.sum())
        if rejected_shape:
            result.reject(stream, "bad_vector", count=rejected_shape, detail="vector components must be numbers")
        if matrix.shape[0] == 0:
            return
        idx = np.flatnonzero(keep)
        ts = np.asarray(rows.timestamps, dtype=np.float64)[idx]
        self._accept_rows(
            model,
            stream,
            matrix,
            tuple(rows.ids[i] for i in idx),
            None if np.isnan(ts).all() else ts,
            _optional([rows.slices[i] for i in idx]),
            _optional([rows.pair_ids[i] for i in idx]),
            result,
        )

    def _accept_rows(
        self,
        model: str,
        stream: str,
        vectors: np.ndarray,
        ids: tuple[str, ...] | None,
        timestamps: np.ndarray | None,
        slices: tuple[str | None, ...] | None,
        pair_ids: tuple[str | None, ...] | None,
        result: DecodeResult,
    ) -> None:
        n, dim = vectors.shape
        expected = self.dims.get(model)
        if expected is not None and dim != expected:
            result.reject(stream, "dim_mismatch", count=n, detail=f"model {model} has dim {expected}, got {dim}")
            return
        if not self._admit(model, stream):
            result.reject(stream, "label_limit", count=n, detail=f"model {model!r} stream {stream!r}")
            return
        finite = np.isfinite(vectors).all(axis=1)
        sq_norms = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64) if finite.all() else None
        if sq_norms is None:
            safe = np.where(finite[:, None], vectors, 0.0)
            sq_norms = np.einsum("ij,ij->i", safe, safe, dtype=np.float64)
        nonzero = sq_norms > 0
        good = finite & nonzero
        bad_finite = int(n - finite.sum())
        bad_zero = int((finite & ~nonzero).sum())
        if bad_finite:
            result.reject(stream, "non_finite", count=bad_finite, detail=f"model {model}")
        if bad_zero:
            result.reject(stream, "zero_vector", count=bad_zero, detail=f"model {model}")
        if not good.any():
            return
        if not good.all():
            idx = np.flatnonzero(good)
            vectors = vectors[idx]
            ids = None if ids is None else tuple(ids[i] for i in idx)
            timestamps = None if timestamps is None else timestamps[idx]
            slices = None if slices is None else tuple(slices[i] for i in idx)
            pair_ids = None if pair_ids is None else tuple(pair_ids[i] for i in idx)
            sq_norms = sq_norms[idx]
        self.dims.setdefault(model, dim)
        result.batches.append(
            EmbeddingBatch(
                model=model,
                stream=stream,
                vectors=np.ascontiguousarray(vectors, dtype=np.float32),
                ids=ids,
                timestamps=timestamps,
                slices=slices,
                pair_ids=pair_ids,
                norms=np.sqrt(sq_norms),
            )
        )

    # --------------------------------------------------------------- interactions
    def decode_interactions(
        self, messages: Iterable[tuple[bytes, Sequence[tuple[str, bytes]]]], stream: str = "interactions"
    ) -> DecodeResult:
        """Decode the messages of one poll from the interactions topic (JSON only)."""
        result = DecodeResult()
        for value, _headers in messages:
            if value is None:
                result.reject(stream, "bad_json", detail="empty (tombstone) message")
                continue
            if len(value) > self.limits.max_message_bytes:
                result.reject(stream, "oversize", detail=f"{len(value)} bytes")
                continue
            doc = _parse_json(value)
            if doc is _INVALID:
                result.reject(stream, "bad_json", detail=_preview(value))
                continue
            events = doc if isinstance(doc, list) else [doc]
            if len(events) > self.limits.max_rows_per_message:
                result.reject(stream, "oversize", count=len(events))
                continue
            for event in events:
                parsed = self._interaction(event, stream, result)
                if parsed is not None:
                    result.interactions.append(parsed)
        return result

    def _interaction(self, event: Any, stream: str, result: DecodeResult) -> InteractionEvent | None:
        if not isinstance(event, dict):
            result.reject(stream, "not_object", detail=type(event).__name__)
            return None
        model = event.get("model")
        if model is None:
            result.reject(stream, "missing_field", detail="missing model")
            return None
        if not is_label_value(model):
            result.reject(stream, "bad_label", detail=f"model {str(model)[:80]!r}")
            return None
        slice_ = event.get("slice")
        if slice_ is not None and not is_label_value(slice_):
            result.reject(stream, "bad_label", detail=f"slice {str(slice_)[:80]!r}")
            return None
        query_id = event.get("query_id")
        if query_id is not None and (not isinstance(query_id, (str, int)) or isinstance(query_id, bool)):
            result.reject(stream, "bad_field", detail="query_id must be a string or integer")
            return None
        ts = event.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            result.reject(stream, "bad_field", detail="ts must be a number")
            return None
        try:
            results = _id_list(event.get("results", []))
            clicks = _id_list(event.get("clicks", []))
            relevance = _relevance(event.get("relevance", {}))
        except ValueError as exc:
            result.reject(stream, "bad_field", detail=str(exc))
            return None
        query_vector = None
        raw_vector = event.get("query_vector")
        if raw_vector is not None:
            reason, query_vector = self._query_vector(model, raw_vector)
            if reason:
                result.reject(stream, reason, detail=f"query_vector of model {model}")
                return None
        if not self._admit_model(model):
            result.reject(stream, "label_limit", detail=f"model {model!r}")
            return None
        return InteractionEvent(
            model=model,
            query_id=None if query_id is None else str(query_id),
            query_vector=query_vector,
            results=results,
            clicks=clicks,
            relevance=relevance,
            slice=slice_,
            ts=None if ts is None else float(ts),
        )

    def _query_vector(self, model: str, raw: Any) -> tuple[str | None, np.ndarray | None]:
        if not isinstance(raw, list):
            return "bad_vector", None
        if not raw:
            return "empty_vector", None
        if len(raw) > self.limits.max_dimension:
            return "dim_too_large", None
        keep, matrix = _to_matrix([raw])
        if not keep[0]:
            return "bad_vector", None
        vector = matrix[0]
        if not np.isfinite(vector).all():
            return "non_finite", None
        if not np.any(vector):
            return "zero_vector", None
        expected = self.dims.get(model)
        if expected is not None and vector.shape[0] != expected:
            return "dim_mismatch", None
        return None, vector


_INVALID = object()


def _parse_json(value: bytes) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        pass
    # orjson rejects NaN/Infinity tokens, which Python's json.dumps writes: read those with the
    # stdlib so that such a record is counted as non_finite, the reason an operator can act on.
    try:
        return json.loads(value)
    except (ValueError, RecursionError, TypeError):
        return _INVALID


def _to_matrix(vectors: list[Any]) -> tuple[np.ndarray, np.ndarray]:
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


def _headers(headers: Sequence[tuple[str, bytes]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, raw in headers or ():
        if isinstance(raw, (bytes, bytearray)):
            out[key] = raw.decode("utf-8", "replace")
        elif raw is not None:
            out[key] = str(raw)
    return out


def _id_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ValueError("results/clicks must be lists of ids")
    if len(value) > MAX_RESULTS_PER_INTERACTION:
        raise ValueError(f"more than {MAX_RESULTS_PER_INTERACTION} ids")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (str, int)) or len(str(item)) > MAX_ID_LENGTH:
            raise ValueError("ids must be strings or integers")
        out.append(str(item))
    return tuple(out)


def _relevance(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError("relevance must be an object of id -> grade")
    if len(value) > MAX_RESULTS_PER_INTERACTION:
        raise ValueError(f"more than {MAX_RESULTS_PER_INTERACTION} graded ids")
    out = {}
    for key, grade in value.items():
        if isinstance(grade, bool) or not isinstance(grade, (int, float)) or not math.isfinite(grade):
            raise ValueError("relevance grades must be finite numbers")
        out[str(key)] = float(grade)
    return out


def _optional(values: list[Any]) -> tuple[Any, ...] | None:
    return tuple(values) if any(v is not None for v in values) else None


def _preview(value: bytes, limit: int = 80) -> str:
    return repr(bytes(value[:limit]))
