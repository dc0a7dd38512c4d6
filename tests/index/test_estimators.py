"""The index probe's estimators and samplers (monitor/index/estimators.py, monitor/index/sampling.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monitor.index.estimators import (
    NONE,
    QueryOutcome,
    generations,
    k_occurrence_skewness,
    outcome,
    recall_loss,
    summarise,
    wilson,
)
from monitor.index.sampling import IdSketch, ProbeQuery, draw, id_hash


def test_outcome_counts_ties_at_the_kth_distance_as_found_and_flags_under_return() -> None:
    # served "c" at the same distance as the exact 2nd "b": a tie, not a miss, for epsilon-recall
    o = outcome(["a", "c"], np.array([0.1, 0.2]), ["a", "b"], np.array([0.1, 0.2]), 2, 0.0)
    assert o is not None and o.recall == 0.5 and o.epsilon_recall == 1.0 and not o.under_return
    short = outcome(["a"], np.array([0.1]), ["a", "b", "c"], np.array([0.1, 0.2, 0.3]), 3, 0.01)
    assert short is not None and short.under_return and math.isclose(short.recall, 1 / 3)
    assert math.isnan(short.distance_ratio)
    far = outcome(["a", "z"], np.array([0.1, 0.4]), ["a", "b"], np.array([0.1, 0.2]), 2, 0.01)
    assert far is not None and far.distance_ratio == pytest.approx(2.0) and far.epsilon_recall == 0.5
    assert outcome([], np.array([]), [], np.array([]), 10, 0.01) is None  # an empty scope: no recall


def test_outcome_on_a_scope_smaller_than_k_uses_what_exists() -> None:
    o = outcome(["a", "b"], np.array([0.1, 0.2]), ["a", "b"], np.array([0.1, 0.2]), 10, 0.01)
    assert o is not None and o.recall == 1.0 and not o.under_return


def _o(scope: str, recall: float, uniform: bool = True, under: bool = False) -> QueryOutcome:
    return QueryOutcome(scope, recall, recall, 1.0, under, uniform)


def test_summarise_names_the_worst_scope_pools_the_rest_and_counts_hidden() -> None:
    outcomes = [_o(f"t{i % 8}", 0.95) for i in range(400)] + [_o("bad", 0.1, uniform=False, under=True)] * 6
    s = summarise(outcomes, worst=3)
    assert s.rows[0].scope == "all" and s.rows[0].queries == 400  # top-ups do not bias the overall
    named = [r.scope for r in s.rows if r.scope not in ("all", "other")]
    assert named[0] == "bad" and len(named) == 3
    assert s.flagged[0] == "bad" and "t1" not in s.flagged
    assert s.row("other") is not None and s.scopes_hidden == 9 - 3
    assert s.row("bad").under_return == 1.0 and s.row("bad").p5 == pytest.approx(0.1)


def test_summarise_tail_percentiles() -> None:
    values = [0.0] * 5 + [1.0] * 95
    s = summarise([_o(NONE, v) for v in values], worst=5)
    row = s.row()
    assert row.p5 == 0.0 and row.p10 == 1.0 and row.recall.mean == pytest.approx(0.95)
    assert row.recall.lower < 0.95 < row.recall.upper


def test_recall_loss_splits_filter_and_quantization_from_graph() -> None:
    outcomes = [QueryOutcome("t", 0.5, 0.5, 1.0, True, True, filtered=True, unfiltered_recall=0.9,
                             quantized_recall=0.95)] * 10
    loss = recall_loss(outcomes)
    assert loss["total"] == pytest.approx(0.5) and loss["filter"] == pytest.approx(0.4)
    assert loss["quantization"] == pytest.approx(0.05) and loss["graph"] == pytest.approx(0.05)


def test_wilson_covers_and_is_exact_at_zero() -> None:
    assert wilson(0, 2000).lower == 0.0 and wilson(0, 2000).upper < 0.002
    i = wilson(100, 2000)
    assert i.lower < 0.05 < i.upper and i.upper - i.lower < 0.02
    rng = np.random.default_rng(0)
    covered = sum(wilson(int(rng.binomial(1000, 0.05)), 1000).lower <= 0.05 <= wilson(
        int(rng.binomial(1000, 0.05)), 1000).upper for _ in range(1))
    assert covered == 1


def test_wilson_coverage_over_many_draws() -> None:
    rng = np.random.default_rng(1)
    draws = rng.binomial(1500, 0.05, size=2000)
    covered = np.mean([wilson(int(x), 1500).lower <= 0.05 <= wilson(int(x), 1500).upper for x in draws])
    assert covered >= 0.93


def test_generations_separate_two_old_models() -> None:
    c = np.concatenate([np.ones(900), np.full(60, 0.05), np.full(40, 0.7)])
    shares = generations(c, 1e-3)
    assert shares == pytest.approx([0.9, 0.06, 0.04])
    assert generations(np.ones(10), 1e-3) == [1.0]


def test_k_occurrence_skewness_sees_a_hub() -> None:
    flat = {f"d{i}": 1 for i in range(1000)}
    assert k_occurrence_skewness(flat, 1000) == pytest.approx(0.0)
    hub = {**{f"d{i}": 1 for i in range(900)}, "hub": 100}
    assert k_occurrence_skewness(hub, 1000) > 10


def test_draw_is_uniform_first_and_tops_up_small_scopes() -> None:
    qs = [ProbeQuery(np.zeros(2, np.float32), (("tenant", "big"),))] * 990 + [
        ProbeQuery(np.ones(2, np.float32), (("tenant", "tiny"),))] * 10
    picked = draw(qs, 100, "tenant", 5, np.random.default_rng(3))
    assert 95 <= len(picked) <= 100  # the reserve for top-ups not needed is left unspent
    tiny = [u for q, u in picked if q.scope("tenant") == "tiny"]
    assert len(tiny) >= 5 and sum(u for _, u in picked) >= 50
    assert draw(qs, 10, None, 5, np.random.default_rng(0)) and all(u for _, u in draw(qs, 10, None, 5,
                                                                                        np.random.default_rng(0)))
    assert draw([], 10, "tenant", 5, np.random.default_rng(0)) == []


def test_id_sketch_keeps_the_smallest_hashes_and_the_latest_vector() -> None:
    sketch = IdSketch(50)
    ids = [f"id-{i}" for i in range(1000)]
    vectors = np.arange(2000, dtype=np.float32).reshape(1000, 2)
    sketch.add(ids, vectors, now=1.0)
    kept = {i for i, _, _ in sketch.items()}
    assert kept == set(sorted(ids, key=id_hash)[:50])
    one = sorted(kept)[0]
    sketch.add([one], np.array([[7.0, 7.0]], np.float32), now=2.0)
    latest = {i: (v, t) for i, v, t in sketch.items()}
    assert latest[one][0].tolist() == [7.0, 7.0] and latest[one][1] == 2.0
    assert len(sketch) == 50 and sketch.threshold == max(id_hash(i) for i in kept)
