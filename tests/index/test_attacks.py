"""Outside values against the index probes, on a real PostgreSQL + pgvector and a real LanceDB.

Every value here reaches the probe from outside (an interaction's filter, an embeddings record's
id, a row some writer stored): none may fail a cycle, raise, or skew the census. Each cycle must
end with a published result and no counted engine error.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from monitor.config import Settings
from monitor.index.component import IndexComponent
from monitor.index.connectors.base import MAX_ID_CHARS
from monitor.index.sampling import ProbeQuery
from tests.support import vectorstores as vs
from tests.support.probes import probe_context

D, K, ROWS = 8, 5, 120
LONG = "\u05d0\u0301" * 128  # 256 characters: Hebrew (RTL) letters, each with a combining mark
VALUES: list[Any] = ["x", "", LONG, "\ud800", "a\x00b", 5, 0, -(2**63), -(2**63) - 1, 2**63, 2**64, 10**400, 1.5, 1e39,
                     -1e39, math.nan, math.inf, True, False]
PG_COLUMNS = {  # column -> its type: every kind of filter column pgvector offers
    "t": "text", "vc": "varchar(4)", "ch": "char(3)", "s": "smallint", "i": "integer", "b": "bigint",
    "num": "numeric", "r": "real", "flag": "boolean", "u": "uuid", "dt": "date",
    "js": "json", "jb": "jsonb", "arr": "integer[]", "m": "mood", "pt": "point",
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with vs.postgres() as uri:
        yield uri


def component(engine: str, section: dict[str, Any], tmp_path: Path, **census: Any) -> IndexComponent:
    probe = {"name": "p", "model": "m", "engine": engine, "k": K, "timeout_seconds": 60,
             "budget": {"exact_searches": 2000, "census_rows": 500},
             "census": {"degenerate_rows": 30, "hub_queries": 3, "grace_seconds": 0, **census}, engine: section}
    return IndexComponent(probe_context(Settings(state_dir=tmp_path, index={"probes": [probe]})))


def cycle(c: IndexComponent) -> Any:
    result = c.run_probe("p")
    assert result is not None, c.snapshot.errors
    assert c.snapshot.errors == {}
    return result


def test_every_filter_value_against_every_pgvector_column_type_is_skipped_or_searched(
    server: str, tmp_path: Path
) -> None:
    vectors = vs.unit_rows(ROWS, D, seed=3)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS typed_all")
        conn.execute("DROP TYPE IF EXISTS mood")
        conn.execute("CREATE TYPE mood AS ENUM ('calm', 'cross')")
        columns = ", ".join(f"{name} {kind}" for name, kind in PG_COLUMNS.items())
        conn.execute(f"CREATE TABLE typed_all (id text PRIMARY KEY, {columns}, embedding vector({D}))")
        for i, v in enumerate(vectors):
            conn.execute("INSERT INTO typed_all VALUES (%s, 'x', 'x', 'x', 5, 5, 5, 5, 1.5, true, "
                         "'00000000-0000-0000-0000-000000000000', '2020-01-01', '{}', '{}', '{5}', "
                         "'calm', '(1,1)', %s)", (str(i), vs.literal(v)))
    c = component("pgvector", {"dsn": server, "table": "typed_all", "filter_columns": list(PG_COLUMNS)},
                  tmp_path, enabled=False)
    probe = c.probes["p"]
    now = c.context.clock()
    filters = [((column, value),) for column in PG_COLUMNS for value in VALUES]
    filters += [((column, "x"),) for column in ('x"; DROP TABLE typed_all --', "nope")]
    filters += [tuple((column, "x") for column in list(PG_COLUMNS)[:16])]  # 16 fields at once
    for f in filters:
        probe.buffer.add(ProbeQuery(vectors[0], f), now)
    result = cycle(c)
    assert sum(result.skipped.values()) + result.queries == len(filters), result.skipped
    assert result.queries > 0 and result.skipped["bad_filter"] > 0 and result.skipped["unsupported_filter"] == 2
    with psycopg.connect(server) as conn:  # the injection-shaped key touched nothing
        assert conn.execute("SELECT count(*) FROM typed_all").fetchone() == (ROWS,)
    cycle(c)  # and again: nothing stuck
    c.close()


@pytest.mark.slow  # 3.0 s of CPU; tests/index/test_hostile_inputs.py keeps a wrong-typed filter value in the fast tier
def test_every_filter_value_against_every_lancedb_column_type_is_skipped_or_searched(tmp_path: Path) -> None:
    import lancedb
    import pyarrow as pa

    vectors = vs.unit_rows(ROWS, D, seed=4)
    n = len(vectors)
    columns = {
        "t": pa.array(["x"] * n), "i8": pa.array([5] * n, pa.int8()), "u64": pa.array([5] * n, pa.uint64()),
        "i64": pa.array([5] * n, pa.int64()), "f32": pa.array([1.5] * n, pa.float32()),
        "f64": pa.array([1.5] * n), "flag": pa.array([True] * n),
        "dt": pa.array([datetime.date(2020, 1, 1)] * n, pa.date32()),
        "ts": pa.array([datetime.datetime(2020, 1, 1)] * n, pa.timestamp("us")),
        "lst": pa.array([[1]] * n, pa.list_(pa.int32())), "bin": pa.array([b"x"] * n, pa.binary()),
        "dec": pa.array([1] * n, pa.decimal128(10, 2)),
    }
    table = pa.table({"id": pa.array([str(i) for i in range(n)]), **columns,
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), D)})
    lancedb.connect(str(tmp_path / "lance")).create_table("typed_all", data=table)
    c = component("lancedb", {"uri": str(tmp_path / "lance"), "table": "typed_all", "filter_columns": list(columns)},
                  tmp_path, enabled=False)
    probe = c.probes["p"]
    now = c.context.clock()
    filters = [((column, value),) for column in columns for value in VALUES]
    filters += [((column, "x"),) for column in ("x' OR 1=1 --", "nope")]
    for f in filters:
        probe.buffer.add(ProbeQuery(vectors[0], f), now)
    result = cycle(c)
    assert sum(result.skipped.values()) + result.queries == len(filters), result.skipped
    assert result.queries > 0 and result.skipped["bad_filter"] > 0 and result.skipped["unsupported_filter"] == 2
    c.close()


# lancedb: 4.3 s of CPU and 8.6 s in all under the fast tier's workers, over its 5 s
@pytest.mark.parametrize("engine", ["pgvector", pytest.param("lancedb", marks=pytest.mark.slow)])
def test_stored_ids_empty_or_overlong_cannot_fail_a_cycle(engine: str, server: str, tmp_path: Path) -> None:
    """Rows some writer stored with an empty id, or one longer than any record's: they are served,
    sampled and hub-searched like any other row."""
    vectors = vs.unit_rows(ROWS, D, seed=5)
    ids = [str(i) for i in range(ROWS)]
    ids[0], ids[1], ids[2] = "", "x" * 600, "x" * 600 + "y"  # two long ids, one prefix: still apart
    if engine == "pgvector":
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS odd_ids")
            conn.execute(f"CREATE TABLE odd_ids (id text PRIMARY KEY, embedding vector({D}))")
            for ident, v in zip(ids, vectors, strict=True):
                conn.execute("INSERT INTO odd_ids VALUES (%s, %s)", (ident, vs.literal(v)))
        section: dict[str, Any] = {"dsn": server, "table": "odd_ids"}
    else:
        import lancedb
        import pyarrow as pa

        lancedb.connect(str(tmp_path / "lance")).create_table("odd_ids", data=pa.table({
            "id": ids, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), D)}))
        section = {"uri": str(tmp_path / "lance"), "table": "odd_ids"}
    c = component(engine, section, tmp_path, degenerate_rows=ROWS, hub_queries=ROWS)
    probe = c.probes["p"]
    now = c.context.clock()
    for v in vectors[:3]:  # queries whose answers hold the odd ids
        probe.buffer.add(ProbeQuery(v), now)
    probe.on_embeddings(_batch(ids[3:20], vectors[3:20]), now)
    result = cycle(c)
    assert result.queries == 3 and result.recall.row() is not None
    assert result.census is not None and result.census.missing == 0
    answer = probe.connector.search(vectors[1], K, (), "exact")
    assert len(answer.ids[0]) <= MAX_ID_CHARS and answer.distances[0] < 1e-5
    c.close()


def _batch(ids: list[str], vectors: np.ndarray) -> Any:
    from monitor.decoding.records import EmbeddingBatch

    return EmbeddingBatch(model="m", stream="s", ids=tuple(ids), vectors=np.asarray(vectors, np.float32),
                          timestamps=np.zeros(len(ids)))


ATTACK_IDS = ["1" * 21, "+5", " 5", "5 ", "0x10", "1_000", "\uff15", "-0", "007", "-9223372036854775808",
              "9223372036854775808", "00000000-0000-0000-0000-000000000005", "5\x00", "\ud800", "5\n", "\u0665"]


# lancedb: 4.1 s of CPU and 7.1 s in all under the fast tier's workers
@pytest.mark.parametrize("engine", ["pgvector", pytest.param("lancedb", marks=pytest.mark.slow)])
def test_attack_ids_against_an_integer_id_column_are_absent_never_an_error(
    engine: str, server: str, tmp_path: Path
) -> None:
    vectors = vs.unit_rows(ROWS, D, seed=6)
    if engine == "pgvector":
        vs.load_pg_typed(server, "int_ids", vectors)
        section: dict[str, Any] = {"dsn": server, "table": "int_ids"}
    else:
        vs.load_lance_typed(tmp_path / "lance", "int_ids", vectors)
        section = {"uri": str(tmp_path / "lance"), "table": "int_ids"}
    c = component(engine, section, tmp_path)
    probe = c.probes["p"]
    now = c.context.clock()
    probe.buffer.add(ProbeQuery(vectors[0]), now)
    good = [str(i) for i in range(1, 21)]  # ids 1..ROWS are stored, in canonical form
    ids = good + ATTACK_IDS
    probe.on_embeddings(_batch(ids, np.concatenate([vectors[:20], vectors[:len(ATTACK_IDS)]])), now)
    for _ in range(2):
        result = cycle(c)
        assert result.census is not None and result.census_error is None
        # the stored rows of the good ids are found and current; every attack id is absent
        assert result.census.sampled == 20 and result.census.missing == len(ATTACK_IDS)
    c.close()


def test_the_sketch_keeps_different_ids_in_each_process() -> None:
    """The key is random per process: no id an attacker picks is kept by every monitor."""
    import subprocess
    import sys

    code = ("from monitor.index.sampling import id_hash\n"
            "print(sorted(range(10000), key=lambda i: id_hash(str(i)))[:10])")
    kept = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
            for _ in range(3)]
    assert len(set(kept)) == 3, kept
