"""Click feedback: beyond-accuracy formulas by hand, a hand-worked probe run, and the probe end to end
through a real Kafka-compatible broker (documents and interactions topics, /metrics over HTTP)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.probes.clicks import catalog_coverage, gini, merge_events, popularity_bias
from monitor.retrieval.probes.component import ProbeComponent
from monitor.retrieval.stats import bootstrap_ci
from tests.support import daemons
from tests.support.broker import FAST_GROUP_OPTIONS, Broker
from tests.support.probes import collect, probe_context
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until


# ---------------------------------------------------------------------------- formulas
@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([1, 1, 1, 1], 0.0),  # even exposure
        ([0, 0, 0, 1], 0.75),  # one item gets everything: (n - 1) / n
        ([1, 2, 3, 4], 0.25),  # (2·30 − 5·10) / (4·10)
        ([4, 3, 2, 1], 0.25),  # order does not matter
        ([3, 2, 1, 1, 1, 1], 13 / 54),  # seed 000's example (recommended items only): 0.24
        ([3, 2, 1, 1, 1, 1, 0, 0, 0, 0], 49 / 90),  # the same over its 10-item catalog
    ],
)
def test_gini_by_hand(counts: list[int], expected: float) -> None:
    assert gini(counts) == pytest.approx(expected, abs=1e-12)


def test_gini_coverage_and_popularity_edge_cases() -> None:
    assert math.isnan(gini([])) and math.isnan(gini([0, 0]))
    with pytest.raises(ValueError, match="non-negative"):
        gini([2, -1])
    assert catalog_coverage(["a", "b", "z", "a"], {"a", "b", "c", "d"}, 4) == 0.5  # z is not in the catalog
    assert catalog_coverage(["a", "b", "z"], None, 10) == pytest.approx(0.3)  # only the size is known
    assert catalog_coverage(["a", "b"], None, 1) == 1.0  # capped: never above 1
    assert popularity_bias({"a": 2, "b": 1}, {"a": 3, "c": 1}, universe_size=4) == pytest.approx(2.0)
    assert popularity_bias({"a": 1, "b": 1, "c": 1, "d": 1}, {"a": 1, "b": 1, "c": 1, "d": 1}, 4) == 1.0  # unbiased
    assert math.isnan(popularity_bias({}, {"a": 1}, 4)) and math.isnan(popularity_bias({"a": 1}, {}, 4))


def test_seed_000_beyond_accuracy_example_under_the_fixed_definitions() -> None:
    """Section 21.4.2: coverage 0.60 and popularity bias 1.60 hold; the Gini over the catalog is
    0.54, not the seed's 0.24 (which ignores the 4 catalog items never recommended)."""
    recommendations = [["item_1", "item_2", "item_3"], ["item_1", "item_4", "item_5"], ["item_1", "item_2", "item_6"]]
    popularity = {f"item_{i}": 100 - i * 10 for i in range(1, 11)}
    counts = Counter(item for rec in recommendations for item in rec[:3])
    assert round(catalog_coverage(counts, set(popularity), len(popularity)), 2) == 0.60
    assert round(popularity_bias(counts, popularity, len(popularity)), 2) == 1.60
    assert round(gini(list(counts.values())), 2) == 0.24
    assert round(gini([*counts.values(), *[0] * (len(popularity) - len(counts))]), 2) == 0.54


def test_events_sharing_a_query_id_are_merged() -> None:
    events = [
        InteractionEvent(model="m", query_id="q1", results=("a", "b"), slice="head"),
        InteractionEvent(model="m", query_id="q1", clicks=("b",)),
        InteractionEvent(model="m", query_id="q1", clicks=("a",), relevance={"a": 3.0}),
        InteractionEvent(model="m", results=("c",)),
        InteractionEvent(model="m", results=("d",)),  # no query_id: stands alone
    ]
    merged = merge_events(events)
    assert [(q.results, q.slice) for q in merged] == [(("a", "b"), "head"), (("c",), None), (("d",), None)]
    assert merged[0].qrels(1.0) == {"b": 1.0, "a": 3.0}  # an explicit grade overrides the click's


# ---------------------------------------------------------------------------- hand-worked run
def test_a_hand_worked_window(tmp_path: Path) -> None:
    settings = load_settings(overrides={"state_dir": str(tmp_path), "probes": {
        "statistics": {"resamples": 100}, "clicks": [{"name": "clicks", "model": "m", "k": [1, 2]}]}})
    comp = ProbeComponent(probe_context(settings, clock=lambda: 100.0))
    catalog = tuple("abcdefgh")
    comp.on_embeddings(EmbeddingBatch("m", "documents", np.ones((8, 2), dtype=np.float32), ids=catalog), 50.0)
    comp.on_embeddings(EmbeddingBatch("m", "queries", np.ones((1, 2), dtype=np.float32), ids=("x",)), 50.0)
    for event in [
        InteractionEvent(model="m", query_id="q1", results=("a", "b", "c"), clicks=("b",)),
        InteractionEvent(model="m", query_id="q2", results=("c", "a")),
        InteractionEvent(model="m", query_id="q3", results=()),
        InteractionEvent(model="m", query_id="q4", results=("a", "d"), clicks=("a",), relevance={"d": 2.0}),
        InteractionEvent(model="other", query_id="q5", results=("a",), clicks=("a",)),  # another model
    ]:
        comp.on_interaction(event, now=90.0)
    comp.run_probe("clicks")
    s = collect(comp)
    labels = {"probe": "clicks", "model": "m", "slice": "all"}
    ndcg_q1 = (1 / math.log2(3)) / 1.0
    ndcg_q4 = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert value(s, "embmon_retrieval_mrr", **labels, k="2") == pytest.approx((0.5 + 0 + 1) / 3)
    assert value(s, "embmon_retrieval_mrr", **labels, k="1") == pytest.approx(1 / 3)
    assert value(s, "embmon_retrieval_ndcg", **labels, k="2") == pytest.approx((ndcg_q1 + 0 + ndcg_q4) / 3)
    assert value(s, "embmon_retrieval_click_through_rate", **labels, k="1") == pytest.approx(1 / 3)
    assert value(s, "embmon_retrieval_click_through_rate", **labels, k="2") == pytest.approx(2 / 3)
    assert value(s, "embmon_retrieval_zero_result_ratio", **labels) == 0.25
    assert value(s, "embmon_retrieval_queries", **labels) == 3  # the zero-result query has no ranking
    pm = {"probe": "clicks", "model": "m"}
    # top-2 lists: a×3, b, c, d over a catalog of 8 (the "queries" stream is not the catalog)
    assert value(s, "embmon_retrieval_catalog_coverage_ratio", **pm) == 0.5
    assert value(s, "embmon_retrieval_gini", **pm) == pytest.approx(gini([3, 1, 1, 1, 0, 0, 0, 0]))
    assert value(s, "embmon_retrieval_gini", **pm) == pytest.approx(0.625)
    # clicked once each: b, a, d; slots a,a,a,b,c,d -> (3 + 1 + 0 + 1)/6 over 3/8
    assert value(s, "embmon_retrieval_popularity_bias", **pm) == pytest.approx((5 / 6) / (3 / 8))
    assert value(s, "embmon_retrieval_mrr", probe="clicks", model="other", slice="all", k="2") is None


def test_events_older_than_the_window_are_forgotten_and_overflow_is_counted(tmp_path: Path) -> None:
    settings = load_settings(overrides={"state_dir": str(tmp_path), "probes": {"clicks": [
        {"name": "c", "window_seconds": 60, "buffer_size": 3, "catalog_stream": None}]}})
    now = [0.0]
    comp = ProbeComponent(probe_context(settings, clock=lambda: now[0]))
    comp.on_interaction(InteractionEvent(model="m", results=("a",), clicks=("a",)), now=0.0)
    for t in (70.0, 71.0, 72.0, 73.0):  # the ring holds 3: the t=70 event is evicted inside the window
        comp.on_interaction(InteractionEvent(model="m", results=("b",)), now=t)
    now[0] = 75.0
    comp.run_probe("c")
    s = collect(comp)
    assert value(s, "embmon_retrieval_queries", probe="c", model="m", slice="all") == 3
    assert value(s, "embmon_retrieval_click_through_rate", probe="c", model="m", slice="all", k="10") == 0
    assert value(s, "embmon_probe_events_dropped_total", probe="c") == 1  # t=0 left the window: not a drop
    assert value(s, "embmon_retrieval_catalog_coverage_ratio", probe="c", model="m") is None  # no catalog


# ---------------------------------------------------------------------------- through the broker
def simulate(rng: np.random.Generator, n_items: int, n_queries: int) -> tuple[list[dict], list[dict]]:
    """A popularity-biased recommender and position-biased clicks; some clicks arrive as separate events."""
    weights = 1.0 / np.arange(1, n_items + 1) ** 1.1
    weights /= weights.sum()
    impressions, clicks = [], []
    for n in range(n_queries):
        slice_ = "head" if n % 3 else "tail"
        if rng.random() < 0.08:
            impressions.append({"query_id": f"q{n}", "model": "rec", "results": [], "slice": slice_})
            continue
        results = [f"item-{i}" for i in rng.choice(n_items, size=10, replace=False, p=weights)]
        clicked = [r for rank, r in enumerate(results) if rng.random() < 0.35 / (rank + 1)]
        event = {"query_id": f"q{n}", "model": "rec", "results": results, "slice": slice_}
        if n % 4 == 0 and clicked:  # the click arrives later, as its own event
            clicks.append({"query_id": f"q{n}", "model": "rec", "clicks": clicked[:1]})
            clicked = clicked[1:]
        if clicked:
            event["clicks"] = clicked
        if n % 5 == 0 and clicked:
            event["relevance"] = {clicked[0]: 3}
        impressions.append(event)
    return impressions, clicks


def expected_from(events: list[dict], catalog: set[str], k: int) -> dict[str, float]:
    by_id: dict[str, dict] = {}
    for e in events:
        q = by_id.setdefault(e["query_id"], {"results": [], "clicks": [], "relevance": {}, "slice": None})
        q["results"] = q["results"] or e.get("results", [])
        q["clicks"] += e.get("clicks", [])
        q["relevance"].update(e.get("relevance", {}))
        q["slice"] = q["slice"] or e.get("slice")
    queries = list(by_id.values())
    judged = [q for q in queries if q["results"]]
    qrels = [{**dict.fromkeys(q["clicks"], 1.0), **q["relevance"]} for q in judged]
    per_query = evaluate(RankedResults.from_lists([q["results"] for q in judged], qrels), [f"mrr@{k}", f"ndcg@{k}"])
    ci = bootstrap_ci(per_query, resamples=300, seed=0)
    counts = Counter(d for q in judged for d in q["results"][:k])
    popularity = Counter(d for graded in qrels for d, g in graded.items() if g > 0)
    universe = catalog | set(counts) | set(popularity)
    return {
        "mrr": ci[f"mrr@{k}"].mean, "mrr_lower": ci[f"mrr@{k}"].lower, "ndcg": ci[f"ndcg@{k}"].mean,
        "ctr": float(np.mean([any(d in g for d in q["results"][:k]) for q, g in zip(judged, qrels, strict=True)])),
        "zero": sum(not q["results"] for q in queries) / len(queries),
        "zero_tail": float(np.mean([not q["results"] for q in queries if q["slice"] == "tail"])),
        "coverage": len(set(counts) & catalog) / len(catalog),
        "gini": gini([counts.get(i, 0) for i in universe]),
        "popularity": popularity_bias(counts, popularity, len(universe)),
        "judged": len(judged),
    }


@pytest.mark.slow  # 7.6 s on the 2-core machine, waiting on the broker (.cache/test-durations.json)
@pytest.mark.broker
def test_click_feedback_through_the_broker(broker: Broker, tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    n_items = 400
    impressions, late_clicks = simulate(rng, n_items, 360)
    catalog = {f"item-{i}" for i in range(n_items)}
    broker.create_topics("probe-docs", "probe-interactions")
    producer = broker.producer()
    vectors = rng.standard_normal((n_items, 8)).astype(np.float32)
    for i in range(n_items):  # the documents stream defines the catalog
        producer.send("probe-docs", orjson.dumps({"id": f"item-{i}", "model": "rec", "stream": "documents",
                                                  "vector": vectors[i].tolist()}))
    for event in impressions + late_clicks:
        producer.send("probe-interactions", orjson.dumps(event))
    producer.flush()
    producer.close()
    expected = expected_from(impressions + late_clicks, catalog, 10)

    settings = load_settings(overrides={
        "source": "kafka",
        "kafka": {"bootstrap_servers": broker.bootstrap, "embeddings_topic": "probe-docs",
                  "interactions_topic": "probe-interactions", "group_id": "probe-clicks",
                  "auto_offset_reset": "earliest", "poll_timeout_seconds": 0.2, "options": dict(FAST_GROUP_OPTIONS)},
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path / "state"), "refresh_seconds": 0.5,
        "probes": {"statistics": {"resamples": 300},
                   "clicks": [{"name": "clicks", "model": "rec", "k": [10], "window_seconds": 600,
                               "interval_seconds": 0.5, "timeout_seconds": 20}]},
    })
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port
        n_events = len(impressions) + len(late_clicks)
        wait_until(lambda: value(scrape(port), "embmon_interactions_total", model="rec") == n_events
                   and value(scrape(port), "embmon_records_total", model="rec", stream="documents") == n_items,
                   timeout=60, message="documents and interactions consumed")
        runs = value(scrape(port), "embmon_probe_runs_total", probe="clicks", outcome="success") or 0
        wait_until(
            lambda: value(scrape(port), "embmon_probe_runs_total", probe="clicks", outcome="success") >= runs + 2,
            timeout=30,
            message="two probe runs over the complete window",
        )
        s = scrape(port)
    labels = {"probe": "clicks", "model": "rec", "slice": "all"}
    assert value(s, "embmon_retrieval_queries", **labels) == expected["judged"]
    assert value(s, "embmon_retrieval_mrr", **labels, k="10") == pytest.approx(expected["mrr"], abs=1e-12)
    assert value(s, "embmon_retrieval_mrr_ci_lower", **labels, k="10") == pytest.approx(
        expected["mrr_lower"], abs=1e-12
    )
    assert value(s, "embmon_retrieval_ndcg", **labels, k="10") == pytest.approx(expected["ndcg"], abs=1e-12)
    assert value(s, "embmon_retrieval_click_through_rate", **labels, k="10") == pytest.approx(
        expected["ctr"], abs=1e-12
    )
    assert value(s, "embmon_retrieval_zero_result_ratio", **labels) == pytest.approx(expected["zero"], abs=1e-12)
    assert value(s, "embmon_retrieval_zero_result_ratio", **{**labels, "slice": "tail"}) == pytest.approx(
        expected["zero_tail"], abs=1e-12)
    pm = {"probe": "clicks", "model": "rec"}
    assert value(s, "embmon_retrieval_catalog_coverage_ratio", **pm) == pytest.approx(expected["coverage"], abs=1e-12)
    assert value(s, "embmon_retrieval_gini", **pm) == pytest.approx(expected["gini"], abs=1e-12)
    assert value(s, "embmon_retrieval_popularity_bias", **pm) == pytest.approx(expected["popularity"], abs=1e-12)
    # the simulated recommender favours popular items: visibly unequal exposure, popularity bias > 1
    assert expected["gini"] > 0.4 and expected["popularity"] > 1.5 and expected["coverage"] < 0.9
    assert value(s, "embmon_probe_runs_total", probe="clicks", outcome="failure") == 0


def test_slices_past_the_cap_fold_into_other_for_every_number(tmp_path: Path) -> None:
    settings = load_settings(overrides={"state_dir": str(tmp_path), "probes": {
        "statistics": {"resamples": 50, "max_slices": 3, "min_slice_queries": 2},
        "clicks": [{"name": "c", "model": "m", "k": [1], "catalog_stream": None}]}})
    comp = ProbeComponent(probe_context(settings, clock=lambda: 10.0))
    # head x4, tail x3, then three rare slices: the cap keeps head and tail, the rest is "other"
    for n, slice_ in enumerate(["head"] * 4 + ["tail"] * 3 + ["rare1", "rare2", "rare3"]):
        results = () if slice_ == "rare3" else ("a", "b")
        comp.on_interaction(
            InteractionEvent(model="m", query_id=str(n), results=results, clicks=("a",) if n % 2 else (), slice=slice_),
            now=5.0,
        )
    comp.run_probe("c")
    s = collect(comp)
    labels = {"probe": "c", "model": "m"}
    assert value(s, "embmon_retrieval_queries", **labels, slice="other") == 2  # rare1, rare2 (rare3: no results)
    assert value(s, "embmon_retrieval_zero_result_ratio", **labels, slice="other") == pytest.approx(1 / 3)
    assert value(s, "embmon_retrieval_click_through_rate", **labels, slice="other", k="1") == pytest.approx(0.5)
    assert value(s, "embmon_retrieval_queries", **labels, slice="rare1") is None
    assert value(s, "embmon_retrieval_slice_warnings", **labels, kind="folded_slices") == 1
