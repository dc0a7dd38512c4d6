"""The index probe on a real Chroma server (``chroma run``): its HNSW search against the exact search.

3,000 clustered 32-d unit vectors with a ``tenant`` in their metadata (one tenant holds 1 %), in two
collections: one whose HNSW index searches with ``ef_search`` 2 and 4 neighbours per node (a cheap index
that misses neighbours), one with ``ef_search`` 200. Chroma has no brute-force switch: the exact answer is
every row under the same ``where``, read and ranked by the connector (bounded by ``exact_max_rows``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.deadline import Deadline
from monitor.index.connectors import build_connector
from monitor.index.connectors.base import ConnectorError
from monitor.index.connectors.chroma import ChromaConnector, parse_get, parse_query, where
from monitor.index.probe import IndexProbe
from monitor.index.settings import ChromaSettings, IndexProbeSpec
from tests.support import chroma
from tests.support import vectorstores as vs
from tests.support.broker import free_port
from tests.support.realdata import random_rotation

N, D, K = 3000, 32, 10


@pytest.fixture(scope="module")
def store() -> Iterator[dict[str, Any]]:
    rows = vs.unit_rows(N, D, seed=5)
    ids = [f"d{i}" for i in range(N)]
    tenants = [vs.tenant_of(i) for i in range(N)]
    with chroma.server() as url:
        chroma.load(url, "cheap", ids, rows, tenants, ef_search=2, max_neighbors=4)
        chroma.load(url, "good", ids, rows, tenants, ef_search=200, max_neighbors=32)
        yield {"url": url, "rows": rows, "ids": ids, "tenants": np.array(tenants)}


def spec_for(store: dict[str, Any], collection: str = "cheap", **section: Any) -> IndexProbeSpec:
    return IndexProbeSpec.model_validate({
        "name": "chroma", "model": "m", "engine": "chroma", "k": K,
        "queries": {"scope_field": "tenant", "min_per_scope": 8},
        "budget": {"exact_searches": 120, "census_rows": 300},
        "census": {"degenerate_rows": 200, "hub_queries": 10, "grace_seconds": 0},
        "chroma": {"url": store["url"], "collection": collection, "filter_columns": ["tenant"], **section},
    })


def connector(store: dict[str, Any], collection: str = "cheap", **section: Any) -> ChromaConnector:
    built = build_connector(spec_for(store, collection, **section))
    assert isinstance(built, ChromaConnector)
    return built


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_exact_search_ranks_every_row_under_the_filter_in_chromas_own_distance(store: dict[str, Any]) -> None:
    c = connector(store, "good")
    rows, mask = store["rows"], store["tenants"] == "small"
    for q in vs.probe_queries(rows, 4, seed=3):
        exact = c.search(q.vector, K, (("tenant", "small"),), "exact")
        d = 1.0 - rows[mask].astype(np.float64) @ q.vector
        assert list(exact.ids) == list(np.array(store["ids"])[mask][np.argsort(d, kind="stable")[:K]])
        # the served search (ef_search 200 over 30 rows finds them all) reports the same distances: the
        # connector's distance is the engine's
        served = c.search(q.vector, K, (("tenant", "small"),), "served")
        assert list(served.ids) == list(exact.ids)
        assert np.allclose(served.distances, exact.distances, atol=1e-4)
    assert c.count() == N and c.dim == D
    assert c.hnsw["ef_search"] == 200 and c.hnsw["space"] == "cosine"  # the collection's own settings, read


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_the_cheap_hnsw_index_loses_recall_the_good_one_does_not(store: dict[str, Any]) -> None:
    results = {}
    for collection in ("cheap", "good"):
        probe = IndexProbe(spec_for(store, collection), connector(store, collection))
        for q in vs.probe_queries(store["rows"]):
            probe.buffer.add(q, 0.0)
        results[collection] = probe.run(Deadline.after(180), now=0.0).recall
    cheap, good = results["cheap"].row(), results["good"].row()
    assert cheap is not None and good is not None
    assert good.recall.mean >= 0.99
    assert cheap.recall.mean < good.recall.mean - 0.05  # ef_search 2, 4 neighbours: the index misses some


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_fetch_sample_and_count_read_the_stored_vectors(store: dict[str, Any]) -> None:
    c = connector(store)
    by_id = dict(zip(store["ids"], store["rows"], strict=True))
    fetched = c.fetch(["d1", "d2", "d2999", "nosuch"])
    assert set(fetched) == {"d1", "d2", "d2999"}
    assert all(np.allclose(fetched[i], by_id[i], atol=1e-6) for i in fetched)
    sample = c.sample(200)
    assert len(sample) == 200 and len({i for i, _ in sample}) == 200
    assert all(np.allclose(v, by_id[i], atol=1e-6) for i, v in sample)
    assert c.count() == N
    assert c.texts(["d7"]) == {"d7": "text of d7"}


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_a_current_index_has_no_stale_vectors_and_a_rotated_share_is_found(store: dict[str, Any]) -> None:
    n = 600
    rows = vs.unit_rows(n, D, seed=8)
    ids = [f"s{i}" for i in range(n)]
    stored = rows.copy()
    stale = np.arange(0, n, 10)  # 10 % in another model's space
    stored[stale] = rows[stale] @ random_rotation(D, seed=2).astype(np.float32)
    chroma.load(store["url"], "census", ids, stored)
    spec = spec_for(store, "census", filter_columns=[])
    spec.census.degenerate_rows = n
    probe = IndexProbe(spec, connector(store, "census", filter_columns=[]))
    probe.sketch.add(ids, rows, now=-10.0)
    census = probe.run(Deadline.after(120), now=0.0).census
    assert census is not None and census.sampled == 300
    assert census.stale.lower <= 0.1 <= census.stale.upper
    assert census.missing == 0


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_an_exact_search_over_more_rows_than_its_bound_is_refused_before_reading(store: dict[str, Any]) -> None:
    c = connector(store, exact_max_rows=1000, page_rows=500)
    with pytest.raises(ConnectorError) as caught:
        c.search(store["rows"][0], K, (), "exact")  # 3,000 rows: counted, not read
    assert caught.value.reason == "unsupported" and "exact_max_rows" in str(caught.value)
    with pytest.raises(ConnectorError) as filtered:
        c.search(store["rows"][0], K, (("tenant", "t0"),), "exact")  # 1,485 rows: stops at the bound
    assert filtered.value.reason == "unsupported"
    assert len(c.search(store["rows"][0], K, (("tenant", "small"),), "exact")) == K  # 30 rows: read


def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture
def silent() -> Iterator[int]:
    yield from silent_port()


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_every_failure_carries_its_reason(store: dict[str, Any], silent: int) -> None:
    def reason(c: ChromaConnector, query: np.ndarray | None = None, filter_: Any = (), mode: Any = "served") -> str:
        with pytest.raises(ConnectorError) as caught:
            c.search(np.ones(D, np.float32) if query is None else query, K, filter_, mode)
        return caught.value.reason

    assert reason(connector(store, "nosuch")) == "missing_table"
    assert reason(connector(store, metric="l2")) == "unsupported"  # the collection's space is cosine
    assert reason(connector(store), np.ones(D + 1, np.float32)) == "dimension"
    assert reason(connector(store), filter_=(("color", "red"),)) == "unsupported"  # not in filter_columns
    assert reason(connector(store), mode="exact_quantized") == "unsupported"
    closed = ChromaSettings.model_validate({"url": f"http://127.0.0.1:{free_port()}", "collection": "cheap"})
    assert reason(ChromaConnector(closed)) == "unreachable"
    hanging = ChromaSettings.model_validate({"url": f"http://127.0.0.1:{silent}", "collection": "cheap",
                                             "timeout_seconds": 0.5})
    assert reason(ChromaConnector(hanging)) == "timeout"


def test_filters_become_chroma_where_clauses() -> None:
    allowed = frozenset({"tenant", "lang", "n"})
    assert where((), allowed) is None
    assert where((("tenant", "t0"),), allowed) == {"tenant": {"$eq": "t0"}}
    assert where((("lang", "en"), ("n", 3)), allowed) == {"$and": [{"lang": {"$eq": "en"}}, {"n": {"$eq": 3}}]}
    with pytest.raises(ConnectorError):
        where((("n", float("nan")),), allowed)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=15)


@settings(max_examples=300, deadline=None)
@given(doc=st.one_of(json_values, st.fixed_dictionaries({"ids": json_values, "distances": json_values}),
                     st.fixed_dictionaries({"ids": json_values, "embeddings": json_values})))
def test_whatever_the_server_answers_parses_or_fails_with_a_reason(doc: Any) -> None:
    for parse in (lambda: parse_query(doc, K), lambda: parse_get(doc, D, K)):
        try:
            parse()
        except ConnectorError as exc:
            assert exc.reason in ("bad_result", "dimension")
