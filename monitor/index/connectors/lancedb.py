"""An embedded LanceDB table (the ``index`` extra).

The production query is ``table.search(q)`` with the user's ``nprobes``, ``refine_factor``,
``ef`` and ``prefilter``; its exact twin adds ``bypass_vector_index()`` (a flat scan with the same
filter, prefiltered). LanceDB's distances: cosine ``1 - cos``, l2 the *squared* Euclidean
distance, dot ``1 - x·q``; :meth:`LanceDbConnector.distance` reproduces them locally.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from monitor.index.connectors.base import (
    Answer,
    Connector,
    ConnectorError,
    Filter,
    FilterValue,
    Mode,
    check_query,
    parse_count,
    parse_id,
    parse_rows,
    parse_scope_counts,
    parse_vector_rows,
)
from monitor.index.settings import LanceDbSettings

logger = logging.getLogger(__name__)


def literal(value: FilterValue) -> str:
    """A filter value as a Lance SQL literal (strings quoted, quotes doubled)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConnectorError("unsupported", "a non-finite filter value")
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def classify(exc: BaseException) -> ConnectorError:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = message.lower()
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
        self._int_ids = False

    def _open(self) -> Any:
        if self._table is not None:
            return self._table
        import lancedb
        import pyarrow as pa

        try:
            # read_consistency_interval 0: every read sees the table's latest version, as the
            # application's writers left it (the default never looks past the version at open)
            table = lancedb.connect(self.settings.uri, read_consistency_interval=timedelta(0)).open_table(
                self.settings.table)
            schema = table.schema
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            raise classify(exc) from None
        names = set(schema.names)
        for column in (self.settings.id_column, self.settings.vector_column, *self.settings.filter_columns):
            if column not in names:
                raise ConnectorError("missing_column", f"column {column!r} is not in table {self.settings.table}")
        kind = schema.field(self.settings.vector_column).type
        if pa.types.is_fixed_size_list(kind):
            self.dim = int(kind.list_size)
        self._int_ids = pa.types.is_integer(schema.field(self.settings.id_column).type)
        self._table = table
        return table

    def _run(self, build: Any) -> Any:
        try:
            return build().to_arrow()
        except ConnectorError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            error = classify(exc)
            if error.reason in ("missing_table", "unreachable"):
                self._table = None  # reopen next time (a table recreated, a mount back)
            raise error from None

    def _where(self, filter_: Filter) -> str | None:
        clauses = []
        for key, value in filter_:
            if key not in self.filter_columns:
                raise ConnectorError("unsupported", f"filter field {key!r} is not in filter_columns")
            clauses.append(f"{key} = {literal(value)}")
        return " AND ".join(clauses) or None

    def search(self, query: np.ndarray, k: int, filter_: Filter, mode: Mode) -> Answer:
        table = self._open()
        if mode == "exact_quantized":
            raise ConnectorError("unsupported", "lancedb: no exact search in the quantized space")
        q = check_query(query, self.dim)
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

        result = self._run(build)
        ids = result.column(s.id_column).to_pylist()
        dists = result.column("_distance").to_pylist()
        return parse_rows(zip(ids, dists, strict=True), k)

    def _id_list(self, ids: Sequence[str]) -> str:
        if self._int_ids:
            values = [str(int(i)) for i in ids if i.lstrip("-").isdigit()]
        else:
            values = [literal(i) for i in ids]
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
        try:
            return parse_count(table.count_rows())
        except ConnectorError:
            raise
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            raise classify(exc) from None

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
        try:
            result = table.take_offsets(offsets).select([s.id_column, s.vector_column]).to_arrow()
        except Exception as exc:  # noqa: BLE001 - the engine's own exceptions, classified
            raise classify(exc) from None
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
