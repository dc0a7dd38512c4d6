"""PostgreSQL + pgvector through SQL (psycopg 3; the ``index`` extra).

The production query runs in its own transaction with the user's settings set locally
(``hnsw.ef_search``, ``hnsw.iterative_scan``, ``hnsw.max_scan_tuples``, ``ivfflat.probes``), the
user's ORDER BY (a quantized expression such as ``embedding::halfvec(384) <=> q::halfvec(384)``
when the index is over one, with an optional full-precision re-rank of the first candidates) and
the query's equality predicates as bound parameters. Its exact twin is the same statement with
``enable_indexscan`` and ``enable_bitmapscan`` off, so the planner must scan the table (the
engine's own brute force, with the same filter) and order by the full-precision distance.
Every statement runs under ``statement_timeout``; identifiers come from the settings, checked as
plain identifiers, and are quoted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.index.connectors.base import (
    MAX_SCOPE_VALUES,
    Answer,
    Connector,
    ConnectorError,
    Filter,
    Mode,
    check_query,
    parse_count,
    parse_id,
    parse_rows,
    parse_scope_counts,
    parse_vector_rows,
)
from monitor.index.settings import PgvectorSettings

logger = logging.getLogger(__name__)

OPERATORS = {"cosine": "<=>", "l2": "<->", "dot": "<#>"}


def quote(identifier: str) -> str:
    """``schema.table`` or ``column`` quoted (the settings allow plain identifiers only)."""
    return ".".join(f'"{part}"' for part in identifier.split("."))


def vector_literal(query: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in np.asarray(query, dtype=np.float32)) + "]"


def classify(exc: BaseException) -> ConnectorError:
    """A psycopg exception as a counted reason."""
    import psycopg
    from psycopg import errors

    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, errors.QueryCanceled):
        return ConnectorError("timeout", f"statement timeout: {message}")
    if isinstance(exc, errors.InsufficientPrivilege):
        return ConnectorError("permission", message)
    if isinstance(exc, (errors.UndefinedTable, errors.InvalidSchemaName)):
        return ConnectorError("missing_table", message)
    if isinstance(exc, errors.UndefinedColumn):
        return ConnectorError("missing_column", message)
    if isinstance(exc, psycopg.DataError) and "dimension" in message:
        return ConnectorError("dimension", message)
    if isinstance(exc, psycopg.OperationalError):
        return ConnectorError("unreachable", message)
    if isinstance(exc, psycopg.InterfaceError):
        return ConnectorError("unreachable", message)
    return ConnectorError("other", f"{type(exc).__name__}: {message}")


class PgvectorConnector(Connector):
    engine = "pgvector"

    def __init__(self, settings: PgvectorSettings):
        self.settings = settings
        self.metric = settings.metric
        self.supports_quantized = settings.order_expression is not None
        self.filter_columns = frozenset(settings.filter_columns)
        self._conn: Any = None
        self.dim: int | None = None
        self._id_type = "text"
        self._table = quote(settings.table)
        self._id = quote(settings.id_column)
        self._col = quote(settings.vector_column)
        self._op = OPERATORS[settings.metric]

    # ------------------------------------------------------------------ connection
    def _connection(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            self._conn = psycopg.connect(
                self.settings.connection_string(),
                connect_timeout=max(1, int(round(self.settings.connect_timeout_seconds))),
                autocommit=False,
            )
            self._describe()
        except psycopg.Error as exc:
            self._drop()
            raise classify(exc) from None
        return self._conn

    def _describe(self) -> None:
        """The vector column's dimension and the id column's type (errors name a missing table/column)."""
        rows = self._execute(
            "SELECT a.attname, a.atttypmod, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (self.settings.table,), settings=False,
        )
        columns = {str(name): (typmod, str(kind)) for name, typmod, kind in rows}
        for column in (self.settings.id_column, self.settings.vector_column, *self.settings.filter_columns):
            if column not in columns:
                raise ConnectorError("missing_column", f"column {column!r} is not in {self.settings.table}")
        typmod, kind = columns[self.settings.vector_column]
        if not kind.startswith("vector"):
            raise ConnectorError("missing_column", f"column {self.settings.vector_column!r} is {kind}, not vector")
        self.dim = int(typmod) if isinstance(typmod, int) and typmod > 0 else None
        self._id_type = columns[self.settings.id_column][1]

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                logger.debug("closing a pgvector connection", exc_info=True)

    def _execute(self, sql: str, params: Sequence[Any], *, settings: bool = True,
                 local: Sequence[tuple[str, str]] = ()) -> list[Any]:
        """Run one statement in its own transaction; a failure is classified (and drops a dead connection)."""
        import psycopg

        conn = self._conn
        if conn is None:
            conn = self._connection()
        try:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(f"SET LOCAL statement_timeout = {int(self.settings.statement_timeout_ms)}")
                if settings:
                    for name, value in local:
                        cur.execute(f"SET LOCAL {name} = {value}")
                # never prepared: psycopg prepares a statement run 5 times, and PostgreSQL's cached
                # generic plan ignores a later SET LOCAL enable_indexscan = off, so the served and the
                # exact search (the same SQL text) would share the served plan: an "exact" index scan
                cur.execute(sql, params, prepare=False)  # built from checked identifiers, values bound
                return list(cur.fetchall())
        except psycopg.Error as exc:
            error = classify(exc)
            if error.reason == "unreachable" or conn.closed or conn.broken:
                self._drop()
            raise error from None

    # ------------------------------------------------------------------ the four questions
    def _where(self, filter_: Filter) -> tuple[str, list[Any]]:
        clauses, params = [], []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            clauses.append(f"{quote(key)} = %s")
            params.append(value)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def _served_settings(self) -> list[tuple[str, str]]:
        s = self.settings
        local = []
        if s.ef_search is not None:
            local.append(("hnsw.ef_search", str(int(s.ef_search))))
        if s.iterative_scan is not None:
            local.append(("hnsw.iterative_scan", s.iterative_scan))
        if s.max_scan_tuples is not None:
            local.append(("hnsw.max_scan_tuples", str(int(s.max_scan_tuples))))
        if s.ivfflat_probes is not None:
            local.append(("ivfflat.probes", str(int(s.ivfflat_probes))))
        return local

    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        self._connection()
        q = vector_literal(check_query(query, self.dim))
        where, params = self._where(filter_)
        full = f"{self._col} {self._op} %s::vector"
        if mode == "exact_quantized" and not self.supports_quantized:
            raise ConnectorError("unsupported", "no order_expression: the index is full precision")
        quantized = self.settings.order_expression is not None and mode != "exact"
        if quantized:
            assert self.settings.order_expression is not None
            order = self.settings.order_expression.replace("{col}", self._col).replace("{q}", "%s::vector")
            inner = self.settings.rerank_candidates or k
            sql = (f"SELECT {self._id}::text, ({full})::float8 AS d FROM {self._table}{where} "
                   f"ORDER BY {order} LIMIT %s")
            args: list[Any] = [q, *params, q, inner]
            if self.settings.rerank_candidates is not None:
                sql = f"SELECT * FROM ({sql}) AS candidates ORDER BY d LIMIT %s"
                args.append(k)
        else:
            sql = f"SELECT {self._id}::text, ({full})::float8 AS d FROM {self._table}{where} ORDER BY {full} LIMIT %s"
            args = [q, *params, q, k]
        local = self._served_settings() if mode == "served" else [
            ("enable_indexscan", "off"), ("enable_bitmapscan", "off")]
        return parse_rows(self._execute(sql, args, local=local), k)

    def _id_array(self) -> str:
        return f"%s::{self._id_type}[]" if self._id_type != "text" else "%s::text[]"

    def _id_values(self, ids: Sequence[str]) -> list[Any]:
        if self._id_type in ("integer", "bigint", "smallint"):
            out = []
            for ident in ids:
                try:
                    out.append(int(ident))
                except ValueError:
                    continue  # an id the integer column cannot hold is simply absent
            return out
        return list(ids)

    def fetch(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        if not ids:
            return {}
        self._connection()
        rows = self._execute(
            f"SELECT {self._id}::text, {self._col}::text FROM {self._table} WHERE {self._id} = ANY({self._id_array()})",
            [self._id_values(ids)], settings=False,
        )
        return dict(parse_vector_rows(rows, self.dim, len(ids)))

    def texts(self, ids: Sequence[str]) -> dict[str, str]:
        if self.settings.text_column is None:
            raise ConnectorError("unsupported", "pgvector: no text_column configured")
        self._connection()
        rows = self._execute(
            f"SELECT {self._id}::text, {quote(self.settings.text_column)}::text FROM {self._table} "
            f"WHERE {self._id} = ANY({self._id_array()})", [self._id_values(ids)], settings=False,
        )
        return {parse_id(r[0]): str(r[1]) for r in rows if isinstance(r, tuple) and len(r) == 2 and r[1] is not None}

    def count(self) -> int:
        self._connection()
        rows = self._execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                             (self.settings.table,), settings=False)
        estimate = int(rows[0][0]) if rows and isinstance(rows[0][0], int) else -1
        if estimate > 0:
            return estimate
        rows = self._execute(f"SELECT count(*) FROM {self._table}", (), settings=False)
        return parse_count(rows[0][0] if rows else None)

    def scope_counts(self, field_name: str) -> dict[str, int]:
        if field_name not in self.filter_columns:
            raise ConnectorError("unsupported", f"scope field {field_name!r} is not in filter_columns")
        self._connection()
        column = quote(field_name)
        rows = self._execute(f"SELECT {column}::text, count(*) FROM {self._table} GROUP BY 1 LIMIT %s",
                             [MAX_SCOPE_VALUES + 1], settings=False)
        return parse_scope_counts(rows)

    def sample(self, n: int) -> list[tuple[str, np.ndarray]]:
        if n <= 0:
            return []
        total = max(1, self.count())
        percent = min(100.0, 100.0 * 1.5 * n / total + 0.01)
        rows = self._execute(
            f"SELECT {self._id}::text, {self._col}::text FROM {self._table} TABLESAMPLE BERNOULLI (%s) LIMIT %s",
            [percent, n], settings=False,
        )
        return parse_vector_rows(rows, self.dim, n)

    def close(self) -> None:
        self._drop()
