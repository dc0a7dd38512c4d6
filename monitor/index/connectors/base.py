"""What an index probe needs from a vector store, and the errors it can end in.

A :class:`Connector` answers four questions about one index (one table or collection):

* ``search(query, k, filter, mode)``: the ids and distances of the top k, where ``mode`` is
  ``served`` (the production query with the user's settings: ef_search, nprobes, prefilter, ...),
  ``exact`` (the engine's own brute force, same filter), or ``exact_quantized`` (brute force in
  the quantized space the index searches, when the engine has one configured);
* ``fetch(ids)``: the stored vectors of those ids (the census; true distances of served misses);
* ``sample(n)``: up to ``n`` stored ``(id, vector)`` drawn at random (degenerate rows, orphans);
* ``count()``: the rows of the index.

Distances are the engine's own, in one convention per connector that :meth:`Connector.distance`
reproduces locally (cosine: 1 - cos; l2: Euclidean; dot: negative inner product), so a served
id's true distance can be computed from its stored vector.

Every failure is a :class:`ConnectorError` with a ``reason`` from :data:`REASONS`: the probe
counts it by reason, logs it once and backs off. What the engine returned is parsed by the
``parse_*`` functions below, which either build a checked answer or raise ``bad_result``: they
are the boundary the fuzz tests drive (tests/index/test_parsing.py).
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import numpy as np

from monitor.deadline import Deadline

Mode = Literal["served", "exact", "exact_quantized"]
FilterValue = str | int | float | bool
Filter = tuple[tuple[str, FilterValue], ...]

# why a search, fetch or connection failed (the ``reason`` label of embmon_index_errors_total)
REASONS = (
    "unreachable",  # connection refused, DNS, authentication at connect, connect timeout
    "timeout",  # a statement or request ran past its timeout
    "permission",  # the role or key may not read the table
    "missing_table",  # the table or collection does not exist
    "missing_column",  # a configured column is not in it
    "dimension",  # the query's dimension is not the index's
    "bad_result",  # the engine answered something we cannot read
    "unsupported",  # the engine cannot do what the settings ask (no quantized exact search, ...)
    "oversized",  # an HTTP engine's answer larger than what was asked can need
    "redirect",  # an HTTP engine answered 3xx (never followed: the key stays with the configured origin)
    "bad_filter",  # a query's filter value the column cannot take (the query is skipped, never the cycle)
    "other",
)
Reason = Literal[
    "unreachable", "timeout", "permission", "missing_table", "missing_column", "dimension", "bad_result",
    "unsupported", "oversized", "redirect", "bad_filter", "other",
]
# reasons that belong to one query, not to the engine: the probe skips the query and goes on
QUERY_REASONS = frozenset({"dimension", "bad_filter"})
# reasons after which the connector reads the table's description again (a table re-created)
REDESCRIBE = frozenset({"dimension", "missing_table", "missing_column"})
MAX_ID_CHARS = 512
MAX_SCOPE_VALUES = 100_000
_INTEGER = re.compile(r"-?[0-9]{1,20}")
INT_RANGES = {  # the integer column kinds an id or a filter value may meet, and their ranges
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
}
FLOAT32_MAX = 3.4028234663852886e38
T = TypeVar("T")


# HTTP engines (Qdrant, Chroma): an answer is bounded by what was asked, rows of dimension numbers
# (HTTP_BYTES_PER_NUMBER bytes each), HTTP_ROW_BYTES of id, distance and JSON per row, and a floor;
# HTTP_MAX_DIM before the index's dimension is known. How monitor/outbound.py's reasons and an
# engine's HTTP statuses read as this package's reasons.
HTTP_BYTES_PER_NUMBER = 32
HTTP_ROW_BYTES = 1024
HTTP_ANSWER_FLOOR_BYTES = 64 * 1024
HTTP_VALUES_PER_ROW = 64
HTTP_VALUES_FLOOR = 4096
HTTP_MAX_DIM = 16_384
OUTBOUND_REASONS: dict[str, Reason] = {"connect": "unreachable", "timeout": "timeout", "oversized": "oversized",
                                       "redirect": "redirect", "protocol": "bad_result"}
HTTP_STATUS_REASONS: dict[int, Reason] = {401: "permission", 403: "permission", 404: "missing_table", 408: "timeout",
                                          502: "unreachable", 503: "unreachable", 504: "timeout"}

class ConnectorError(Exception):
    """A failure of the engine or of its answer, with the reason it is counted under."""

    def __init__(self, reason: Reason, message: str):
        super().__init__(message)
        self.reason: Reason = reason


@dataclass(frozen=True, slots=True)
class Answer:
    """One search's result: ids in rank order and their distances (non-decreasing)."""

    ids: tuple[str, ...]
    distances: np.ndarray  # float64 (len(ids),)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Costs:
    """What the probe cost the engine (counters since start; the probe adds each cycle's share)."""

    searches: dict[str, int] = field(default_factory=dict)  # mode -> searches
    rows_read: int = 0

    def add_search(self, mode: str, rows: int) -> None:
        self.searches[mode] = self.searches.get(mode, 0) + 1
        self.rows_read += rows


class Connector:
    """Base class of the engine connectors; subclasses implement the four questions.

    ``deadline`` (set by the probe for its cycle, None outside one) bounds every call: a call
    still running when it passes is given up and raises ``timeout``, so the cycle's thread comes
    back by then whatever the engine does.
    """

    engine = "engine"
    metric = "cosine"
    supports_quantized = False
    deadline: Deadline | None = None
    grace = 1.0  # seconds a call past the deadline may take to be cancelled, then cut

    def call_timeout(self, limit: float) -> float:
        """One HTTP call's total deadline: ``limit`` (the engine's ``timeout_seconds``), or what is left
        of the cycle when that is less; ``timeout`` once the cycle's time is up."""
        if self.deadline is None:
            return limit
        left = self.deadline.remaining()
        if left <= 0:
            raise ConnectorError("timeout", "the cycle's deadline has passed")
        return min(limit, left)

    def admit(self, filter_: Filter) -> Filter:
        """``filter_`` as the engine can take it, or ``bad_filter`` for a value its column cannot hold.

        The default checks what every engine needs: text without NUL that UTF-8 can carry."""
        for key, value in filter_:
            if isinstance(value, str):
                check_text(key, value)
        return filter_

    def refresh(self) -> None:
        """Read the table's description again at the next call (a cycle's start; a re-created table)."""

    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        raise NotImplementedError

    def fetch(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        raise NotImplementedError

    def count(self) -> int:
        raise NotImplementedError

    def scope_counts(self, field_name: str) -> dict[str, int]:
        """Rows per value of the filter column ``field_name`` (values as ``str``), at most
        :data:`MAX_SCOPE_VALUES` of them: the denominator of a scope's fill rate. Engines that
        cannot count raise ``unsupported`` (the probe then screens without fill rates)."""
        raise ConnectorError("unsupported", f"{self.engine}: no count per scope")

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        """The stored text of ``ids`` (census re-embedding); engines without a text column raise."""
        raise ConnectorError("unsupported", f"{self.engine}: no text column configured")

    def close(self) -> None:
        """Release connections."""

    def distance(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """Distances from ``query`` to each row of ``vectors`` in this connector's convention."""
        return distances(self.metric, query, vectors)


def distances(metric: str, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    q = np.asarray(query, dtype=np.float64)
    v = np.asarray(vectors, dtype=np.float64).reshape(-1, q.shape[0])
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1) * np.linalg.norm(q)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(1.0 - (v @ q) / np.where(norms > 0, norms, np.nan), dtype=np.float64)
    if metric == "l2":
        return np.asarray(np.linalg.norm(v - q, axis=1), dtype=np.float64)
    return np.asarray(-(v @ q), dtype=np.float64)


# ---------------------------------------------------------------------- filter values and ids
def check_text(key: str, value: str) -> None:
    if "\x00" in value:
        raise ConnectorError("bad_filter", f"filter field {key!r}: a NUL character in the value")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConnectorError("bad_filter", f"filter field {key!r}: a value UTF-8 cannot carry") from None


def check_number(key: str, value: Any, kind: str) -> int | float:
    """A filter value for a numeric column of ``kind`` (an :data:`INT_RANGES` key, ``float32``,
    ``float64`` or ``decimal``); booleans, text, fractions for an integer column and out-of-range
    numbers are ``bad_filter``.

    >>> check_number("n", 3.0, "int32"), check_number("n", 7, "float32")
    (3, 7)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConnectorError("bad_filter", f"filter field {key!r}: a {type(value).__name__} for a {kind} column")
    if kind in INT_RANGES:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 3.0, as JSON encoders may write 3: the same number, exactly
        low, high = INT_RANGES[kind]
        if not isinstance(value, int) or not low <= value <= high:
            raise ConnectorError("bad_filter", f"filter field {key!r}: {value!r} is not a {kind}")
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ConnectorError("bad_filter", f"filter field {key!r}: a non-finite number")
    limit = FLOAT32_MAX if kind == "float32" else math.inf
    try:
        if abs(float(value)) > limit:
            raise ConnectorError("bad_filter", f"filter field {key!r}: {value!r} is beyond {kind}")
    except OverflowError:
        raise ConnectorError("bad_filter", f"filter field {key!r}: {value!r} is beyond {kind}") from None
    return value


def check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConnectorError("bad_filter", f"filter field {key!r}: a {type(value).__name__} for a boolean column")
    return value


def integer_id(ident: str, kind: str = "int64") -> int | None:
    """``ident`` as a key of an integer id column of ``kind``, or None when it cannot be one.

    Strict: ASCII digits with an optional leading '-', within the kind's range. Python's ``int``
    takes far more ('٣٦', ' 7', '1_000', '+5'): none of those is an id the column holds.

    >>> integer_id("-42"), integer_id("٣٦"), integer_id("--23"), integer_id("1" * 21), integer_id("7", "uint8")
    (-42, None, None, None, 7)
    """
    if not _INTEGER.fullmatch(ident):
        return None
    value = int(ident)
    low, high = INT_RANGES.get(kind, INT_RANGES["int64"])
    return value if low <= value <= high else None


# ---------------------------------------------------------------------- bounded calls
MAX_HUNG_CALLS = 2


class Bounded:
    """Runs engine calls that have no timeout of their own so that the caller comes back by a deadline.

    A call runs in a worker thread; the caller waits until the deadline and then gives it up
    (``timeout``): the worker ends when the engine answers, its result dropped. At most
    ``MAX_HUNG_CALLS`` given-up calls may still be running; past that, calls are refused at once
    (``timeout``) rather than piling threads onto an engine that does not answer.
    """

    def __init__(self, name: str):
        self.name = name
        self._hung = 0
        self._lock = threading.Lock()
        self.given_up = 0

    def __call__(self, call: Callable[[], T], deadline: Deadline | None) -> T:
        if deadline is None:
            return call()
        if deadline.expired():
            raise ConnectorError("timeout", f"{self.name}: the cycle's deadline has passed")
        with self._lock:
            if self._hung >= MAX_HUNG_CALLS:
                raise ConnectorError("timeout", f"{self.name}: {self._hung} earlier calls still have no answer")
        done = threading.Event()
        box: dict[str, Any] = {}
        abandoned = [False]

        def work() -> None:
            try:
                box["value"] = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                box["error"] = exc
            finally:
                with self._lock:
                    done.set()
                    if abandoned[0]:
                        self._hung -= 1

        threading.Thread(target=work, name=f"{self.name}-call", daemon=True).start()
        if not done.wait(max(0.0, deadline.remaining())):
            with self._lock:
                if not done.is_set():
                    abandoned[0] = True
                    self._hung += 1
                    self.given_up += 1
                    raise ConnectorError("timeout", f"{self.name}: no answer by the cycle's deadline; given up")
        if "error" in box:
            raise box["error"]
        return box["value"]


# ---------------------------------------------------------------------- parsing (the fuzzed boundary)
def parse_id(value: Any) -> str:
    """An id as the engine returned it: a string, or an integer (Qdrant, integer keys).

    A stored id is data anyone who writes rows chooses: an empty one is kept as it is, and one
    longer than :data:`MAX_ID_CHARS` stands as its first characters and a digest of the whole (the
    same id gives the same stand-in in every answer, so recall still compares it; no record's id is
    that long, so the census never looks it up). Neither may fail the search it came back in.

    >>> parse_id(""), len(parse_id("x" * 10_000)) <= MAX_ID_CHARS, parse_id("a" * 600) == parse_id("a" * 600)
    ('', True, True)
    """
    if isinstance(value, bool):
        raise ConnectorError("bad_result", "an id is a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if len(value) <= MAX_ID_CHARS:
            return value
        digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
        return f"{value[:64]}...#{digest}"
    raise ConnectorError("bad_result", f"an id of type {type(value).__name__}")


def parse_distance(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ConnectorError("bad_result", f"a distance of type {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise ConnectorError("bad_result", "a distance beyond float range") from None
    if not math.isfinite(number):
        raise ConnectorError("bad_result", "a non-finite distance")
    return number


def parse_rows(rows: Iterable[Any], k: int) -> Answer:
    """``(id, distance)`` rows of a search, at most ``k`` of them, sorted by distance.

    Served answers need not come in order (pgvector's ``relaxed_order`` iterative scan, a
    quantized ORDER BY whose full-precision distances are returned): recall is a set measure, and
    the k-th distance is the largest, so the rows are sorted here rather than refused.
    """
    ids: list[str] = []
    dists: list[float] = []
    for row in rows:
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ConnectorError("bad_result", "a search row is not (id, distance)")
        ids.append(parse_id(row[0]))
        dists.append(parse_distance(row[1]))
        if len(ids) > k:
            raise ConnectorError("bad_result", f"more than k={k} rows")
    if len(set(ids)) != len(ids):
        raise ConnectorError("bad_result", "an id repeated in one answer")
    out = np.asarray(dists, dtype=np.float64)
    order = np.argsort(out, kind="stable")
    return Answer(tuple(ids[i] for i in order.tolist()), out[order])


def parse_vector(value: Any, dim: int | None) -> np.ndarray:
    """A stored vector: a sequence of numbers (pgvector's text form '[1,2,3]' too). NaN is kept:
    a NaN row is a degenerate row the census counts, not a parse failure."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            raise ConnectorError("bad_result", "a vector in text form is not [..]")
        try:
            value = [float(x) for x in text[1:-1].split(",")] if text[1:-1].strip() else []
        except ValueError:
            raise ConnectorError("bad_result", "a vector in text form holds a non-number") from None
    if isinstance(value, (bytes, bytearray, memoryview, Mapping)) or value is None:
        raise ConnectorError("bad_result", f"a vector of type {type(value).__name__}")
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ConnectorError("bad_result", "a vector that is not a list of numbers") from None
    if array.ndim != 1 or array.size == 0:
        raise ConnectorError("bad_result", f"a vector of shape {array.shape}")
    if dim is not None and array.size != dim:
        raise ConnectorError("dimension", f"a stored vector of {array.size} dimensions, the query's is {dim}")
    return array


def parse_vector_rows(rows: Iterable[Any], dim: int | None, limit: int) -> list[tuple[str, np.ndarray]]:
    """``(id, vector)`` rows of a fetch or a sample, at most ``limit``, ids unique."""
    out: list[tuple[str, np.ndarray]] = []
    seen: set[str] = set()
    for row in rows:
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ConnectorError("bad_result", "a row is not (id, vector)")
        ident = parse_id(row[0])
        if ident in seen:
            raise ConnectorError("bad_result", "an id repeated")
        seen.add(ident)
        vector = parse_vector(row[1], dim)
        dim = vector.size if dim is None else dim
        out.append((ident, vector))
        if len(out) > limit:
            raise ConnectorError("bad_result", f"more than {limit} rows")
    return out


def parse_scope_counts(rows: Iterable[Any]) -> dict[str, int]:
    """``(value, count)`` rows of a count per scope, at most :data:`MAX_SCOPE_VALUES`; a NULL value is skipped."""
    out: dict[str, int] = {}
    for row in rows:
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ConnectorError("bad_result", "a scope count row is not (value, count)")
        if row[0] is None:
            continue
        out[str(row[0])] = out.get(str(row[0]), 0) + parse_count(row[1])
        if len(out) > MAX_SCOPE_VALUES:
            raise ConnectorError("bad_result", f"more than {MAX_SCOPE_VALUES} scope values")
    return out


def parse_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConnectorError("bad_result", "a row count that is not a non-negative integer")
    return value


def check_query(query: np.ndarray, dim: int | None) -> np.ndarray:
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    if dim is not None and q.size != dim:
        raise ConnectorError("dimension", f"a query of {q.size} dimensions against an index of {dim}")
    if not np.isfinite(q).all():
        raise ConnectorError("dimension", "a non-finite query")
    return q
