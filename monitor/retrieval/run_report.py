"""The ``evaluate`` command's report: a TREC run, and optionally a second one, scored against qrels.

Per-query metrics from the engine, a bootstrap interval on every mean and, for two runs, a paired
test per metric. This is the command's numpy part: :mod:`monitor.retrieval.evaluate` imports it
only when the command runs, so registering the command on the CLI stays light.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.retrieval.metrics import RankedResults, RankingMetric, UnknownMetricError, evaluate, expand_metrics
from monitor.retrieval.stats import ConfidenceInterval, PairedComparison, bootstrap_ci, compare_paired
from monitor.retrieval.trec import TrecFormatError, read_qrels, read_run

__all__ = ["InputError", "build_report"]


class InputError(Exception):
    """Bad input files or arguments: reported as one line and exit status 2."""


def build_report(args: argparse.Namespace, metrics: Sequence[str]) -> dict[str, Any]:
    """Score ``args.run`` (and ``args.compare``) against ``args.qrels`` on ``metrics``; raise ``InputError``."""
    specs = _metric_specs(metrics, args.k)
    qrels = _read(read_qrels, args.qrels)
    run = _read(read_run, args.run)
    other = _read(read_run, args.compare) if args.compare else None
    notes: list[str] = []
    judged = {qid: docs for qid, docs in qrels.items() if docs}
    notes.extend(_coverage_notes(args.run, run, judged, args.all_queries))
    if other is not None:
        notes.extend(_coverage_notes(args.compare, other, judged, args.all_queries))
        if not args.all_queries:
            dropped = sum(1 for qid in judged if (qid in run) != (qid in other))
            if dropped:
                notes.append(f"{_queries(dropped, 'judged')} in only one of the two runs: left out of both")
            judged = {qid: docs for qid, docs in judged.items() if qid in run and qid in other}

    engine_options = {
        "relevance_threshold": args.relevance_threshold,
        "gain": args.gain,
        "max_grade": args.max_grade,
    }
    resampling = {"resamples": args.resamples, "confidence": args.confidence, "seed": args.seed}
    ranking = {"all_queries": args.all_queries, "depth": args.depth}
    results = RankedResults.from_run(run, judged, **ranking)
    if len(results) == 0:
        raise InputError(
            f"no query of {args.run} has judgments in {args.qrels} "
            f"({len(qrels)} judged queries, {len(run)} run queries)"
        )
    per_query = evaluate(results, specs, **engine_options)
    report: dict[str, Any] = {
        "qrels": args.qrels,
        "settings": {**engine_options, **resampling, **ranking},
        "queries": len(results),
        "run": _run_json(args.run, results, per_query, resampling, args.per_query),
        "notes": notes,
    }
    if other is not None:
        other_results = RankedResults.from_run(other, judged, **ranking)
        other_per_query = evaluate(other_results, specs, **engine_options)
        report["compare"] = _run_json(args.compare, other_results, other_per_query, resampling, args.per_query)
        report["difference"] = _comparisons_json(compare_paired(per_query, other_per_query, **resampling))
    return report


def _metric_specs(names: Sequence[str], cutoffs: Sequence[int]) -> list[RankingMetric]:
    try:
        return expand_metrics(names, cutoffs)
    except UnknownMetricError as error:
        raise InputError(str(error)) from None


def _read(reader: Any, path: str) -> Any:
    try:
        return reader(path)
    except TrecFormatError as error:
        raise InputError(str(error)) from None
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror or error}") from None


def _coverage_notes(path: str, run: dict[str, Any], judged: dict[str, Any], all_queries: bool) -> list[str]:
    notes = []
    missing = sum(1 for qid in judged if qid not in run)
    unjudged = sum(1 for qid in run if qid not in judged)
    if missing:
        if all_queries:
            action = "scored 0 (--all-queries)"
        else:
            action = "skipped, as trec_eval does (--all-queries scores them 0)"
        notes.append(f"{path}: {_queries(missing, 'judged')} without a ranking: {action}")
    if unjudged:
        notes.append(f"{path}: {_queries(unjudged, 'ranked')} without judgments: ignored")
    return notes


def _queries(n: int, adjective: str) -> str:
    return f"{n} {adjective} {'query' if n == 1 else 'queries'}"


def _run_json(
    path: str,
    results: RankedResults,
    per_query: dict[str, np.ndarray],
    resampling: dict[str, Any],
    with_queries: bool,
) -> dict[str, Any]:
    """One run's means and intervals; with ``with_queries``, each query's values in trec_eval's order."""
    scored: dict[str, Any] = {"path": path, "metrics": _intervals_json(bootstrap_ci(per_query, **resampling))}
    if with_queries:
        row = {qid: i for i, qid in enumerate(results.query_ids)}
        scored["per_query"] = {
            qid: {name: float(values[row[qid]]) for name, values in per_query.items()} for qid in sorted(row)
        }
    return scored


def _intervals_json(intervals: dict[str, ConfidenceInterval]) -> dict[str, dict[str, float]]:
    return {
        name: {"mean": ci.mean, "ci_lower": ci.lower, "ci_upper": ci.upper, "n_queries": ci.n_queries}
        for name, ci in intervals.items()
    }


def _comparisons_json(comparisons: dict[str, PairedComparison]) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "mean_difference": c.difference.mean,
            "ci_lower": c.difference.lower,
            "ci_upper": c.difference.upper,
            "p_value": c.p_value,
            "p_value_bh": c.p_value_adjusted,
            "significant": c.significant,
        }
        for name, c in comparisons.items()
    }
