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

Filter values are checked against the column types the catalog gives (:meth:`PgvectorConnector.admit`)
and bound with an explicit cast to the column's type; an id the integer id column cannot hold is
absent. A host that stops answering cannot hold the cycle: connections carry ``connect_timeout``,
``tcp_user_timeout`` and keepalives, and a :class:`StatementWatchdog` cancels, then cuts, a
statement still running at the cycle's deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.index.connectors.base import (
    MAX_SCOPE_VALUES,
    REDESCRIBE,
    Answer,
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
from monitor.index.settings import PgvectorSettings

logger = logging.getLogger(__name__)

OPERATORS = {"cosine": "<=>", "l2": "<->", "dot": "<#>"}
# catalog type (format_type without typmod) -> (the kind the value is checked as, the cast it is bound with)
COLUMN_KINDS = {
    "text": ("text", "text"), "character varying": ("text", "text"), "character": ("text", "bpchar"),
    "name": ("text", "text"), "citext": ("text", "citext"),
    "smallint": ("int16", "smallint"), "integer": ("int32", "integer"), "bigint": ("int64", "bigint"),
    "real": ("float32", "double precision"), "double precision": ("float64", "double precision"),
    "numeric": ("decimal", "numeric"), "boolean": ("bool", "boolean"), "uuid": ("uuid", "uuid"),
}
ID_KINDS = {"smallint": "int16", "integer": "int32", "bigint": "int64"}
# libpq parameters that bound a connection whose host stops answering (unless the DSN sets them)
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3"}


def quote(identifier: str) -> str:
    """``schema.table`` or ``column`` quoted (the settings allow plain identifiers only)."""
    return ".".join(f'"{part}"' for part in identifier.split("."))


def vector_literal(query: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in np.asarray(query, dtype=np.float32)) + "]"


def classify(exc: BaseException, filtered: bool = False) -> ConnectorError:
    """A psycopg exception as a counted reason (a data error of a filtered search: its filter's)."""
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
    if filtered and isinstance(exc, (psycopg.DataError, errors.UndefinedFunction)):
        # a value the column's type cannot take, or a column type with no '=' (json, point)
        return ConnectorError("bad_filter", message)
    if isinstance(exc, psycopg.OperationalError):
        return ConnectorError("unreachable", message)
    if isinstance(exc, psycopg.InterfaceError):
        return ConnectorError("unreachable", message)
    return ConnectorError("other", f"{type(exc).__name__}: {message}")


class StatementWatchdog:
    """Cancels, then cuts, the statement in flight once its deadline passes (one thread per connector).

    At the deadline it sends the server a cancel request (bounded by the connector's ``grace``); if
    the statement has not come back ``grace`` later (a host that stopped answering answers no cancel either),
    it shuts the connection's socket down, which ends the wait in the statement's thread at once.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: tuple[Any, float, float, list[bool]] | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.fired = 0

    def arm(self, conn: Any, seconds: float, grace: float) -> list[bool]:
        """Watch ``conn`` for ``seconds``; the returned flag turns True if the watchdog fired."""
        fired = [False]
        with self._cond:
            self._armed = (conn, time.monotonic() + seconds, grace, fired)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pgvector-watchdog", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return fired

    def disarm(self) -> None:
        with self._cond:
            self._armed = None
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._armed = None
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._armed is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                armed = self._armed
                assert armed is not None
                conn, at, grace, fired = armed
                left = at - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                fired[0] = True
                self.fired += 1
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=grace)
            with self._cond:
                end = time.monotonic() + grace
                while self._armed is armed and time.monotonic() < end:
                    self._cond.wait(max(0.0, end - time.monotonic()))
                if self._armed is armed:
                    cut(conn)
                    self._armed = None


def cut(conn: Any) -> None:
    """Shut down ``conn``'s socket (not close: the descriptor stays the connection's), so a thread
    waiting on it wakes with an error instead of waiting on a host that stopped answering."""
    try:
        fd = os.dup(conn.pgconn.socket)
    except Exception:  # noqa: BLE001 - a connection already gone has nothing to cut
        return
    with socket.socket(fileno=fd) as sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


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
        self._described = False
        self._kinds: dict[str, tuple[str, str]] = {}  # filter column -> (kind, cast)
        self._table = quote(settings.table)
        self._id = quote(settings.id_column)
        self._col = quote(settings.vector_column)
        self._op = OPERATORS[settings.metric]
        self.watchdog = StatementWatchdog()

    # ------------------------------------------------------------------ connection
    def _connect_options(self, conninfo: str) -> dict[str, Any]:
        """libpq parameters that bound a dead host: the DSN's own win, these fill what it lacks."""
        from psycopg.conninfo import conninfo_to_dict

        given = conninfo_to_dict(conninfo)
        timeout = self.settings.connect_timeout_seconds
        if self.deadline is not None:
            left = self.deadline.remaining()
            if left < 2:  # libpq's connect_timeout counts whole seconds, at least 2
                raise ConnectorError("timeout", "no time left in the cycle to connect")
            timeout = min(timeout, left)
        user_timeout = max(10_000, int(self.settings.statement_timeout_ms) + 5_000)
        options: dict[str, Any] = {"connect_timeout": max(2, int(timeout)),
                                   "tcp_user_timeout": str(user_timeout), **KEEPALIVES}
        return {k: v for k, v in options.items() if k not in given or k == "connect_timeout"}

    def _connect(self) -> Any:
        """A new connection, its attempts (each host, each address a host name resolves to) made in
        turn as psycopg makes them, but each given only the time left: libpq would give every
        attempt the whole connect timeout, so two frozen hosts would take twice the cutoff."""
        import psycopg
        from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo

        conninfo = self.settings.connection_string()
        attempts = conninfo_attempts(conninfo_to_dict(conninfo))
        failure: Exception | None = None
        for attempt in attempts:
            single = make_conninfo("", **attempt)
            try:
                options = self._connect_options(single)
            except ConnectorError:
                if failure is None:
                    raise
                break  # no time left for another host: the last one's failure is the cycle's
            try:
                return psycopg.connect(single, autocommit=False, **options)
            except psycopg.OperationalError as exc:
                failure = exc
        assert failure is not None
        raise failure

    def _connection(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            if not self._described:
                self._describe()
            return self._conn
        try:
            self._conn = self._connect()
            self._describe()
        except psycopg.Error as exc:
            self._drop()
            raise classify(exc) from None
        except ConnectorError:
            self._drop()
            raise
        return self._conn

    def refresh(self) -> None:
        self._described = False

    def _describe(self) -> None:
        """The vector column's dimension, the id and filter columns' types (errors name a missing table/column)."""
        rows = self._execute(
            "SELECT a.attname, a.atttypmod, format_type(a.atttypid, a.atttypmod), format_type(a.atttypid, NULL) "
            "FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (self.settings.table,), settings=False,
        )
        columns = {str(name): (typmod, str(kind), str(base)) for name, typmod, kind, base in rows}
        for column in (self.settings.id_column, self.settings.vector_column, *self.settings.filter_columns):
            if column not in columns:
                raise ConnectorError("missing_column", f"column {column!r} is not in {self.settings.table}")
        typmod, kind, _ = columns[self.settings.vector_column]
        if not kind.startswith("vector"):
            raise ConnectorError("missing_column", f"column {self.settings.vector_column!r} is {kind}, not vector")
        self.dim = int(typmod) if isinstance(typmod, int) and typmod > 0 else None
        self._id_type = columns[self.settings.id_column][2]
        # other types (enums, dates, ...) take text, cast to the column's own type by the server
        self._kinds = {c: COLUMN_KINDS.get(columns[c][2], ("other", columns[c][2]))
                       for c in self.settings.filter_columns}
        self._described = True

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                logger.debug("closing a pgvector connection", exc_info=True)

    def _execute(self, sql: str, params: Sequence[Any], *, settings: bool = True,
                 local: Sequence[tuple[str, str]] = (), filtered: bool = False) -> list[Any]:
        """Run one statement in its own transaction, watched until the cycle's deadline; a failure
        is classified (and drops a dead connection; a table that changed is described again)."""
        import psycopg

        conn = self._conn
        if conn is None:
            conn = self._connection()
        fired: list[bool] = [False]
        if self.deadline is not None:
            left = self.deadline.remaining()
            if left <= 0:
                raise ConnectorError("timeout", "the cycle's deadline has passed")
            fired = self.watchdog.arm(conn, left, self.grace)
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
            error = classify(exc, filtered)
            if fired[0]:
                error = ConnectorError("timeout", f"a statement still running at the cycle's deadline: {error}")
            if error.reason in ("unreachable", "timeout") or conn.closed or conn.broken:
                self._drop()
            if error.reason in REDESCRIBE:
                self._described = False
            raise error from None
        finally:
            if self.deadline is not None:
                self.watchdog.disarm()

    # ------------------------------------------------------------------ the four questions
    def admit(self, filter_: Filter) -> Filter:
        """The filter's values as their columns' types hold them (the catalog's, read at describe)."""
        if filter_:
            self._connection()
        out: list[tuple[str, FilterValue]] = []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            kind = self._kinds.get(key, ("other", "text"))[0]
            out.append((key, admit_value(key, value, kind)))
        return tuple(out)

    def _where(self, filter_: Filter) -> tuple[str, list[Any]]:
        clauses, params = [], []
        for key, value in self.admit(filter_):
            clauses.append(f"{quote(key)} = %s::{self._kinds.get(key, ('other', 'text'))[1]}")
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
        try:
            q = vector_literal(check_query(query, self.dim))
        except ConnectorError:
            self._described = False  # the table may have been re-created at another dimension
            raise
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
        return parse_rows(self._execute(sql, args, local=local, filtered=bool(params)), k)

    def _id_array(self) -> str:
        if self._id_type in ID_KINDS or self._id_type == "uuid":
            return f"%s::{self._id_type}[]"
        return "%s::text[]"

    def _id_values(self, ids: Sequence[str]) -> list[Any]:
        """The ids the id column can hold (strictly parsed); any other id is simply absent."""
        if self._id_type in ID_KINDS:
            kind = ID_KINDS[self._id_type]
            return [v for v in (integer_id(i, kind) for i in ids) if v is not None]
        if self._id_type == "uuid":
            return [t for t in (uuid_text(i) for i in ids) if t is not None]
        return [i for i in ids if text_ok(i)]

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
        # the Bernoulli sample holds about 1.5 n rows in the table's physical order: which n of them are
        # kept is drawn at random too (a bare LIMIT would keep the first n, the table's first two thirds)
        rows = self._execute(
            f"SELECT {self._id}::text, {self._col}::text FROM {self._table} TABLESAMPLE BERNOULLI (%s) "
            f"ORDER BY random() LIMIT %s",
            [percent, n], settings=False,
        )
        return parse_vector_rows(rows, self.dim, n)

    def close(self) -> None:
        self.watchdog.stop()
        self._drop()


def text_ok(value: str) -> bool:
    """A string PostgreSQL's text can hold: UTF-8 without NUL."""
    try:
        check_text("id", value)
    except ConnectorError:
        return False
    return True


def uuid_text(value: str) -> str | None:
    """``value`` as PostgreSQL's uuid input takes it (32 hex digits, hyphens, braces), else None."""
    if not value.isascii() or len(value) > 40:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def admit_value(key: str, value: FilterValue, kind: str) -> FilterValue:
    """One filter value checked for a column of ``kind`` (:data:`COLUMN_KINDS`), or ``bad_filter``."""
    if kind == "bool":
        return check_bool(key, value)
    if kind in ("int16", "int32", "int64", "float32", "float64", "decimal"):
        return check_number(key, value, kind)
    if not isinstance(value, str):
        raise ConnectorError("bad_filter", f"filter field {key!r}: a {type(value).__name__} for a {kind} column")
    check_text(key, value)
    if kind == "uuid":
        text = uuid_text(value)
        if text is None:
            raise ConnectorError("bad_filter", f"filter field {key!r}: not a uuid")
        return text
    return value
