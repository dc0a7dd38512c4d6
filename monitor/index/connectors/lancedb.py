"""An embedded LanceDB table (the ``index`` extra).

The production query is ``table.search(q)`` with the user's ``nprobes``, ``refine_factor``,
``ef`` and ``prefilter``; its exact twin adds ``bypass_vector_index()`` (a flat scan with the same
filter, prefiltered). LanceDB's distances: cosine ``1 - cos``, l2 the *squared* Euclidean
distance, dot ``1 - x·q``; :meth:`LanceDbConnector.distance` reproduces them locally.

Filter values are checked against the table's Arrow schema (:meth:`LanceDbConnector.admit`); an
id an integer id column cannot hold is absent. LanceDB calls have no timeout of their own: each
runs through :class:`~monitor.index.connectors.base.Bounded`, given up at the cycle's deadline.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from monitor.index.connectors.base import (
    REDESCRIBE,
    Answer,
    Bounded,
    Connector,
    ConnectorError,
    Filter,
    FilterValue,
    Mode,
    check_bool,
    check_number,
    check_query,
    check_text,
    integer_id,
    parse_count,
    parse_id,
    parse_rows,
    parse_scope_counts,
    parse_vector_rows,
)
from monitor.index.settings import LanceDbSettings

logger = logging.getLogger(__name__)


def int_literal(value: int) -> str:
    """An integer as Lance SQL reads it back: the least int64 is written as an expression, since
    ``-9223372036854775808`` is read as the negation of a number beyond int64 (a float, refused).

    >>> int_literal(-2**63), int_literal(7)
    ('(-9223372036854775807 - 1)', '7')
    """
    return "(-9223372036854775807 - 1)" if value == -(2**63) else str(value)


def literal(value: FilterValue) -> str:
    """A filter value as a Lance SQL literal (strings quoted, quotes doubled)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int_literal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConnectorError("unsupported", "a non-finite filter value")
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def column_kind(kind: Any) -> str:
    """An Arrow type as the kind a filter value is checked as (``other``: text, the engine decides)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or getattr(pa.types, "is_string_view",
                                                                                lambda _: False)(kind):
        return "text"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return f"{'int' if pa.types.is_signed_integer(kind) else 'uint'}{kind.bit_width}"
    if pa.types.is_floating(kind):
        return "float64" if kind.bit_width == 64 else "float32"
    if pa.types.is_decimal(kind):
        return "decimal"
    return "other"


def admit_value(key: str, value: FilterValue, kind: str) -> FilterValue:
    """One filter value checked for a column of ``kind`` (:func:`column_kind`), or ``bad_filter``."""
    if kind == "bool":
        return check_bool(key, value)
    if kind not in ("text", "other"):
        return check_number(key, value, kind)
    if not isinstance(value, str):
        raise ConnectorError("bad_filter", f"filter field {key!r}: a {type(value).__name__} for a {kind} column")
    check_text(key, value)
    return value


def text_ok(value: str) -> bool:
    try:
        check_text("id", value)
    except ConnectorError:
        return False
    return True


def classify(exc: BaseException, filtered: bool = False) -> ConnectorError:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = message.lower()
    # the engine's words come before the echoed filter (user text): look for them there only
    if filtered and 0 <= lowered.find("error resolving filter expression") < 40:
        return ConnectorError("bad_filter", message)
    if "was not found" in lowered or "not found" in lowered and "table" in lowered:
        return ConnectorError("missing_table", message)
    if "no field named" in lowered or "no vector column" in lowered or "schema error" in lowered:
        return ConnectorError("missing_column", message)
    if "dimension" in lowered or "dim" in lowered and "mismatch" in lowered:
        return ConnectorError("dimension", message)
    if isinstance(exc, PermissionError) or "permission denied" in lowered:
        return ConnectorError("permission", message)
    if isinstance(exc, (FileNotFoundError, ConnectionError)):
        return ConnectorError("unreachable", message)
    if isinstance(exc, TimeoutError):
        return ConnectorError("timeout", message)
    return ConnectorError("other", f"{type(exc).__name__}: {message}")


class LanceDbConnector(Connector):
    engine = "lancedb"

    def __init__(self, settings: LanceDbSettings):
        self.settings = settings
        self.metric = settings.metric
        self.filter_columns = frozenset(settings.filter_columns)
        self._table: Any = None
        self.dim: int | None = None
        self._id_kind = "text"
        self._kinds: dict[str, str] = {}
        self._bounded = Bounded("lancedb")

    def _open(self) -> Any:
        if self._table is not None:
            return self._table
        import lancedb
        import pyarrow as pa

        def open_() -> tuple[Any, Any]:
            # read_consistency_interval 0: every read sees the table's latest version, as the
            # application's writers left it (the default never looks past the version at open)
            table = lancedb.connect(self.settings.uri, read_consistency_interval=timedelta(0)).open_table(
                self.settings.table)
            return table, table.schema

        try:
            table, schema = self._bounded(open_, self.deadline)
        except ConnectorError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            raise classify(exc) from None
        names = set(schema.names)
        for column in (self.settings.id_column, self.settings.vector_column, *self.settings.filter_columns):
            if column not in names:
                raise ConnectorError("missing_column", f"column {column!r} is not in table {self.settings.table}")
        kind = schema.field(self.settings.vector_column).type
        if pa.types.is_fixed_size_list(kind):
            self.dim = int(kind.list_size)
        id_kind = column_kind(schema.field(self.settings.id_column).type)
        self._id_kind = id_kind if id_kind.startswith(("int", "uint")) else "text"
        self._kinds = {c: column_kind(schema.field(c).type) for c in self.settings.filter_columns}
        self._table = table
        return table

    def refresh(self) -> None:
        self._table = None  # reopened (and its schema read again) at the next call

    def _call(self, call: Any, filtered: bool = False) -> Any:
        """One engine call, bounded by the cycle's deadline; the engine's errors classified."""
        try:
            return self._bounded(call, self.deadline)
        except ConnectorError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            error = classify(exc, filtered)
            if error.reason in REDESCRIBE or error.reason == "unreachable":
                self._table = None  # reopen next time (a table recreated, a mount back)
            raise error from None

    def _run(self, build: Any, filtered: bool = False) -> Any:
        return self._call(lambda: build().to_arrow(), filtered)

    def admit(self, filter_: Filter) -> Filter:
        """The filter's values as their columns' Arrow types hold them."""
        if filter_:
            self._open()
        out: list[tuple[str, FilterValue]] = []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            out.append((key, admit_value(key, value, self._kinds.get(key, "other"))))
        return tuple(out)

    def _where(self, filter_: Filter) -> str | None:
        clauses = [f"{key} = {literal(value)}" for key, value in self.admit(filter_)]
        return " AND ".join(clauses) or None

    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        table = self._open()
        if mode == "exact_quantized":
            raise ConnectorError("unsupported", "lancedb: no exact search in the quantized space")
        try:
            q = check_query(query, self.dim)
        except ConnectorError:
            self._table = None  # the table may have been re-created at another dimension
            raise
        where = self._where(filter_)
        s = self.settings

        def build() -> Any:
            builder = table.search(q, vector_column_name=s.vector_column).distance_type(s.metric)
            if where is not None:
                builder = builder.where(where, prefilter=True if mode == "exact" else s.prefilter)
            if mode == "exact":
                builder = builder.bypass_vector_index()
            else:
                if s.nprobes is not None:
                    builder = builder.nprobes(s.nprobes)
                if s.refine_factor is not None:
                    builder = builder.refine_factor(s.refine_factor)
                if s.ef is not None:
                    builder = builder.ef(s.ef)
            return builder.select([s.id_column, "_distance"]).limit(k)

        result = self._run(build, filtered=where is not None)
        ids = result.column(s.id_column).to_pylist()
        dists = result.column("_distance").to_pylist()
        return parse_rows(zip(ids, dists, strict=True), k)

    def _id_list(self, ids: Sequence[str]) -> str:
        """The ids the id column can hold, as literals (strictly parsed); any other id is absent."""
        if self._id_kind != "text":
            values = [int_literal(v) for v in (integer_id(i, self._id_kind) for i in ids) if v is not None]
        else:
            values = [literal(i) for i in ids if text_ok(i)]
        return ", ".join(values)

    def fetch(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        table = self._open()
        listed = self._id_list(ids)
        if not listed:
            return {}
        s = self.settings
        result = self._run(lambda: table.search().where(f"{s.id_column} IN ({listed})")
                           .select([s.id_column, s.vector_column]).limit(len(ids)))
        rows = zip(result.column(s.id_column).to_pylist(), result.column(s.vector_column).to_pylist(), strict=True)
        return dict(parse_vector_rows(rows, self.dim, len(ids)))

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        s = self.settings
        if s.text_column is None:
            raise ConnectorError("unsupported", "lancedb: no text_column configured")
        table = self._open()
        listed = self._id_list(ids)
        if not listed:
            return {}
        result = self._run(lambda: table.search().where(f"{s.id_column} IN ({listed})")
                           .select([s.id_column, s.text_column]).limit(len(ids)))
        return {parse_id(i): str(t) for i, t in zip(result.column(s.id_column).to_pylist(),
                                                     result.column(s.text_column).to_pylist(), strict=True)
                if t is not None}

    def count(self) -> int:
        table = self._open()
        return parse_count(self._call(table.count_rows))

    def scope_counts(self, field_name: str) -> dict[str, int]:
        if field_name not in self.filter_columns:
            raise ConnectorError("unsupported", f"scope field {field_name!r} is not in filter_columns")
        import pyarrow.compute as pc

        total = self.count()
        if total == 0:
            return {}
        table = self._open()
        column = self._run(lambda: table.search().select([field_name]).limit(total)).column(field_name)
        counts = pc.value_counts(column).to_pylist()
        return parse_scope_counts((c["values"], c["counts"]) for c in counts)

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        total = self.count()
        if n <= 0 or total == 0:
            return []
        table = self._open()
        rng = np.random.default_rng()
        offsets = np.sort(rng.choice(total, size=min(n, total), replace=False)).tolist()
        s = self.settings
        result = self._call(lambda: table.take_offsets(offsets).select([s.id_column, s.vector_column]).to_arrow())
        rows = zip(result.column(s.id_column).to_pylist(), result.column(s.vector_column).to_pylist(), strict=True)
        return parse_vector_rows(rows, self.dim, n)

    def distance(self, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        q = np.asarray(query, dtype=np.float64)
        v = np.asarray(vectors, dtype=np.float64).reshape(-1, q.shape[0])
        if self.metric == "l2":
            return np.asarray(((v - q) ** 2).sum(axis=1), dtype=np.float64)
        if self.metric == "dot":
            return np.asarray(1.0 - v @ q, dtype=np.float64)
        return super().distance(query, vectors)

    def close(self) -> None:
        self._table = None
