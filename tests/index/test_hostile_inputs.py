"""Inputs that must not blind the index probe, on a real PostgreSQL + pgvector and a real LanceDB.

Each test is one way a single outside value used to stop every cycle:

* an interaction's filter value its column cannot hold (``"tenant": 5``, ``true``, ``1.5``, a NUL,
  text against an integer column, a number beyond the column's range): the query is skipped and
  counted (``bad_filter``), the cycle goes on;
* an embeddings record whose id an integer id column cannot hold (21 digits, ``--23``, ``²36``,
  Arabic-Indic digits): that id is absent from the census, never an error; the sketch's hash is
  keyed, so ids chosen under a plain hash land in it no more often than any;
* a table dropped and re-created at another dimension (a re-index after a model upgrade): the next
  cycle measures the new table;
* scope values ``all``, ``other`` and ``none``: no series collides with the overall, pooled or
  no-scope rows in a real scrape;
* hypothesis-fuzzed filter values and ids through whole cycles; the probe answers after.
"""

from __future__ import annotations

import math
import subprocess
import sys
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import Settings
from monitor.deadline import Deadline
from monitor.index.component import IndexComponent
from monitor.index.connectors.base import REASONS
from monitor.index.sampling import IdSketch, ProbeQuery, draw, id_hash
from tests.support import vectorstores as vs
from tests.support.probes import collect, probe_context

D, K = 16, 5
ROWS = 600
BAD_FILTERS: list[tuple[tuple[str, Any], ...]] = [
    (("tenant", 5),), (("tenant", True),), (("tenant", 1.5),), (("tenant", "t\x000"),),
    (("n", "3"),), (("n", 2**40),), (("n", True),), (("n", 2.5),), (("flag", 1),), (("flag", "true"),),
    (("score", 1e300),), (("score", "0.5"),),
]
GOOD_FILTERS: list[tuple[tuple[str, Any], ...]] = [
    (("tenant", "t1"),), (("n", 3),), (("flag", True),), (("score", 0.5),), (("n", 2), ("tenant", "t2")),
]
BAD_IDS = ["1" * 21, "--23", "²36", "٣٦", "1_0", " 7", "+5", "-" * 3, "9223372036854775808", "12\x00"]
ENGINES = ("pgvector", "lancedb")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with vs.postgres() as uri:
        yield uri


@pytest.fixture(scope="module")
def stores(server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    vectors = vs.unit_rows(ROWS, D, seed=11)
    lance = tmp_path_factory.mktemp("lance-typed")
    vs.load_pg_typed(server, "typed", vectors)
    vs.load_lance_typed(lance, "typed", vectors)
    return {"uri": server, "lance": str(lance), "vectors": vectors}


def engine_section(engine: str, stores: dict[str, Any], table: str = "typed") -> dict[str, Any]:
    columns = ["tenant", "n", "flag", "score"]
    if engine == "pgvector":
        return {"dsn": stores["uri"], "table": table, "filter_columns": columns}
    return {"uri": stores["lance"], "table": table, "filter_columns": columns}


def component(engine: str, stores: dict[str, Any], tmp_path: Path, table: str = "typed",
              section: dict[str, Any] | None = None, **spec: Any) -> IndexComponent:
    probe = {"name": "p", "model": "m", "engine": engine, "k": K, "timeout_seconds": 60,
             "queries": {"scope_field": "tenant", "min_per_scope": 3},
             "budget": {"exact_searches": 400, "census_rows": 500},
             "census": {"degenerate_rows": 50, "hub_queries": 3, "grace_seconds": 0},
             engine: {**engine_section(engine, stores, table), **(section or {})}, **spec}
    return IndexComponent(probe_context(Settings(state_dir=tmp_path, index={"probes": [probe]})))


def near(vectors: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        v = vectors[rng.integers(len(vectors))] + 0.2 * rng.normal(size=vectors.shape[1])
        out.append((v / np.linalg.norm(v)).astype(np.float32))
    return out


def good_queries(vectors: np.ndarray, n: int = 20, seed: int = 0) -> list[ProbeQuery]:
    return [ProbeQuery(v, GOOD_FILTERS[i % len(GOOD_FILTERS)]) for i, v in enumerate(near(vectors, n, seed))]


# ---------------------------------------------------------------------- filter values
# lancedb: 2.6 s of CPU under the fast tier's workers; tests/index/test_attacks.py tries every LanceDB column type
@pytest.mark.parametrize("engine", ["pgvector", pytest.param("lancedb", marks=pytest.mark.slow)])
def test_a_filter_value_the_column_cannot_hold_skips_the_query_not_the_cycle(
    engine: str, stores: dict[str, Any], tmp_path: Path
) -> None:
    c = component(engine, stores, tmp_path)
    probe = c.probes["p"]
    now = c.context.clock()
    for q in good_queries(stores["vectors"]):
        probe.buffer.add(q, now)
    for filter_, v in zip(BAD_FILTERS, near(stores["vectors"], len(BAD_FILTERS), 1), strict=True):
        probe.buffer.add(ProbeQuery(v, filter_), now)
    for _ in range(2):  # every cycle, not just the first: the events stay in the buffer
        result = c.run_probe("p")
        assert result is not None, c.snapshot.errors
        assert result.skipped == {"bad_filter": len(BAD_FILTERS)}
        assert result.queries == 20 and result.recall.row() is not None
    assert c.snapshot.errors == {}
    samples = collect(c)
    assert samples[("embmon_index_queries_skipped_total",
                    frozenset({("probe", "p"), ("reason", "bad_filter")}))] == 2 * len(BAD_FILTERS)
    assert 0 < samples[("embmon_index_recall_ratio", frozenset(
        {("probe", "p"), ("model", "m"), ("scope", "all"), ("k", str(K))}))] <= 1
    c.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_typed_filters_search_what_the_engine_holds(engine: str, stores: dict[str, Any], tmp_path: Path) -> None:
    """The checked, cast values find exactly the rows the columns hold (no truncation, no coercion)."""
    c = component(engine, stores, tmp_path)
    connector = c.probes["p"].connector
    rows = vs.typed_rows(ROWS)
    for filter_, matches in [((("n", 3),), lambda r: r[2] == 3), ((("n", 3.0),), lambda r: r[2] == 3),
                             ((("flag", False),), lambda r: not r[3]),
                             ((("score", 0.25),), lambda r: r[4] == 0.25),
                             ((("n", 1), ("tenant", "t1")), lambda r: r[2] == 1 and r[1] == "t1")]:
        answer = connector.search(stores["vectors"][0], 1000, filter_, "exact")
        assert sorted(int(i) for i in answer.ids) == [r[0] for r in rows if matches(r)], filter_
    c.close()


def test_one_scope_takes_no_more_than_its_share_of_the_top_ups() -> None:
    v = np.ones(2, np.float32)
    queries = [ProbeQuery(v, (("tenant", "big"),))] * 500
    for scope, n in (("a", 6), ("b", 7), ("c", 8)):
        queries += [ProbeQuery(v, (("tenant", scope),))] * n
    for seed in range(20):
        picked = draw(queries, 20, "tenant", 5, np.random.default_rng(seed))
        topups = Counter(q.scope("tenant") for q, uniform in picked if not uniform)
        assert len(picked) <= 20 and sum(topups.values()) <= 10  # the reserve: half the budget
        # ten top-ups over three small scopes (and big, already covered): a round each at a time
        assert max(topups.values()) <= math.ceil(10 / 3), topups
        assert all(topups[s] >= 2 for s in "abc"), topups


# ---------------------------------------------------------------------- ids
@pytest.mark.parametrize("engine", ENGINES)
def test_ids_an_integer_column_cannot_hold_are_absent_and_the_recall_is_published(
    engine: str, stores: dict[str, Any], tmp_path: Path
) -> None:
    c = component(engine, stores, tmp_path)
    probe = c.probes["p"]
    now = c.context.clock()
    for q in good_queries(stores["vectors"], 10):
        probe.buffer.add(q, now)
    vectors = stores["vectors"]
    probe.sketch.add([str(i) for i in range(1, 101)], vectors[:100], now=now - 10)
    probe.sketch.add(BAD_IDS, np.ones((len(BAD_IDS), D), np.float32), now=now - 10)
    result = c.run_probe("p")
    assert result is not None and result.census is not None, c.snapshot.errors
    census = result.census
    assert census.sampled == 100 and census.stale.mean == 0.0
    assert census.missing == len(BAD_IDS)  # seen in the stream, not in the index: absent, not an error
    assert result.recall.row() is not None and result.census_error is None
    c.close()


def test_a_census_failure_drops_the_census_and_keeps_the_recall(stores: dict[str, Any], tmp_path: Path) -> None:
    """A text column the role may not read (census re-embedding) fails the census only."""
    c = component("pgvector", stores, tmp_path, section={"text_column": "nosuch"})
    probe = c.probes["p"]
    now = c.context.clock()
    for q in good_queries(stores["vectors"], 10):
        probe.buffer.add(q, now)
    probe.sketch.add([str(i) for i in range(1, 50)], stores["vectors"][:49], now=now - 10)
    probe.encoder = lambda texts: np.ones((len(texts), D), np.float32)
    result = c.run_probe("p")
    assert result is not None and result.census is None and result.census_error == "missing_column"
    assert result.recall.row() is not None
    samples = collect(c)
    assert samples[("embmon_index_census_errors_total", frozenset({("probe", "p"), ("reason", "missing_column")}))] == 1
    assert ("embmon_index_recall_ratio", frozenset({("probe", "p"), ("model", "m"), ("scope", "all"),
                                                    ("k", str(K))})) in samples
    c.close()


def test_the_id_hash_is_keyed_per_process() -> None:
    code = "from monitor.index.sampling import id_hash; print(id_hash('doc-1'))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(runs) == 2  # another process, another key
    assert 0 <= id_hash("doc-1") < 2**64 and id_hash("doc-1") == id_hash("doc-1")


def test_ids_ground_under_a_plain_hash_do_not_fill_the_sketch() -> None:
    """Ids chosen for the smallest CRC-32 (what grinding against the old hash found in a few tries
    each) are kept at the base rate of the sample, not all of them."""
    candidates = [f"evil-{i}" for i in range(100_000)]
    ground = sorted(candidates, key=lambda i: zlib.crc32(i.encode()))[:200]
    sketch = IdSketch(500)
    honest = [f"doc-{i}" for i in range(5000)]
    sketch.add(honest + ground, np.zeros((len(honest) + len(ground), 2), np.float32), now=0.0)
    kept = sum(1 for i in ground if i in sketch)
    assert kept < 60  # the base rate is 500 / 5200 ≈ 10 %, i.e. about 19 of 200; CRC-32 kept all 200


# ---------------------------------------------------------------------- a re-created table
@pytest.mark.parametrize("engine", ENGINES)
def test_a_table_re_created_at_another_dimension_is_measured_at_the_next_cycle(
    engine: str, stores: dict[str, Any], tmp_path: Path
) -> None:
    table = f"reindexed_{engine}"
    old = vs.unit_rows(300, D, seed=2)
    new = vs.unit_rows(300, D + 8, seed=3)

    def load(vectors: np.ndarray) -> None:
        if engine == "pgvector":
            vs.load_pg_typed(stores["uri"], table, vectors)
        else:
            vs.load_lance_typed(stores["lance"], table, vectors)

    load(old)
    c = component(engine, stores, tmp_path, table=table)
    probe = c.probes["p"]
    now = c.context.clock()
    for q in good_queries(old, 10):
        probe.buffer.add(q, now)
    probe.sketch.add([str(i) for i in range(1, 51)], old[:50], now=now - 10)
    first = c.run_probe("p")
    assert first is not None and first.census is not None and first.census.sampled == 50
    load(new)  # the re-index after a model upgrade: dropped, re-created at D + 8
    for q in good_queries(new, 10, seed=4):
        probe.buffer.add(q, now)
    probe.sketch.add([str(i) for i in range(1, 51)], new[:50], now=now - 10)
    second = c.run_probe("p")
    assert second is not None, c.snapshot.errors
    assert second.queries == 10 and second.skipped == {"dimension": 10}  # the old queries, not the new
    assert second.census is not None and second.census.sampled == 50 and second.census.stale.mean == 0.0
    assert c.snapshot.errors == {}
    c.close()


# ---------------------------------------------------------------------- scope values that are label words
@pytest.mark.slow  # 7.7 s in all and 2.6 s of CPU under the fast tier's workers
def test_scope_values_all_other_none_do_not_collide_in_a_real_scrape(stores: dict[str, Any], tmp_path: Path) -> None:
    import pyarrow as pa
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.parser import text_string_to_metric_families

    vectors = stores["vectors"]
    values = ["all", "other", "none", "all_", "t0", "t1", "t2"]
    table = vs.load_lance_typed(stores["lance"], "scoped", vectors)
    # rows under the word-like tenants too, so their queries find rows (no empty scope)
    table.add(pa.table({"id": pa.array(range(10_000, 10_000 + 4 * 50), pa.int64()),
                        "tenant": [s for s in values[:4] for _ in range(50)],
                        "n": pa.array([0] * 200, pa.int32()), "flag": [True] * 200,
                        "score": pa.array([0.0] * 200, pa.float32()),
                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors[:200].ravel()), D)}))
    c = component("lancedb", stores, tmp_path, table="scoped", worst_scopes=10)
    probe = c.probes["p"]
    now = c.context.clock()
    for i, v in enumerate(near(vectors, 35, 5)):
        probe.buffer.add(ProbeQuery(v, (("tenant", values[i % len(values)]),)), now)
    result = c.run_probe("p")
    assert result is not None, c.snapshot.errors
    registry = CollectorRegistry(auto_describe=False)

    class Adapter:
        def collect(self) -> Any:
            return c.collect()

    registry.register(Adapter())  # type: ignore[arg-type]
    httpd, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{httpd.server_port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
    series: Counter[tuple[str, frozenset[tuple[str, str]]]] = Counter()
    scopes: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] += 1
            if family.name == "embmon_index_queries":
                scopes.add(sample.labels["scope"])
    assert [key for key, n in series.items() if n > 1] == []
    assert "all" in scopes and "other" not in scopes  # the overall row; every scope named (no pool)
    queries = {s: v for (name, labels), v in collect(c).items() if name == "embmon_index_queries"
               for k, s in labels if k == "scope"}
    assert "none" not in queries and queries["all"] == 35  # every query uniform: none lost to a collision
    assert {"all_", "other_", "none_", "all__", "t0", "t1", "t2"} <= scopes  # each value its own label
    c.close()


# ---------------------------------------------------------------------- fuzz
filter_values = st.one_of(
    st.text(max_size=12), st.booleans(), st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(["t1", "t\x00", "3", "²", "٣"]),
)
ids = st.one_of(st.text(max_size=24), st.from_regex(r"-{0,2}[0-9²٣]{1,22}", fullmatch=True),
                st.integers(-(2**70), 2**70).map(str))


@pytest.mark.parametrize("engine", ENGINES)
def test_fuzzed_filter_values_and_ids_never_fail_a_cycle(engine: str, stores: dict[str, Any], tmp_path: Path) -> None:
    c = component(engine, stores, tmp_path, census={"degenerate_rows": 0, "hub_queries": 0, "grace_seconds": 0},
                  attribution=False)
    probe = c.probes["p"]
    vectors = stores["vectors"]
    query = near(vectors, 1, 9)[0]

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(values=st.lists(st.tuples(st.sampled_from(["tenant", "n", "flag", "score"]), filter_values),
                           min_size=1, max_size=3, unique_by=lambda kv: kv[0]),
           fuzzed_ids=st.lists(ids, max_size=6))
    def cycle(values: list[tuple[str, Any]], fuzzed_ids: list[str]) -> None:
        probe.buffer = type(probe.buffer)(100, 3600.0)
        now = c.context.clock()
        probe.buffer.add(ProbeQuery(query, tuple(sorted(values))), now)
        probe.sketch = IdSketch(50)
        probe.sketch.add(["1", *fuzzed_ids], vectors[: 1 + len(fuzzed_ids)], now=now - 10)
        result = probe.run(Deadline.after(30), now)
        assert set(result.skipped) <= {"bad_filter", "empty_scope"}
        assert result.census is not None and result.census.sampled >= 1  # id "1" is always there
        assert result.census_error is None

    cycle()
    probe.buffer = type(probe.buffer)(100, 3600.0)
    for q in good_queries(vectors, 10):
        probe.buffer.add(q, c.context.clock())
    after = c.run_probe("p")  # the probe still answers
    assert after is not None and after.queries == 10 and after.recall.row() is not None
    assert all(reason in REASONS for _, reason in c.snapshot.errors)
    c.close()
