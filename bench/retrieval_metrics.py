"""Benchmark the retrieval metric engine against ranx and pytrec_eval, checking they agree.

    python bench/retrieval_metrics.py                      # 10,000 queries x 100 results
    python bench/retrieval_metrics.py --queries 2000 --repeats 5

One process, one data set: graded qrels (0..3, 20 judged documents per query, 15 of them
retrieved) and a run of 100 results per query with distinct random scores (no ties: ranx breaks
ties differently from trec_eval). Every tool computes the same nine metrics; the per-query
numbers must agree to 1e-9 with pytrec_eval and 1e-6 with ranx or the script fails. ranx is
warmed up first (numba compiles on the first call; that time is reported separately).

Each timing is the best of ``--repeats`` runs, for two input forms:
- "from dicts": qid -> {docid: score} and qid -> {docid: grade} to per-query values, including
  each tool's own conversion (our RankedResults.from_run; pytrec_eval's RelevanceEvaluator;
  ranx's typed-list conversion and sort);
- "prepared": each tool's own prepared form (our RankedResults; ranx's Qrels/Run objects;
  pytrec_eval's RelevanceEvaluator, whose evaluate() still converts the run dict).
It also times our bootstrap intervals and paired test over the same 10,000 x 9 values.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.stats import bootstrap_ci, compare_paired

# (ours, pytrec_eval, ranx): identical definitions in all three.
METRICS = [
    ("ndcg@10", "ndcg_cut_10", "ndcg@10"),
    ("ndcg@100", "ndcg_cut_100", "ndcg@100"),
    ("map@100", "map_cut_100", "map@100"),
    ("recall@10", "recall_10", "recall@10"),
    ("recall@100", "recall_100", "recall@100"),
    ("precision@10", "P_10", "precision@10"),
    ("mrr", "recip_rank", "mrr"),
    ("hit_rate@10", "success_10", "hit_rate@10"),
    ("r_precision", "Rprec", "r-precision"),
]
OURS = [ours for ours, _, _ in METRICS]
TREC = [trec for _, trec, _ in METRICS]
RANX = [ranx for _, _, ranx in METRICS]


def make_data(n_queries: int, depth: int, seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, int]] = {}
    for q in range(n_queries):
        qid = f"q{q:05d}"
        docs = [f"d{d}" for d in rng.choice(1_000_000, size=depth + 5, replace=False)]
        scores = rng.random(depth)
        run[qid] = dict(zip(docs[:depth], scores.tolist(), strict=True))
        judged = list(rng.choice(depth, size=15, replace=False)) + list(range(depth, depth + 5))
        grades = rng.choice(4, size=20, p=[0.4, 0.3, 0.2, 0.1])
        grades[0] = max(grades[0], 1)  # at least one relevant document per query
        qrels[qid] = {docs[i]: int(g) for i, g in zip(judged, grades, strict=True)}
        assert len(set(scores.tolist())) == depth, "scores must not tie"
    return run, qrels


def best_time(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import pytrec_eval
    import ranx
    from numba import get_num_threads
    from numba.core.errors import NumbaTypeSafetyWarning

    warnings.filterwarnings("ignore", category=NumbaTypeSafetyWarning)  # ranx's uint64 -> int64 casts

    print(f"python {platform.python_version()}, numpy {np.__version__}, {os.cpu_count()} cpus, "
          f"numba threads {get_num_threads()}")
    start = time.perf_counter()
    run, qrels = make_data(args.queries, args.depth, args.seed)
    print(f"data: {args.queries} queries x {args.depth} results, 20 judged per query "
          f"(made in {time.perf_counter() - start:.1f} s)")

    # --- warm-up and agreement ---------------------------------------------------------------
    start = time.perf_counter()
    ranx_qrels, ranx_run = ranx.Qrels(qrels), ranx.Run(run)
    ranx_values = ranx.evaluate(ranx_qrels, ranx_run, RANX, return_mean=False, save_results_in_run=False)
    ranx_burges = ranx.evaluate(
        ranx_qrels, ranx_run, ["ndcg_burges@10", "ndcg@10"], return_mean=False, save_results_in_run=False
    )["ndcg_burges@10"]
    print(f"ranx first call (numba compile or cache load): {time.perf_counter() - start:.1f} s")

    results = RankedResults.from_run(run, qrels)
    ours = evaluate(results, OURS)
    trec = pytrec_eval.RelevanceEvaluator(qrels, set(TREC)).evaluate(run)
    ranx_order = {qid: i for i, qid in enumerate(ranx_run.get_query_ids())}
    to_ranx = np.array([ranx_order[qid] for qid in results.query_ids])
    for our_name, trec_name, ranx_name in METRICS:
        trec_values = np.array([trec[qid][trec_name] for qid in results.query_ids])
        worst_trec = np.abs(ours[our_name] - trec_values).max()
        worst_ranx = np.abs(ours[our_name] - ranx_values[ranx_name][to_ranx]).max()
        assert worst_trec <= 1e-9, (our_name, worst_trec)
        assert worst_ranx <= 1e-6, (our_name, worst_ranx)
        print(f"  {our_name:<13} mean {ours[our_name].mean():.6f}   max |ours - pytrec_eval| {worst_trec:.1e}"
              f"   max |ours - ranx| {worst_ranx:.1e}")
    exponential = evaluate(results, ["ndcg@10"], gain="exponential")["ndcg@10"]
    worst = np.abs(exponential - ranx_burges[to_ranx]).max()
    assert worst <= 1e-6, worst
    print(f"  ndcg@10 with gain 2^g - 1 vs ranx ndcg_burges@10: max diff {worst:.1e}")

    # --- timings -------------------------------------------------------------------------------
    repeats = args.repeats
    timings = {
        ("ours", "from dicts"): best_time(lambda: evaluate(RankedResults.from_run(run, qrels), OURS), repeats),
        ("ours", "prepared"): best_time(lambda: evaluate(results, OURS), repeats),
        ("ours", "build only"): best_time(lambda: RankedResults.from_run(run, qrels), repeats),
        ("pytrec_eval", "from dicts"): best_time(
            lambda: pytrec_eval.RelevanceEvaluator(qrels, set(TREC)).evaluate(run), repeats
        ),
    }
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, set(TREC))
    timings["pytrec_eval", "prepared"] = best_time(lambda: evaluator.evaluate(run), repeats)
    timings["ranx", "from dicts"] = best_time(
        lambda: ranx.evaluate(qrels, run, RANX, return_mean=False, save_results_in_run=False), repeats
    )
    timings["ranx", "from dicts via Qrels/Run"] = best_time(
        lambda: ranx.evaluate(
            ranx.Qrels(qrels), ranx.Run(run), RANX, return_mean=False, save_results_in_run=False
        ),
        repeats,
    )
    timings["ranx", "prepared"] = best_time(
        lambda: ranx.evaluate(ranx_qrels, ranx_run, RANX, return_mean=False, save_results_in_run=False), repeats
    )

    other = {name: np.clip(values + 0.01, 0, 1) for name, values in ours.items()}
    timings["ours", "bootstrap CIs (1000)"] = best_time(lambda: bootstrap_ci(ours, resamples=1000), repeats)
    timings["ours", "paired test + BH (1000)"] = best_time(lambda: compare_paired(ours, other, resamples=1000), repeats)

    print(f"\ntimes (best of {repeats}), {len(OURS)} metrics, per-query values out:")
    for (tool, form), seconds in timings.items():
        print(f"  {tool:<12} {form:<26} {seconds:8.3f} s")
    ours_dicts, ours_prepared = timings["ours", "from dicts"], timings["ours", "prepared"]
    ranx_dicts = min(timings["ranx", "from dicts"], timings["ranx", "from dicts via Qrels/Run"])
    print("\nspeed-ups (their time / ours):")
    print(f"  from dicts: vs pytrec_eval {timings['pytrec_eval', 'from dicts'] / ours_dicts:6.1f}x,"
          f"  vs ranx {ranx_dicts / ours_dicts:6.1f}x")
    print(f"  prepared:   vs pytrec_eval {timings['pytrec_eval', 'prepared'] / ours_prepared:6.1f}x,"
          f"  vs ranx {timings['ranx', 'prepared'] / ours_prepared:6.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
