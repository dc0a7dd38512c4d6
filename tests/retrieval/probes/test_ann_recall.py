"""ANN recall: the estimator's properties, and the probe end to end with a deliberately degraded index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.retrieval.probes.ann_recall import VectorCache, recall_against_pool
from tests.support import daemons
from tests.support.probes import ListSource, json_messages
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

K = 10


def exact_order(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Full cosine ranking of every document for every query (float64, ties by index)."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    d = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    scores = q.astype(np.float64) @ d.T.astype(np.float64)
    return np.stack([np.lexsort((np.arange(len(row)), -row)) for row in scores])


def degrade(order: np.ndarray, rng: np.random.Generator, wrong: np.ndarray, near: bool) -> list[list[int]]:
    """The "production index": the exact top K with ``wrong[i]`` results replaced.

    ``near``: replaced by the next-best documents (ranks K+1.., typical ANN misses); otherwise by
    documents from the bottom half of the ranking (a broken index).
    """
    served = []
    for row, n_wrong in zip(order, wrong, strict=True):
        top = list(row[:K])
        positions = rng.choice(K, size=n_wrong, replace=False)
        pool = row[K : K + n_wrong] if near else rng.choice(row[len(row) // 2 :], size=n_wrong, replace=False)
        for position, doc in zip(positions, pool, strict=True):
            top[position] = doc
        served.append([int(d) for d in top])
    return served


def true_recall(order: np.ndarray, served: list[list[int]], k: int) -> np.ndarray:
    return np.array([len(set(s[:k]) & set(row[:k].tolist())) / k for row, s in zip(order, served, strict=True)])


@pytest.fixture(scope="module")
def corpus() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((20, 24))
    docs = (centres[rng.integers(0, 20, 3000)] + 0.6 * rng.standard_normal((3000, 24))).astype(np.float32)
    queries = (centres[rng.integers(0, 20, 200)] + 0.6 * rng.standard_normal((200, 24))).astype(np.float32)
    return docs, queries, exact_order(queries, docs)


def test_exact_when_the_pool_is_the_corpus(corpus: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    docs, queries, order = corpus
    rng = np.random.default_rng(1)
    wrong = rng.integers(0, 5, size=len(queries))
    served = degrade(order, rng, wrong, near=True)
    ids = [f"d{i}" for i in range(len(docs))]
    got = recall_against_pool(queries, [[ids[d] for d in s] for s in served], ids, docs, ks=[5, K], block_size=700)
    np.testing.assert_array_equal(got[f"recall@{K}"], 1 - wrong / K)
    np.testing.assert_array_equal(got["recall@5"], true_recall(order, served, 5))


def test_never_below_the_true_recall_on_a_subsample(corpus: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    docs, queries, order = corpus
    rng = np.random.default_rng(2)
    ids = [f"d{i}" for i in range(len(docs))]
    for near in (True, False):
        wrong = rng.integers(0, 6, size=len(queries))
        served = degrade(order, rng, wrong, near=near)
        for fraction, with_served in ((0.3, False), (0.3, True), (0.05, True)):
            sample = rng.random(len(docs)) < fraction
            if with_served:  # a vector cache that holds every served document
                sample[[d for s in served for d in s]] = True
            pool = np.flatnonzero(sample)
            got = recall_against_pool(
                queries, [[ids[d] for d in s] for s in served], [ids[i] for i in pool], docs[pool], ks=[K]
            )[f"recall@{K}"]
            truth = true_recall(order, served, K)
            informative = ~np.isnan(got)
            assert informative.sum() > 0.9 * len(queries)
            assert np.all(got[informative] >= truth[informative] - 1e-12), (near, fraction, with_served)


def test_bias_near_misses_hide_far_misses_show(corpus: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """The documented bias: with the served vectors known and 30% of the corpus sampled, a broken
    index (far-off results) reads exactly; near misses read as about 30% of their true rate."""
    docs, queries, order = corpus
    rng = np.random.default_rng(3)
    ids = [f"d{i}" for i in range(len(docs))]
    wrong = np.full(len(queries), 3)
    sample = rng.random(len(docs)) < 0.3
    results = {}
    for near in (False, True):
        served = degrade(order, rng, wrong, near=near)
        per_query = []
        for query, served_rows in zip(queries, served, strict=True):  # the sample plus this query's served documents
            pool = sample.copy()
            pool[served_rows] = True
            rows = np.flatnonzero(pool)
            per_query.append(recall_against_pool(
                query[None, :], [[ids[d] for d in served_rows]], [ids[i] for i in rows], docs[rows], ks=[K]
            )[f"recall@{K}"][0])
        results[near] = np.array(per_query)
    np.testing.assert_array_equal(results[False], np.full(len(queries), 0.7))  # exact, as documented
    seen_miss_rate = 1 - results[True].mean()
    assert 0.3 * 0.2 < seen_miss_rate < 0.3 * 0.5  # true miss rate 0.3, seen at about p = 0.3 of it (0.11)


def test_queries_with_no_known_served_document_are_left_out() -> None:
    docs = np.eye(4, dtype=np.float32)
    served = [["x", "y"], ["b", "y"], ["a", "y"]]  # x, y unknown; query i is document i's vector
    got = recall_against_pool(docs[[0, 1, 2]], served, ["a", "b", "c", "d"], docs, ks=[2])["recall@2"]
    assert np.isnan(got[0])
    assert got[1] == 1.0  # b is the best known document: y gets the benefit of the doubt
    assert got[2] == 0.5  # a is known and not the best of what is left (c is): a real miss


def test_vector_cache_keeps_the_newest_rows_by_id() -> None:
    cache = VectorCache(3)
    cache.add(["a", "b"], np.array([[1, 0], [0, 1]], dtype=np.float32))
    cache.add(["a", "c", "d"], np.array([[2, 0], [3, 3], [4, 4]], dtype=np.float32))  # a updated; b evicted
    ids, vectors = cache.snapshot()
    assert sorted(ids) == ["a", "c", "d"] and len(cache) == 3
    assert dict(zip(ids, vectors.tolist(), strict=True)) == {"a": [2.0, 0.0], "c": [3.0, 3.0], "d": [4.0, 4.0]}


def test_probe_end_to_end_with_a_degraded_index(
    corpus: tuple[np.ndarray, np.ndarray, np.ndarray], state_dir: Path
) -> None:
    """Documents and interaction events through the daemon (decoding, window, probe job, /metrics)."""
    docs, queries, order = corpus
    rng = np.random.default_rng(4)
    wrong = rng.integers(0, 5, size=len(queries))  # 0-4 of the 10 served results are wrong
    served = degrade(order, rng, wrong, near=True)
    slices = ["head" if i % 2 else "tail" for i in range(len(queries))]
    documents = [{"id": f"d{i}", "model": "ann-model", "stream": "documents", "vector": v.tolist()}
                 for i, v in enumerate(docs)]
    interactions = [
        {"query_id": f"q{i}", "model": "ann-model", "query_vector": q.tolist(),
         "results": [f"d{d}" for d in s], "slice": slices[i]}
        for i, (q, s) in enumerate(zip(queries, served, strict=True))
    ]
    source = ListSource(json_messages("embeddings", documents) + json_messages("interactions", interactions))
    settings = load_settings(overrides={
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(state_dir), "refresh_seconds": 0.3,
        "window": {"seconds": 600, "subwindows": 1, "reservoir_size": 4000},  # the sample holds the corpus
        "probes": {"device": "cpu", "statistics": {"resamples": 400},
                   "ann_recall": [{"name": "ann", "model": "ann-model", "stream": "documents", "k": [5, K],
                                   "interval_seconds": 0.5, "timeout_seconds": 30}]},
    })
    with daemons.monitor(settings, source=source) as monitor:
        port = monitor.http.port
        labels = {"probe": "ann", "model": "ann-model", "slice": "all", "k": str(K)}
        # the pool is the whole corpus only once a refresh has sampled every document: on a busy machine a
        # probe may first run on a sample that holds part of it, so wait for two probe runs after that
        wait_until(lambda: value(scrape(port), "embmon_sample_records", model="ann-model",
                                 stream="documents") == len(docs), timeout=60, message="every document sampled")
        runs = value(scrape(port), "embmon_job_runs_total", job="probe:ann", outcome="success") or 0
        wait_until(lambda: (value(scrape(port), "embmon_job_runs_total", job="probe:ann", outcome="success") or 0)
                   >= runs + 2, timeout=60, message="two probe runs over the whole corpus")
        wait_until(lambda: value(scrape(port), "embmon_retrieval_queries", probe="ann", model="ann-model",
                                 slice="all") == len(queries), timeout=60, message="ANN recall over every query")
        s = scrape(port)
    expected = 1 - wrong.mean() / K  # every wrong result is a miss; the pool is the whole corpus
    assert value(s, "embmon_retrieval_ann_recall", **labels) == pytest.approx(expected, abs=1e-12)
    assert value(s, "embmon_retrieval_ann_recall", **{**labels, "k": "5"}) == pytest.approx(
        true_recall(order, served, 5).mean(), abs=1e-12)
    lower = value(s, "embmon_retrieval_ann_recall_ci_lower", **labels)
    upper = value(s, "embmon_retrieval_ann_recall_ci_upper", **labels)
    assert lower is not None and upper is not None and lower < expected < upper and upper - lower < 0.05
    for name in ("head", "tail"):
        members = np.array([sl == name for sl in slices])
        assert value(s, "embmon_retrieval_ann_recall", **{**labels, "slice": name}) == pytest.approx(
            1 - wrong[members].mean() / K, abs=1e-12)
    assert value(s, "embmon_retrieval_ann_known_results_ratio", probe="ann", model="ann-model") == 1.0
    assert value(s, "embmon_probe_runs_total", probe="ann", outcome="success") >= 1
    assert value(s, "embmon_probe_runs_total", probe="ann", outcome="failure") == 0
    assert value(s, "embmon_probe_events_dropped_total", probe="ann") == 0
