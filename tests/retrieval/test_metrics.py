"""The metric engine: the seeds' worked examples, trec_eval agreement, ERR and exponential nDCG by loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.retrieval.families import METRIC_FAMILY_NAMES, PROBE_METRIC_FAMILIES
from monitor.retrieval.metrics import (
    METRIC_FAMILIES,
    RankedResults,
    RankingMetric,
    UnknownMetricError,
    evaluate,
    expand_metrics,
    parse_metric,
    qrels_from_reference,
)


def _one(ranking, judged, metric, **options) -> float:
    values = evaluate(RankedResults.from_lists([ranking], [judged]), [metric], **options)[metric]
    return float(values[0])


# --- seed 003 (Scholar Stream vs Ada-002): its worked numbers, under its definitions ---------------

ADA_TOP5 = [7, 23, 156, 89, 42]
BINARY_ADA_TOP5 = {doc: 1 for doc in ADA_TOP5}


def test_seed003_recall_at_5_is_overlap_over_k():
    # Seed 003 divides by k; with the reference's top k as the relevant set that is both our
    # precision@5 and our recall@5 (|relevant| = k).
    model = [7, 89, 12, 23, 99]
    assert _one(model, BINARY_ADA_TOP5, "precision@5") == pytest.approx(0.60)
    assert _one(model, BINARY_ADA_TOP5, "recall@5") == pytest.approx(0.60)


def test_seed003_ndcg_at_5():
    ada_top3 = {7: 1, 23: 1, 156: 1}
    model = [7, 99, 23, 156, 12]
    value = _one(model, ada_top3, "ndcg@5")
    assert round(value, 2) == 0.91
    expected = (1 + 1 / math.log2(4) + 1 / math.log2(5)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert value == pytest.approx(expected, abs=1e-12)


def test_seed003_mrr():
    assert _one([99, 7, 23, 1, 2], BINARY_ADA_TOP5, "mrr@5") == pytest.approx(0.50)
    assert _one([99, 7, 23, 1, 2], BINARY_ADA_TOP5, "mrr") == pytest.approx(0.50)


def test_seed003_map_at_5_divides_by_hits_found_and_trec_map_by_all_relevant():
    model = [7, 99, 23, 156, 12]  # relevant at ranks 1, 3, 4
    precisions = [1 / 1, 2 / 3, 3 / 4]
    seed_map = _one(model, BINARY_ADA_TOP5, "map_hits@5")
    assert round(seed_map, 2) == 0.81
    assert seed_map == pytest.approx(sum(precisions) / 3, abs=1e-12)
    assert _one(model, BINARY_ADA_TOP5, "map@5") == pytest.approx(sum(precisions) / 5, abs=1e-12)


def test_reference_qrels_reproduce_seed003_agreement():
    qrels = qrels_from_reference([ADA_TOP5 + [1, 2, 3]], depth=5)
    assert qrels == [BINARY_ADA_TOP5]
    results = RankedResults.from_lists([[7, 89, 12, 23, 99]], qrels)
    assert evaluate(results, ["recall@5"])["recall@5"].tolist() == [pytest.approx(0.6)]


def test_graded_reference_qrels_rank_reference_top_highest():
    qrels = qrels_from_reference([["a", "b", "a", "c"]], depth=3, graded=True)
    assert qrels == [{"a": 3, "b": 2, "c": 1}]
    with pytest.raises(ValueError, match="depth"):
        qrels_from_reference([["a"]], depth=0)


# --- seed 002 (embedding-model tutorial): its example data, cutoffs [1, 5, 10] ---------------------

SEED002_TRUTH = [[11, 1, 7, 17, 21], [4, 16, 1], [26, 10, 22, 8]]
SEED002_RESULTS = [
    [11, 1, 17, 7, 21, 8, 0, 28, 9, 20],
    [16, 1, 6, 18, 3, 4, 25, 19, 8, 14],
    [24, 10, 26, 2, 8, 28, 4, 23, 13, 21],
]
# Relevant ranks: q1 at 1-5 (5 relevant), q2 at 1, 2, 6 (3 relevant), q3 at 2, 3, 5 (4 relevant).
Q3_PRECISIONS = 1 / 2 + 2 / 3 + 3 / 5


def _seed002_means(metrics):
    qrels = [{doc: 1 for doc in truth} for truth in SEED002_TRUTH]
    per_query = evaluate(RankedResults.from_lists(SEED002_RESULTS, qrels), metrics)
    return {name: float(values.mean()) for name, values in per_query.items()}


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        # seed 002's recall: hits / min(k, |relevant|)
        ("recall_capped@1", (1 + 1 + 0) / 3),
        ("recall_capped@5", (1 + 2 / 3 + 3 / 4) / 3),
        ("recall_capped@10", (1 + 1 + 3 / 4) / 3),
        # seed 002's MRR stops at the cutoff
        ("mrr@1", (1 + 1 + 0) / 3),
        ("mrr@5", (1 + 1 + 1 / 2) / 3),
        ("mrr@10", (1 + 1 + 1 / 2) / 3),
        ("precision@1", (1 + 1 + 0) / 3),
        ("precision@5", (5 / 5 + 2 / 5 + 3 / 5) / 3),
        ("precision@10", (5 / 10 + 3 / 10 + 3 / 10) / 3),
        # seed 002's MAP: AP of the truncated list, divided by the hits in it
        ("map_hits@1", (1 + 1 + 0) / 3),
        ("map_hits@5", (1 + 1 + Q3_PRECISIONS / 3) / 3),
        ("map_hits@10", (1 + (1 + 1 + 3 / 6) / 3 + Q3_PRECISIONS / 3) / 3),
    ],
)
def test_seed002_example_under_its_definitions(metric, expected):
    assert _seed002_means([metric])[metric] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("recall@1", (1 / 5 + 1 / 3 + 0) / 3),
        ("recall@5", (1 + 2 / 3 + 3 / 4) / 3),
        ("recall@10", (1 + 1 + 3 / 4) / 3),
        ("map@1", (1 / 5 + 1 / 3 + 0) / 3),
        ("map@5", (1 + 2 / 3 + Q3_PRECISIONS / 4) / 3),
        ("map@10", (1 + (1 + 1 + 3 / 6) / 3 + Q3_PRECISIONS / 4) / 3),
        ("hit_rate@1", 2 / 3),
        ("r_precision", (5 / 5 + 2 / 3 + 2 / 4) / 3),
    ],
)
def test_seed002_example_under_trec_eval_definitions(metric, expected):
    assert _seed002_means([metric])[metric] == pytest.approx(expected, abs=1e-12)


def test_seed002_example_agrees_with_pytrec_eval():
    qrels = {f"q{i}": {str(doc): 1 for doc in truth} for i, truth in enumerate(SEED002_TRUTH)}
    run = {f"q{i}": {str(doc): -rank for rank, doc in enumerate(ranking)} for i, ranking in enumerate(SEED002_RESULTS)}
    ours = evaluate(RankedResults.from_run(run, qrels), ["recall@5", "map@10", "ndcg@5", "mrr"])
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"recall_5", "map_cut_10", "ndcg_cut_5", "recip_rank"}).evaluate(run)
    for i in range(3):
        got = [ours[m][i] for m in ("recall@5", "map@10", "ndcg@5", "mrr")]
        want = [trec[f"q{i}"][m] for m in ("recall_5", "map_cut_10", "ndcg_cut_5", "recip_rank")]
        assert got == pytest.approx(want, abs=1e-12)


# --- agreement with trec_eval (pytrec_eval) on random runs -------------------------------------------

CUTOFFS = (1, 3, 5, 10, 25)  # lists are at most 20 long: 25 is past every list
TREC_TO_OURS = {
    **{f"P_{k}": f"precision@{k}" for k in CUTOFFS},
    **{f"recall_{k}": f"recall@{k}" for k in CUTOFFS},
    **{f"map_cut_{k}": f"map@{k}" for k in CUTOFFS},
    **{f"ndcg_cut_{k}": f"ndcg@{k}" for k in CUTOFFS},
    **{f"success_{k}": f"hit_rate@{k}" for k in CUTOFFS},
    "recip_rank": "mrr",
    "Rprec": "r_precision",
    "map": "map",
    "ndcg": "ndcg",
}


def _random_case(rng: np.random.Generator):
    """Qrels graded 0..3 (some all 0, a few -1), runs with and without score ties, missing and extra queries."""
    qrels, run = {}, {}
    for q in range(int(rng.integers(1, 9))):
        qid = f"q{q}"
        pool = [f"d{d}" for d in rng.choice(40, size=30, replace=False)]
        if rng.random() < 0.85:
            n_judged = int(rng.integers(1, 16))
            all_zero = rng.random() < 0.15
            lowest = -1 if rng.random() < 0.1 else 0  # a few negative grades (e.g. spam), gain 0 in trec_eval
            qrels[qid] = {doc: 0 if all_zero else int(rng.integers(lowest, 4)) for doc in pool[:n_judged]}
        if rng.random() < 0.85:
            n_ranked = int(rng.integers(0, 21))
            ranked = rng.choice(pool, size=n_ranked, replace=False)
            if rng.random() < 0.5:
                scores = rng.integers(0, 5, size=n_ranked) / 4  # 5 levels: many ties
            else:
                scores = rng.normal(size=n_ranked)  # ties unlikely: the fast placement path
            run[qid] = dict(zip(ranked.tolist(), scores.tolist(), strict=True))
    return qrels, run


def test_engine_equals_trec_eval_on_random_runs():
    rng = np.random.default_rng(20240611)
    cases = compared = 0
    while cases < 250:
        qrels, run = _random_case(rng)
        if not qrels:
            continue
        cases += 1
        level = int(rng.integers(1, 3))
        trec = pytrec_eval.RelevanceEvaluator(qrels, set(TREC_TO_OURS), relevance_level=level).evaluate(run)
        results = RankedResults.from_run(run, qrels)
        ours = evaluate(results, list(TREC_TO_OURS.values()), relevance_threshold=level)
        assert set(results.query_ids) == set(trec), (qrels, run)
        for row, qid in enumerate(results.query_ids):
            for trec_name, our_name in TREC_TO_OURS.items():
                assert ours[our_name][row] == pytest.approx(trec[qid][trec_name], abs=1e-9), (
                    trec_name,
                    qid,
                    qrels,
                    run,
                )
                compared += 1
    assert compared > 10_000


def test_all_queries_scores_queries_missing_from_the_run_as_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 2}, "q3": {"c": 0}}
    run = {"q1": {"a": 1.0}, "q4": {"a": 1.0}}
    default = RankedResults.from_run(run, qrels)
    assert default.query_ids == ("q1",)
    assert default.missing_from_run == ("q2", "q3")
    assert default.not_in_qrels == ("q4",)
    complete = RankedResults.from_run(run, qrels, all_queries=True)
    assert complete.query_ids == ("q1", "q2", "q3")
    values = evaluate(complete, ["ndcg@10", "mrr", "recall@5", "r_precision"])
    for name, per_query in values.items():
        assert per_query.tolist() == [1.0, 0.0, 0.0], name


def test_ties_are_broken_by_docid_descending_like_trec_eval():
    qrels = {"q": {"b": 1}}
    run = {"q": {"a": 0.5, "b": 0.5, "c": 0.5, "z": 0.9}}
    results = RankedResults.from_run(run, qrels)  # order: z, c, b, a
    assert evaluate(results, ["mrr"])["mrr"].tolist() == [1 / 3]
    assert pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"] == 1 / 3


def test_empty_ranking_in_the_run_is_evaluated_as_zero_like_pytrec_eval():
    results = RankedResults.from_run({"q": {}}, {"q": {"a": 1}})
    assert results.query_ids == ("q",)
    assert evaluate(results, ["ndcg@10", "precision@5"])["precision@5"].tolist() == [0.0]


def test_cutoff_past_the_list_divides_precision_by_k_and_keeps_the_rest():
    results = RankedResults.from_lists([["a", "b"]], [{"a": 1, "b": 1, "c": 1}])
    values = evaluate(results, ["precision@10", "recall@10", "ndcg@10", "map@1000", "hit_rate@50"])
    assert values["precision@10"].tolist() == [0.2]
    assert values["recall@10"].tolist() == [pytest.approx(2 / 3)]
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    assert values["ndcg@10"].tolist() == [pytest.approx((1 + 1 / math.log2(3)) / ideal)]
    assert values["map@1000"].tolist() == [pytest.approx(2 / 3)]
    assert values["hit_rate@50"].tolist() == [1.0]


def test_depth_truncates_rankings():
    results = RankedResults.from_run({"q": {"a": 3.0, "b": 2.0, "c": 1.0}}, {"q": {"c": 1}}, depth=2)
    assert results.grades.shape == (1, 2)
    assert evaluate(results, ["recall"])["recall"].tolist() == [0.0]


def test_run_scores_must_be_finite_and_depth_positive():
    with pytest.raises(ValueError, match="finite"):
        RankedResults.from_run({"q": {"a": float("nan")}}, {"q": {"a": 1}})
    with pytest.raises(ValueError, match="depth"):
        RankedResults.from_run({"q": {"a": 1.0}}, {"q": {"a": 1}}, depth=0)


def test_no_relevant_document_scores_zero_everywhere():
    results = RankedResults.from_lists([["a", "b"]], [{"a": 0, "b": -1}])
    values = evaluate(results, ["precision@2", "recall@2", "map@2", "map_hits@2", "ndcg@2", "err@2", "r_precision"])
    assert all(v.tolist() == [0.0] for v in values.values())


def test_relevance_threshold_changes_binary_metrics_but_not_ndcg():
    results = RankedResults.from_lists([["a", "b"]], [{"a": 1, "b": 2}])
    low = evaluate(results, ["precision@1", "ndcg@2"], relevance_threshold=1)
    high = evaluate(results, ["precision@1", "ndcg@2"], relevance_threshold=2)
    assert (low["precision@1"][0], high["precision@1"][0]) == (1.0, 0.0)
    assert low["ndcg@2"][0] == high["ndcg@2"][0]


def test_duplicate_ids_in_a_list_count_once():
    results = RankedResults.from_lists([["a", "a", "b"]], [{"a": 1}])
    values = evaluate(results, ["precision@3", "recall@3"])
    assert values["recall@3"].tolist() == [1.0]
    assert values["precision@3"].tolist() == [pytest.approx(1 / 3)]


# --- ERR and exponential nDCG against direct loops ----------------------------------------------------


def _err_by_loop(grades, k, max_grade):
    """Chapelle et al. 2009: ERR = Σ_r (1/r) R_r Π_{i<r} (1 − R_i), R = (2^g − 1) / 2^g_max."""
    not_stopped, total = 1.0, 0.0
    for rank, grade in enumerate(grades[:k], start=1):
        stop = (2.0 ** min(max(grade, 0), max_grade) - 1.0) / 2.0**max_grade
        total += not_stopped * stop / rank
        not_stopped *= 1.0 - stop
    return total


def _ndcg_exponential_by_loop(grades, judged, k):
    def dcg(values):
        return sum((2.0 ** max(g, 0) - 1.0) / math.log2(rank + 1) for rank, g in enumerate(values[:k], start=1))

    ideal = dcg(sorted(judged, reverse=True))
    return dcg(grades) / ideal if ideal > 0 else 0.0


def test_err_and_exponential_ndcg_equal_direct_loops():
    rng = np.random.default_rng(7)
    rankings, qrels = [], []
    for _ in range(200):
        docs = [f"d{i}" for i in range(int(rng.integers(0, 15)))]
        rankings.append(docs)
        qrels.append({f"d{i}": int(rng.integers(-1, 5)) for i in rng.choice(20, size=8, replace=False)})
    results = RankedResults.from_lists(rankings, qrels)
    for max_grade in (3, 4):
        values = evaluate(
            results, ["err@5", "err@20", "err", "ndcg@5", "ndcg@20"], gain="exponential", max_grade=max_grade
        )
        for row, (docs, judged) in enumerate(zip(rankings, qrels, strict=True)):
            grades = [judged.get(doc, 0) for doc in docs]
            for k in (5, 20):
                assert values[f"err@{k}"][row] == pytest.approx(_err_by_loop(grades, k, max_grade), abs=1e-12)
                expected_ndcg = _ndcg_exponential_by_loop(grades, list(judged.values()), k)
                assert values[f"ndcg@{k}"][row] == pytest.approx(expected_ndcg, abs=1e-12)
            assert values["err"][row] == pytest.approx(_err_by_loop(grades, 10**6, max_grade), abs=1e-12)


def test_err_of_a_perfect_first_result_is_its_stop_probability():
    # Elasticsearch's example scale: max relevance 3, a grade-3 document first: R = 7/8.
    assert _one(["a", "b"], {"a": 3}, "err@10", max_grade=3) == pytest.approx(7 / 8)


# --- invariants (hypothesis) -------------------------------------------------------------------------

grades_lists = st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(grades_lists, st.integers(1, 15))
def test_metrics_are_bounded_and_monotone_in_k(grade_rows, k):
    rankings = [[f"d{i}" for i in range(len(row))] for row in grade_rows]
    qrels = [{f"d{i}": g for i, g in enumerate(row)} for row in grade_rows]
    results = RankedResults.from_lists(rankings, qrels)
    families = ["precision", "recall", "map", "mrr", "ndcg", "err", "hit_rate", "map_hits", "recall_capped"]
    names = [f"{f}@{k}" for f in families] + [f"{f}@{k + 1}" for f in ("recall", "hit_rate", "mrr", "err")]
    values = evaluate(results, names + ["r_precision"])
    for name, per_query in values.items():
        assert ((per_query >= 0) & (per_query <= 1 + 1e-12)).all(), name
    for family in ("recall", "hit_rate", "mrr", "err"):
        assert (values[f"{family}@{k + 1}"] >= values[f"{family}@{k}"] - 1e-12).all(), family
    # Ranking every judged document by grade is the ideal ranking: nDCG 1 (0 with no gain at all).
    ideal = RankedResults.from_lists(
        [sorted(r, key=lambda d, q=q: -q[d]) for r, q in zip(rankings, qrels, strict=True)], qrels
    )
    ndcg = evaluate(ideal, [f"ndcg@{k}"])[f"ndcg@{k}"]
    has_gain = np.array([any(g > 0 for g in row) for row in grade_rows])
    assert np.allclose(ndcg[has_gain], 1.0)
    assert (ndcg[~has_gain] == 0).all()


# --- names ---------------------------------------------------------------------------------------------


def test_metric_names_parse_and_expand():
    assert parse_metric("map@100") == RankingMetric("map", 100)
    assert parse_metric(" R_Precision ") == RankingMetric("r_precision", None)
    expanded = [m.name for m in expand_metrics(["ndcg", "recall"], [5, 10])]
    assert expanded == ["ndcg@5", "ndcg@10", "recall@5", "recall@10"]
    assert [m.name for m in expand_metrics(["ndcg@5", "ndcg", "ndcg@5"], [5])] == ["ndcg@5"]


def test_the_light_family_names_are_the_engines():
    assert METRIC_FAMILY_NAMES == tuple(METRIC_FAMILIES)
    assert set(PROBE_METRIC_FAMILIES) <= set(METRIC_FAMILIES)


@pytest.mark.parametrize("name", ["ndcg@", "bleu@10", "precision", "r_precision@5", "ndcg@0", "ndcg@-1", "@10", ""])
def test_bad_metric_names_are_rejected(name):
    with pytest.raises(UnknownMetricError):
        parse_metric(name)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"relevance_threshold": 0}, "relevance_threshold"),
        ({"gain": "cubic"}, "gain"),
        ({"max_grade": 0}, "max_grade"),
    ],
)
def test_bad_options_are_rejected(options, message):
    results = RankedResults.from_lists([["a"]], [{"a": 1}])
    with pytest.raises(ValueError, match=message):
        evaluate(results, ["ndcg@1"], **options)


def test_inconsistent_matrices_are_rejected():
    with pytest.raises(ValueError, match="one row per query"):
        RankedResults(grades=np.zeros((2, 3)), ideal_grades=np.zeros((3, 1)), query_ids=("a", "b"))
    with pytest.raises(ValueError, match="query ids"):
        RankedResults(grades=np.zeros((2, 3)), ideal_grades=np.zeros((2, 1)), query_ids=("a",))
    with pytest.raises(ValueError, match="finite"):
        RankedResults(grades=np.full((1, 1), np.nan), ideal_grades=np.zeros((1, 1)), query_ids=("a",))
    with pytest.raises(ValueError, match="qrels"):
        RankedResults.from_lists([["a"]], [])
    with pytest.raises(TypeError, match="aligned"):
        RankedResults.from_lists([["a"]], {"q": {"a": 1}})


def test_matrix_constructor_serves_callers_that_already_have_grades():
    results = RankedResults(
        grades=np.array([[1.0, 0.0], [0.0, 0.0]]), ideal_grades=np.array([[1.0, 1.0], [0.0, 0.0]]), query_ids=("x", "y")
    )
    assert evaluate(results, ["recall@2"])["recall@2"].tolist() == [0.5, 0.0]
