"""The index probe on a real Chroma server (``chroma run``): its HNSW search against the exact search.

3,000 clustered 32-d unit vectors with a ``tenant`` in their metadata (one tenant holds 1 %), in two
collections: one whose HNSW index searches with ``ef_search`` 2 and 4 neighbours per node (a cheap index
that misses neighbours), one with ``ef_search`` 200. Chroma has no brute-force switch: the exact answer is
every row under the same ``where``, read and ranked by the connector (bounded by ``exact_max_rows``).
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.config import Settings
from monitor.deadline import Deadline
from monitor.index.component import IndexComponent
from monitor.index.connectors import build_connector
from monitor.index.connectors.base import REASONS, ConnectorError
from monitor.index.connectors.chroma import ChromaConnector, parse_get, parse_query, where
from monitor.index.probe import IndexProbe
from monitor.index.sampling import ProbeQuery
from monitor.index.settings import ChromaSettings, IndexProbeSpec
from tests.support import chroma
from tests.support import hostile_http as hostile
from tests.support import vectorstores as vs
from tests.support.broker import free_port
from tests.support.probes import probe_context
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
    for value in (float("nan"), float("inf"), 2**63, -(2**63) - 1, "a\x00", "\ud800"):
        with pytest.raises(ConnectorError) as caught:
            where((("n", value),), allowed)
        assert caught.value.reason == "bad_filter", value
    # what Chroma's metadata holds passes as it is: a boolean stays a boolean (true never equals 1)
    assert where((("n", True),), allowed) == {"n": {"$eq": True}}
    assert where((("n", 2**63 - 1),), allowed) == {"n": {"$eq": 2**63 - 1}}
    assert where((("n", 1.5),), allowed) == {"n": {"$eq": 1.5}}


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


# ---------------------------------------------------------------------- admission, ids, re-description
@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_filter_values_chroma_cannot_take_skip_their_query_and_odd_ids_are_absent(store: dict[str, Any]) -> None:
    """Chroma answers an integer beyond int64 with 400 'Invalid where clause' (the whole cycle would fail as
    ``other``); admitted first, such a query is skipped as ``bad_filter`` and the others are measured."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        chroma.call(f"{store['url']}{chroma.ROOT}/collections/{chroma_id(store, 'good')}/get", "POST",
                    {"where": {"tenant": {"$eq": 2**63}}, "limit": 1})
    refused.value.close()
    assert refused.value.code == 400
    spec = spec_for(store, "good", exact_max_rows=100)
    spec.queries.scope_field = None
    spec.census.enabled = False
    spec.attribution = False  # no unfiltered exact twin: 100 rows bound every exact search
    c = connector(store, "good", exact_max_rows=100)
    probe = IndexProbe(spec, c)
    rows = store["rows"]
    for i in range(4):
        probe.buffer.add(ProbeQuery(rows[i], (("tenant", "small"),)), 0.0)
    for bad in (2**63, float("nan"), "small\x00", -(2**64)):
        probe.buffer.add(ProbeQuery(rows[9], (("tenant", bad),)), 0.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.skipped == {"bad_filter": 4} and result.queries == 4
    # ids Chroma cannot hold (empty, NUL, lone surrogate, past 512 characters) are absent, never an error
    assert set(c.fetch(["d1", "", "d2\x00", "\ud800", "x" * 600, "d1"])) == {"d1"}
    assert c.fetch(["", "\x00"]) == {} and c.texts(["d3", "\ud800"]) == {"d3": "text of d3"}


def chroma_id(store: dict[str, Any], name: str) -> str:
    return str(chroma.call(f"{store['url']}{chroma.ROOT}/collections/{name}")["id"])


@pytest.mark.slow  # the module's Chroma server and collections: about 10 s
def test_a_collection_recreated_with_another_dimension_is_measured_at_the_next_cycle(store: dict[str, Any]) -> None:
    old, new = vs.unit_rows(200, D, seed=11), vs.unit_rows(200, 16, seed=12)
    ids = [f"r{i}" for i in range(200)]
    chroma.load(store["url"], "recreated", ids, old)
    spec = spec_for(store, "recreated", filter_columns=[])
    spec.queries.scope_field = None
    spec.census.enabled = False
    c = connector(store, "recreated", filter_columns=[])
    probe = IndexProbe(spec, c)
    for i in range(5):
        probe.buffer.add(ProbeQuery(old[i]), 0.0)
    first = probe.run(Deadline.after(60), now=0.0)
    assert first.queries == 5 and c.dim == D
    chroma.delete(store["url"], "recreated")
    chroma.load(store["url"], "recreated", ids, new)
    # within a cycle the old id is gone: missing_table, and the next call describes the collection again
    with pytest.raises(ConnectorError) as caught:
        c.count()
    assert caught.value.reason == "missing_table"
    assert c.count() == 200 and c.dim == 16
    chroma.delete(store["url"], "recreated")
    chroma.load(store["url"], "recreated", ids, old)  # back to D dimensions, under a third id
    for i in range(5):
        probe.buffer.add(ProbeQuery(new[i]), 0.0)
    second = probe.run(Deadline.after(60), now=0.0)  # the cycle re-describes it first: no failed call
    assert c.dim == D and second.queries == 5 and second.skipped == {"dimension": 5}
    recall = second.recall.row()
    assert recall is not None and recall.recall.mean > 0.9


# ---------------------------------------------------------------------- hostile servers
SLACK = 4.0  # seconds a loaded machine may add to a deadline (the cycle never returns without it)
DESCRIPTION = chroma.description("docs", dim=4)


def hostile_connector(url: str, deadline: float, tmp_path: Path) -> ChromaConnector:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    c = ChromaConnector(ChromaSettings.model_validate({"url": url, "collection": "docs", "token_file": str(token),
                                                       "timeout_seconds": 60}))
    c.deadline = Deadline.after(deadline)
    return c


FAULTS = {  # what the server does -> the reason the connector must give
    "drip": (lambda: hostile.drip(b"1" * 200, every=0.05), "timeout"),  # 10 s of a 200-byte count
    "bloat": (lambda: hostile.bloat(64 << 20), "oversized"),
    "bloat_undeclared": (lambda: hostile.bloat(64 << 20, declare=False), "oversized"),
    "endless_chunked": (lambda: hostile.endless_chunked(), "oversized"),
    "lie_length": (lambda: hostile.lie_length(b"12", 400), "bad_result"),
    "close_mid_body": (lambda: hostile.close_mid_body(b"[" + b"1," * 100 + b"1]"), "bad_result"),
    "garbage": (lambda: hostile.raw(b"SSH-2.0-OpenSSH\r\n\r\n"), "bad_result"),
    "not_json": (lambda: hostile.answer(b"<html>proxy</html>"), "bad_result"),
    "unauthorized": (lambda: hostile.answer(b'{"error":"AuthError"}', 401), "permission"),
    "gone": (lambda: hostile.answer(b'{"error":"NotFoundError"}', 404), "missing_table"),
    "overloaded": (lambda: hostile.answer(b"busy", 503), "unreachable"),
}


@pytest.mark.parametrize("spare_description", [False, True], ids=["at_description", "at_count"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_hostile_server_ends_in_its_reason_by_the_deadline(fault: str, spare_description: bool,
                                                             tmp_path: Path) -> None:
    behaviour, reason = FAULTS[fault]
    with chroma.Front(description=DESCRIPTION) as front:
        front.fault, front.spare_description = behaviour(), spare_description
        c = hostile_connector(front.url, 1.0, tmp_path)
        started = time.monotonic()
        with pytest.raises(ConnectorError) as caught:
            c.count()
        elapsed = time.monotonic() - started
    assert caught.value.reason == reason, caught.value
    assert elapsed < 1.0 + SLACK, elapsed
    assert "s3cret" not in str(caught.value)


def test_a_redirect_is_not_followed_and_the_token_stays_home(tmp_path: Path) -> None:
    with hostile.serving(hostile.answer(DESCRIPTION)) as attacker, chroma.Front(description=DESCRIPTION) as front:
        for spare in (False, True):
            front.fault, front.spare_description = hostile.redirect(f"{attacker.url}/steal", 307), spare
            c = hostile_connector(front.url, 5.0, tmp_path)
            with pytest.raises(ConnectorError) as caught:
                c.search(np.ones(4, np.float32), K, (), "served")
            assert caught.value.reason == "redirect"
        assert front.server.requests[0].header("authorization") == "Bearer s3cret-token"
    assert attacker.requests == []


@pytest.mark.slow  # the module's Chroma server, and a cycle that drips to its deadline: about 15 s
def test_a_probe_meets_each_fault_counts_it_returns_by_its_deadline_and_recovers(
    store: dict[str, Any], tmp_path: Path
) -> None:
    timeout = 6.0
    with chroma.Front(store["url"]) as front, hostile.serving(hostile.answer(b"{}")) as attacker:
        probe = {"name": "p", "model": "m", "engine": "chroma", "k": K, "timeout_seconds": timeout,
                 "budget": {"exact_searches": 8}, "census": {"enabled": False},
                 "chroma": {"url": front.url, "collection": "good", "filter_columns": ["tenant"]}}
        c = IndexComponent(probe_context(Settings(state_dir=tmp_path, index={"probes": [probe]})))
        for q in vs.probe_queries(store["rows"], 8, seed=4):
            c.probes["p"].buffer.add(ProbeQuery(q.vector, (("tenant", "small"),)), c.context.clock())
        assert c.run_probe("p") is not None
        faults = [
            ("drip", hostile.drip(b"[" + b"0," * 5000 + b"0]", every=0.05), False, "timeout"),
            ("bloat", hostile.bloat(64 << 20), True, "oversized"),  # a search answer: 10 rows asked for
            ("redirect", hostile.redirect(f"{attacker.url}/x", 302), False, "redirect"),
            ("lie", hostile.lie_length(b"{}", 100), True, "bad_result"),
            ("unauthorized", hostile.answer(b"{}", 403), False, "permission"),
        ]
        durations = {}
        for name, behaviour, spare, _ in faults:
            front.fault, front.spare_description = behaviour, spare
            started = time.monotonic()
            assert c.run_probe("p") is None
            durations[name] = time.monotonic() - started
            front.fault = None
            assert c.run_probe("p") is None  # backing off one cycle
            result = c.run_probe("p")
            assert result is not None and result.queries > 0, name  # recovered
        print("chroma fault cycles (s):", {k: round(v, 2) for k, v in durations.items()})
        assert all(d < timeout + SLACK for d in durations.values()), durations
        assert durations["drip"] >= 0.8 * timeout * 0.85  # the drip held it to the cutoff, not less
        assert {r: n for (_, r), n in c.snapshot.errors.items()} == {reason: 1 for *_, reason in faults}
        c.close()
    assert attacker.requests == []


# ---------------------------------------------------------------------- fuzz through the client
answers = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"ids": json_values, "distances": json_values}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"ids": json_values, "embeddings": json_values}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)
heads = st.sampled_from([200, 200, 200, 400, 401, 404, 500, 503])


@pytest.fixture(scope="module")
def fuzz_front() -> Iterator[chroma.Front]:
    with chroma.Front(description=DESCRIPTION) as front:
        front.spare_description = True
        yield front


@pytest.mark.slow  # 150 examples of four calls over loopback: 4.4 s alone, 6.1 s in the fast tier, on a slow day
@settings(max_examples=150, deadline=None)
@given(body=answers, status=heads, raw=st.booleans())
def test_whatever_the_server_sends_ends_in_an_answer_or_a_reason(fuzz_front: chroma.Front, body: bytes, status: int,
                                                                 raw: bool) -> None:
    fuzz_front.fault = hostile.raw(body) if raw else hostile.answer(body, status)
    c = ChromaConnector(ChromaSettings.model_validate({"url": fuzz_front.url, "collection": "docs",
                                                       "timeout_seconds": 5}))
    for call in (lambda: c.search(np.ones(4, np.float32), K, (), "served"), lambda: c.fetch(["a", "b"]),
                 c.count, lambda: c.sample(2)):
        try:
            call()
        except ConnectorError as exc:
            assert exc.reason in REASONS and exc.reason != "timeout", exc
    # and the connector still answers once the server does
    fuzz_front.fault = hostile.answer(b'{"ids": [["a"]], "distances": [[0.25]]}')
    c.refresh()
    assert c.search(np.ones(4, np.float32), K, (), "served").ids == ("a",)
    assert not math.isnan(c.search(np.ones(4, np.float32), K, (), "served").distances[0])


def test_an_answer_is_capped_by_what_was_asked(tmp_path: Path) -> None:
    """A fetch of 2 ids of a 4-d collection may take 64 KiB + 2 x (1 KiB + 4 x 32) bytes: one byte
    more is ``oversized``, however valid; a count 1 KiB."""
    cap = 64 * 1024 + 2 * (1024 + 4 * 32)
    doc = b'{"ids": ["a", "b"], "embeddings": [[1, 0, 0, 0], [0, 1, 0, 0]]}'
    with chroma.Front(description=DESCRIPTION) as front:
        front.spare_description = True
        c = hostile_connector(front.url, 30.0, tmp_path)
        front.fault = hostile.answer(doc + b" " * (cap - len(doc)))
        assert set(c.fetch(["a", "b"])) == {"a", "b"}
        front.fault = hostile.answer(doc + b" " * (cap - len(doc) + 1))
        with pytest.raises(ConnectorError) as caught:
            c.fetch(["a", "b"])
        assert caught.value.reason == "oversized"
        front.fault = hostile.answer(b" " * 1024 + b"7")
        with pytest.raises(ConnectorError) as counted:
            c.count()
        assert counted.value.reason == "oversized"
