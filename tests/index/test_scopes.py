"""Per-scope evidence, its confidence sequences and the exact budget's allocation (monitor/index/scopes.py).

Simulated scopes (seeded): the engine is not needed to check the statistics; the integration on a
real pgvector is in tests/index/test_pgvector.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.index.estimators import QueryOutcome
from monitor.index.scopes import (
    SLOTS,
    ScopeEvidence,
    kl_bounds,
    log_term,
    next_scopes,
    scope_summary,
    screen_plan,
)


def test_kl_bounds_are_tighter_than_hoeffding_near_zero_and_trivial_without_data() -> None:
    lo, hi = kl_bounds(np.array([0.05, 0.5, 0.0]), np.array([50, 50, 0]), np.full(3, math.log(40)))
    hoeffding = math.sqrt(math.log(40) / (2 * 50))
    assert hi[0] < 0.05 + hoeffding and hi[0] > 0.05 and lo[0] < 0.05
    assert lo[1] < 0.5 < hi[1] and (lo[2], hi[2]) == (0.0, 1.0)


def test_the_confidence_sequence_covers_the_mean_at_every_read_of_every_path() -> None:
    """Read after every observation, 300 times, on 400 paths: the share of paths that ever miss is
    at most alpha (a fixed-n interval read this often would miss on most paths)."""
    rng = np.random.default_rng(0)
    alpha, paths, steps = 0.1, 400, 300
    for mean in (0.05, 0.6):
        values = rng.beta(mean * 4, (1 - mean) * 4, size=(paths, steps))  # in [0, 1], mean ``mean``
        n = np.arange(1, steps + 1)
        running = np.cumsum(values, axis=1) / n
        lo, hi = kl_bounds(running.ravel(), np.tile(n, paths), np.tile(log_term(n, alpha), paths))
        missed = ((lo.reshape(paths, steps) > mean) | (hi.reshape(paths, steps) < mean)).any(axis=1)
        assert missed.mean() <= alpha


def test_evidence_accumulates_over_cycles_and_forgets_past_the_window() -> None:
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10)
    for cycle in range(10):
        ev.add_exact("acme", [0.1, 0.0], [0.1, 0.0], [math.nan, math.nan], now=300.0 * cycle)
    b = ev.bounds(now=2700.0, alpha=0.05)
    assert b.n[0] == 20 and b.recall[0] == pytest.approx(0.05) and b.upper[0] < 0.6
    later = ev.bounds(now=2700.0 + 3600.0 + 300.0, alpha=0.05)
    assert later.n[0] == 0 and math.isnan(later.recall[0]) and later.upper[0] == 1.0


def test_ten_thousand_scopes_fit_in_fixed_memory() -> None:
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=60, max_scopes=1000)
    for i in range(10_000):
        ev.add_fill(f"s{i}", 1.0, False, now=float(i % 60))
    assert len(ev) == 1000 and ev.evicted == 9000
    assert ev._data.shape == (1000, SLOTS, ev._data.shape[2])  # the array never grows past max_scopes
    assert "s9999" in ev and "s0" not in ev  # the least recently seen made room


def test_fill_rate_bounds_recall_from_above_without_exact_searches() -> None:
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10)
    for _ in range(60):
        ev.add_fill("misc", 0.1, True, now=0.0)
        ev.add_fill("fine", 1.0, False, now=0.0)
    b = ev.bounds(now=0.0, alpha=0.05)
    i = b.index()
    assert b.upper[i["misc"]] < 0.5 and b.upper[i["fine"]] == 1.0 and b.under_lower[i["misc"]] > 0.7


def _simulate(recalls: dict[str, float], traffic: dict[str, int], cycles: int, budget: int, m: int,
              seed: int) -> tuple[ScopeEvidence, list[dict[str, int]]]:
    """Cycles of the adaptive share alone: each draw a Beta outcome (mean ``recall``) of the chosen scope."""
    rng = np.random.default_rng(seed)
    ev = ScopeEvidence(window_seconds=36_000, interval_seconds=300, max_scopes=len(recalls))
    names = sorted(recalls)
    for s in names:
        ev.touch(s, 0.0)
    spent_per_cycle = []
    for cycle in range(cycles):
        now = 300.0 * cycle
        spent: dict[str, int] = {}
        while sum(spent.values()) < budget:
            b = ev.bounds(now, 0.05, names)
            weights = np.array([traffic[s] for s in b.scopes], dtype=float)
            choices = next_scopes(b, np.ones(len(b.scopes), dtype=bool), weights, m)
            assert len(choices) in (2, 3) and len(set(choices)) == len(choices)
            for choice in choices[: budget - sum(spent.values())]:
                scope = b.scopes[choice]
                value = float(rng.beta(20 * recalls[scope], 20 * (1 - recalls[scope])))
                ev.add_exact(scope, [value], [value], [math.nan], now)
                spent[scope] = spent.get(scope, 0) + 1
        spent_per_cycle.append(spent)
    return ev, spent_per_cycle


@pytest.mark.slow
def test_lucb_puts_the_budget_on_the_worst_scope_once_found() -> None:
    """201 scopes, no fill rates, the bad one with the least traffic (explored last): once drawn it
    stays in the worst set and gets LUCB's h draws, far more than a share of 600 / 201."""
    recalls = {f"s{i}": 0.9 for i in range(200)} | {"bad": 0.05}
    traffic = {s: 10 for s in recalls} | {"bad": 3}
    ev, spent = _simulate(recalls, traffic, cycles=4, budget=150, m=3, seed=1)
    b = ev.bounds(900.0, 0.05)
    i = b.index()["bad"]
    assert b.n[i] >= 15 and b.n[i] >= np.sort(b.n)[-5]  # among the five most sampled of 201
    assert b.lower[i] <= 0.05 <= b.upper[i] < 0.7
    assert all(sum(c.values()) == 150 for c in spent)


def _outcomes(rng: np.random.Generator, scopes: list[str], recalls: dict[str, float], n: int,
              uniform: bool) -> list[QueryOutcome]:
    picked = rng.choice(scopes, size=n)
    return [QueryOutcome(str(s), float(rng.random() < recalls[str(s)]), 1.0, 1.0, False, uniform) for s in picked]


@pytest.mark.slow
def test_a_clean_index_flags_nothing_over_fifty_cycles_and_labels_stay_bounded() -> None:
    rng = np.random.default_rng(3)
    scopes = [f"s{i}" for i in range(1000)]
    recalls = {s: float(rng.uniform(0.88, 0.97)) for s in scopes}
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10_000)
    flags = 0
    for cycle in range(50):
        now = 300.0 * cycle
        outcomes = _outcomes(rng, scopes, recalls, 150, True) + _outcomes(rng, scopes, recalls, 150, False)
        for o in outcomes:
            ev.add_exact(o.scope, [o.recall], [o.epsilon_recall], [o.distance_ratio], now)
        for s in rng.choice(scopes, size=1200):
            ev.add_fill(str(s), 1.0, False, now)
        summary = scope_summary(outcomes, ev, now, scopes, worst=5, margin=0.1)
        flags += len(summary.flagged)
        assert len(summary.rows) <= 5 + 2 and summary.scopes_hidden == 1000 - 5
    assert flags == 0


def test_a_broken_scope_is_flagged_and_named_first_among_many() -> None:
    rng = np.random.default_rng(4)
    scopes = [f"s{i}" for i in range(1000)]
    recalls = dict.fromkeys(scopes, 0.93) | {"misc": 0.05}
    ev = ScopeEvidence(window_seconds=3600, interval_seconds=300, max_scopes=10_000)
    outcomes = _outcomes(rng, scopes, recalls, 150, True)
    for o in outcomes:
        ev.add_exact(o.scope, [o.recall], [o.epsilon_recall], [o.distance_ratio], 0.0)
    for _ in range(30):  # the screen: misc's served answers come back nearly empty
        ev.add_fill("misc", 0.1, True, 0.0)
    summary = scope_summary(outcomes, ev, 0.0, [*scopes, "misc"], worst=5, margin=0.1, spent={"misc": 4, "s1": 2})
    named = [r.scope for r in summary.rows if r.scope not in ("all", "other")]
    assert named[0] == "misc" and summary.flagged == ("misc",)
    assert summary.spent["misc"] == 4 and summary.scopes_hidden == 1001 - 5


def test_the_screen_covers_every_scope_within_a_few_cycles_without_repeats() -> None:
    rng = np.random.default_rng(5)
    labels = [f"s{i % 300}" for i in range(3000)]
    by_scope: dict[str, list[int]] = {}
    for i, s in enumerate(labels):
        by_scope.setdefault(s, []).append(i)
    seen: dict[str, float] = {}
    covered: set[str] = set()
    for cycle in range(3):
        plan = screen_plan(by_scope, [0, 1, 2], 400, 1, seen, len(labels), rng)
        assert len(plan) == len(set(plan)) == 400 and plan[:3] == [0, 1, 2]
        for i in plan:
            seen[labels[i]] = float(cycle)
            covered.add(labels[i])
    assert covered == set(by_scope)
