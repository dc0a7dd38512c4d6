"""Bytes to validated records, or a counted reason why not.

Two wire formats carry embeddings (see docs/usage.md "Message formats"):

* a JSON event ``{"id", "model", "vector", "ts"?, "stream"?, "slice"?, "pair_id"?}`` (or a JSON
  array of such events in one message);
* a binary batch: the value is little-endian float32 rows of one model, the headers carry
  ``model`` and ``dim`` (and optionally ``stream``). A ``dim`` header is what marks a message binary.

Decoding works on all the messages of one poll at once, so that the rows of a (model, stream)
become one float32 matrix with one numpy conversion, and validation (finite, non-zero, dimension)
is vectorised. Nothing here raises on bad input: every rejected record is counted by reason.
Each record is a boundary (each message, for a binary batch): an exception that no check foresaw
rejects that record alone under ``decode_error`` and the rest of the poll goes on.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from monitor.decoding.json_decoding import (
    DECODE_ERROR,
    INVALID,
    MAX_ID_LENGTH,
    JsonCollection,
    JsonCollector,
    JsonGroup,
    Rejections,
    check_timestamp,
    failure_detail,
    finite_number,
    parse_json,
    shown_value,
    timestamp_detail,
    to_matrix,
    validate_rows,
)
from monitor.decoding.labels import LABEL_VALUE_RE, is_label_value
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.decoding.settings import LimitSettings

logger = logging.getLogger(__name__)

# The closed set of rejection reasons (the `reason` label of embmon_records_invalid_total).
REASONS = (
    "oversize",  # message larger than limits.max_message_bytes, or too many rows in one message
    "bad_json",  # not parseable as JSON (or as text at all)
    "not_object",  # JSON that is not an object (or array of objects)
    "missing_field",  # id, model or vector absent
    "bad_field",  # a field of the wrong type (id not a string/number, ts not a number, ...)
    "bad_timestamp",  # ts a number that is not finite in float64: NaN, Infinity, an integer too large for a float
    "bad_label",  # model/stream/slice not a valid label value (charset, 64 chars max)
    "bad_vector",  # vector not a flat list of numbers
    "empty_vector",
    "dim_too_large",  # more components than limits.max_dimension
    "dim_mismatch",  # not the dimension this model was declared with or first seen with
    "non_finite",  # NaN or +-Inf component
    "zero_vector",  # all zeros: no direction, cannot be normalised (a classic pooling bug)
    "bad_header",  # binary batch with missing or invalid model/dim headers; headers the Kafka client cannot
    # decode (a header key that is not UTF-8)
    "corrupt_record",  # a record the Kafka client cannot parse at all (its structure is broken)
    "bad_binary",  # binary value whose length is not a whole number of rows
    "label_limit",  # a new model or stream beyond the label budget
    "decode_error",  # decoding the record raised: a case no check foresaw (a bug; the log names the exception)
)

MAX_RESULTS_PER_INTERACTION = 1000
INTERACTIONS_STREAM = "interactions"  # the stream label of what the interactions topic's records count
T = TypeVar("T")


@dataclass
class DecodeResult(Rejections):
    """What one poll's messages turned into, and what was rejected (by stream and reason)."""

    batches: list[EmbeddingBatch] = field(default_factory=list)
    interactions: list[InteractionEvent] = field(default_factory=list)

    def merge(self, other: Rejections) -> None:
        super().merge(other)
        if isinstance(other, DecodeResult):
            self.batches.extend(other.batches)
            self.interactions.extend(other.interactions)


@dataclass
class StartedDecode:
    """One poll after the stateless half of decoding: binary blocks by (model, stream, dim) and
    a call that returns the JSON collection (waiting for a worker process if one has it)."""

    result: DecodeResult = field(default_factory=DecodeResult)
    binary: dict[tuple[str, str, int], list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    json: Callable[[], JsonCollection] | None = None




AdmitFn = Callable[[str, str], bool]
# One message as the source hands it over: its value (None for a Kafka tombstone, rejected) and headers
RawMessage = tuple[bytes | None, Sequence[tuple[str, bytes]]]


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
        self.json = JsonCollector(
            limits.max_rows_per_message, limits.max_dimension, default_stream, LABEL_VALUE_RE.pattern
        )

    # ----------------------------------------------------------------- embeddings
    def decode_embeddings(self, messages: Iterable[RawMessage]) -> DecodeResult:
        """Decode the (value, headers) pairs of one poll from the embeddings topic."""
        return self.finish_embeddings(self.start_embeddings(messages))

    def start_embeddings(
        self,
        messages: Iterable[RawMessage],
        collect_json: Callable[[list[bytes]], Callable[[], JsonCollection]] | None = None,
    ) -> StartedDecode:
        """The stateless half of decoding one poll: screen sizes, slice binary batches, and hand
        the JSON values to ``collect_json`` (which may run them in a worker process and returns
        a call that waits for the result); in-process by default."""
        started = StartedDecode()
        json_values: list[bytes] = []
        for value, headers in messages:
            try:
                if value is None:
                    started.result.reject(self.default_stream, "bad_json", detail="empty (tombstone) message")
                    continue
                if len(value) > self.limits.max_message_bytes:
                    started.result.reject(self.default_stream, "oversize", detail=f"{len(value)} bytes")
                    continue
                header_map = _headers(headers)
                if "dim" in header_map:
                    self._collect_binary(value, header_map, started.binary, started.result)
                else:
                    json_values.append(value)
            except Exception as exc:  # noqa: BLE001 - the record boundary (a message)
                started.result.reject(self.default_stream, DECODE_ERROR, detail=failure_detail(exc, "a message"))
        if json_values:
            if collect_json is None:
                collection = self.json.collect(json_values)
                started.json = lambda: collection
            else:
                started.json = collect_json(json_values)
        return started

    def finish_embeddings(self, started: StartedDecode) -> DecodeResult:
        """The half that needs state (dimensions, the label budget), in poll order."""
        result = started.result
        dims_before = dict(self.dims)  # what each JSON event was checked against, had it been alone
        # All binary rows of a (model, stream) in this poll become one matrix: one validation pass
        # and one rank-k statistics update instead of one per message.
        for (model, stream, dim), blocks in started.binary.items():
            judge_binary = functools.partial(self._judge_binary, model, stream, dim)
            # retried one message at a time: a failure loses that message's rows only
            _contained(result, stream, "a binary batch", judge_binary, blocks, blocks.copy, _rows)
        if started.json is not None:
            collection = started.json()
            result.merge(collection.rejections)
            judge_json = functools.partial(self._judge_json_groups, dims_before)
            for group in collection.groups:
                # retried one record at a time: the rows that failed a check, then each valid row
                _contained(result, group.stream, "a JSON embedding group", judge_json, [group], group.split, _collected)
        return result

    def _judge_json_groups(self, dims_before: dict[str, int], groups: list[JsonGroup], result: DecodeResult) -> None:
        for group in groups:
            self._judge_json_group(group, dims_before, result)

    def _judge_binary(self, model: str, stream: str, dim: int, blocks: list[np.ndarray], result: DecodeResult) -> None:
        """Validate the rows of some binary messages of one (model, stream, dim) and admit them."""
        matrix = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        good, sq_norms, non_finite, zero = validate_rows(matrix)
        batch = None
        if good.all():
            batch = EmbeddingBatch(model=model, stream=stream, vectors=matrix, norms=np.sqrt(sq_norms))
        elif good.any():
            batch = EmbeddingBatch(model=model, stream=stream, vectors=matrix[good], norms=np.sqrt(sq_norms[good]))
        self._admit_rows(model, stream, dim, matrix.shape[0], non_finite, zero, batch, result)

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

    def _judge_json_group(self, group: JsonGroup, dims_before: dict[str, int], result: DecodeResult) -> None:
        """Apply the stateful rules to one group, in the order they had per event."""
        model, stream = group.model, group.stream
        expected = dims_before.get(model)
        if expected is not None and group.length != expected:  # checked per event, before all else
            result.reject(stream, "dim_mismatch", count=group.collected,
                          detail=f"model {model} has dim {expected}, got {group.length}")  # fmt: skip
            return
        if group.bad_vector:
            result.reject(stream, "bad_vector", count=group.bad_vector, detail="vector components must be numbers")
        numeric = group.collected - group.bad_vector
        if numeric:
            self._admit_rows(model, stream, group.length, numeric, group.non_finite, group.zero, group.batch, result)

    def _admit_rows(
        self,
        model: str,
        stream: str,
        dim: int,
        rows: int,
        non_finite: int,
        zero: int,
        batch: EmbeddingBatch | None,
        result: DecodeResult,
    ) -> None:
        """Dimension, then label budget, then the rows' own faults: ``rows`` checked rows, of
        which ``batch`` holds the valid ones."""
        expected = self.dims.get(model)
        if expected is not None and dim != expected:
            result.reject(stream, "dim_mismatch", count=rows, detail=f"model {model} has dim {expected}, got {dim}")
            return
        if not self._admit(model, stream):
            result.reject(stream, "label_limit", count=rows, detail=f"model {model!r} stream {stream!r}")
            return
        if non_finite:
            result.reject(stream, "non_finite", count=non_finite, detail=f"model {model}")
        if zero:
            result.reject(stream, "zero_vector", count=zero, detail=f"model {model}")
        if batch is None:
            return
        self.dims.setdefault(model, dim)
        result.batches.append(batch)

    # --------------------------------------------------------------- interactions
    def decode_interactions(
        self, messages: Iterable[RawMessage], stream: str = INTERACTIONS_STREAM
    ) -> DecodeResult:
        """Decode the messages of one poll from the interactions topic (JSON only)."""
        result = DecodeResult()
        for value, _headers in messages:
            try:
                events = self._interaction_events(value, stream, result)
            except Exception as exc:  # noqa: BLE001 - the record boundary (a message)
                result.reject(stream, DECODE_ERROR, detail=failure_detail(exc, "an interaction message"))
                continue
            for event in events:
                try:
                    parsed = self._interaction(event, stream, result)
                except Exception as exc:  # noqa: BLE001 - the record boundary
                    result.reject(stream, DECODE_ERROR, detail=failure_detail(exc, "an interaction event"))
                    continue
                if parsed is not None:
                    result.interactions.append(parsed)
        return result

    def _interaction_events(self, value: bytes | None, stream: str, result: DecodeResult) -> list[Any]:
        """The events of one interactions message; [] when the message was rejected as a whole."""
        if value is None:
            result.reject(stream, "bad_json", detail="empty (tombstone) message")
            return []
        if len(value) > self.limits.max_message_bytes:
            result.reject(stream, "oversize", detail=f"{len(value)} bytes")
            return []
        doc = parse_json(value)
        if doc is INVALID:
            result.reject(stream, "bad_json", detail=_preview(value))
            return []
        events = doc if isinstance(doc, list) else [doc]
        if len(events) > self.limits.max_rows_per_message:
            result.reject(stream, "oversize", count=len(events))
            return []
        return events

    def _interaction(self, event: Any, stream: str, result: DecodeResult) -> InteractionEvent | None:
        if not isinstance(event, dict):
            result.reject(stream, "not_object", detail=type(event).__name__)
            return None
        model = event.get("model")
        if model is None:
            result.reject(stream, "missing_field", detail="missing model")
            return None
        if not is_label_value(model):
            result.reject(stream, "bad_label", detail=f"model {shown_value(model)}")
            return None
        slice_ = event.get("slice")
        if slice_ is not None and not is_label_value(slice_):
            result.reject(stream, "bad_label", detail=f"slice {shown_value(slice_)}")
            return None
        query_id = event.get("query_id")
        if query_id is not None and (not isinstance(query_id, (str, int)) or isinstance(query_id, bool)):
            result.reject(stream, "bad_field", detail="query_id must be a string or integer")
            return None
        reason, ts = check_timestamp(event.get("ts"))
        if reason is not None:
            result.reject(stream, reason, detail=timestamp_detail(reason, event.get("ts")))
            return None
        try:
            results = _id_list(event.get("results", []))
            clicks = _id_list(event.get("clicks", []))
            relevance = _relevance(event.get("relevance", {}))
            filter_ = parse_filter(event.get("filter"))
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
            ts=None if math.isnan(ts) else ts,
            filter=filter_,
        )

    def _query_vector(self, model: str, raw: Any) -> tuple[str | None, np.ndarray | None]:
        if not isinstance(raw, list):
            return "bad_vector", None
        if not raw:
            return "empty_vector", None
        if len(raw) > self.limits.max_dimension:
            return "dim_too_large", None
        keep, matrix = to_matrix([raw])
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


def _contained(
    result: DecodeResult,
    stream: str,
    what: str,
    judge: Callable[[list[T], DecodeResult], None],
    whole: list[T],
    parts: Callable[[], Iterable[T]],
    size: Callable[[T], int],
) -> None:
    """``judge(whole, ...)`` into ``result``, all or nothing; if it raises, ``judge([part], ...)``
    for each of ``parts()`` (the same records, each part one message or one record), and a part
    that raises alone counts its ``size`` records under ``decode_error``."""
    local = DecodeResult()
    try:
        judge(whole, local)
    except Exception:  # the record boundary: retried part by part below
        logger.debug("judging %s raised; retrying it part by part", what, exc_info=True)
    else:
        result.merge(local)
        return
    try:
        split = list(parts())
    except Exception as exc:  # noqa: BLE001 - cannot even split: every record of the whole is lost
        result.reject(stream, DECODE_ERROR, count=sum(size(item) for item in whole), detail=failure_detail(exc, what))
        return
    for part in split:
        local = DecodeResult()
        try:
            judge([part], local)
        except Exception as exc:  # noqa: BLE001 - the record boundary
            result.reject(stream, DECODE_ERROR, count=size(part), detail=failure_detail(exc, what))
        else:
            result.merge(local)


def _rows(block: np.ndarray) -> int:
    return int(block.shape[0])


def _collected(group: JsonGroup) -> int:
    return group.collected


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
        number = finite_number(grade)  # an integer beyond float range is no grade (never OverflowError)
        if number is None:
            raise ValueError("relevance grades must be finite numbers")
        out[str(key)] = number
    return out


MAX_FILTER_KEYS = 16
MAX_FILTER_VALUE_CHARS = 256
_FILTER_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")


def parse_filter(value: Any) -> tuple[tuple[str, str | int | float | bool], ...]:
    """The event's equality predicates (``{"tenant": "acme"}``) as sorted pairs; () when absent."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ValueError("filter must be an object of field -> value")
    if len(value) > MAX_FILTER_KEYS:
        raise ValueError(f"filter has more than {MAX_FILTER_KEYS} fields")
    out: list[tuple[str, str | int | float | bool]] = []
    for key, item in value.items():
        if not isinstance(key, str) or not _FILTER_KEY.match(key):
            raise ValueError("filter fields must be plain identifiers")
        if isinstance(item, str):
            if len(item) > MAX_FILTER_VALUE_CHARS:
                raise ValueError(f"filter values are at most {MAX_FILTER_VALUE_CHARS} characters")
            out.append((key, item))
        elif isinstance(item, bool) or (isinstance(item, int) and abs(item) < 2**63):
            out.append((key, item))
        elif isinstance(item, float) and math.isfinite(item):
            out.append((key, item))
        else:
            raise ValueError("filter values must be strings, booleans, 64-bit integers or finite numbers")
    return tuple(sorted(out))


def _preview(value: bytes, limit: int = 80) -> str:
    return repr(bytes(value[:limit]))
