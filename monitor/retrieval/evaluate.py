"""``embedding-monitor evaluate``: offline retrieval metrics of a TREC run, with confidence intervals.

    embedding-monitor evaluate --qrels qrels.txt --run run.txt --metrics ndcg recall --k 10 100
    embedding-monitor evaluate --qrels qrels.txt --run old.txt --compare new.txt --json

The same engine as the online probes (``monitor.retrieval.metrics``), trec_eval's semantics by
default, a bootstrap interval on every mean, and with ``--compare`` a paired test per metric with
Benjamini–Hochberg adjustment. Also runnable as ``python -m monitor.retrieval.evaluate``.
Exit status: 0 on success, 2 on unreadable or malformed input or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from monitor.retrieval.metrics import (
    METRIC_FAMILIES,
    MetricSpec,
    RankedResults,
    UnknownMetricError,
    evaluate,
    expand_metrics,
)
from monitor.retrieval.stats import ConfidenceInterval, PairedComparison, bootstrap_ci, compare_paired
from monitor.retrieval.trec import TrecFormatError, read_qrels, read_run

__all__ = ["DEFAULT_METRICS", "add_evaluate_parser", "build_parser", "main", "run_evaluate"]

DEFAULT_METRICS = ("ndcg@10", "recall@100", "map@100", "mrr@10", "precision@10")
# Families used when only --k is given.
DEFAULT_FAMILIES = ("ndcg", "recall", "map", "mrr", "precision")

_EXIT_BAD_INPUT = 2


class _InputError(Exception):
    """Bad input files or arguments: reported as one line and exit status 2."""


def add_evaluate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``evaluate`` on an argparse subparsers object; it sets ``func=run_evaluate``."""
    parser = subparsers.add_parser(
        "evaluate",
        help="offline retrieval metrics of a TREC run against qrels, with confidence intervals",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_arguments(parser)
    parser.set_defaults(func=run_evaluate)
    return parser


def build_parser(prog: str = "python -m monitor.retrieval.evaluate") -> argparse.ArgumentParser:
    """A stand-alone parser with the same arguments (for ``python -m`` and tests)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    _add_arguments(parser)
    parser.set_defaults(func=run_evaluate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def run_evaluate(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Evaluate ``args.run`` (and ``args.compare``) against ``args.qrels``; print a table or JSON."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        report = _build_report(args)
    except _InputError as error:
        print(f"evaluate: error: {error}", file=stderr)
        return _EXIT_BAD_INPUT
    for note in report["notes"]:
        print(f"evaluate: {note}", file=stderr)
    if args.json:
        json.dump(report, stdout, indent=2)
        stdout.write("\n")
    else:
        stdout.write(_format_table(report))
    return 0


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--qrels", required=True, help="TREC qrels file: qid 0 docid grade")
    parser.add_argument("--run", required=True, help="TREC run file: qid Q0 docid rank score tag")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="METRIC",
        help=f"metrics (family or family@k); families: {', '.join(METRIC_FAMILIES)} "
        f"[default: {' '.join(DEFAULT_METRICS)}, or {' '.join(DEFAULT_FAMILIES)} with --k]",
    )
    parser.add_argument(
        "--k", nargs="+", type=_positive_int, default=(), metavar="K", help="cutoffs to expand bare families over"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--compare", metavar="RUN2", help="a second run: paired test of RUN2 against --run")
    parser.add_argument(
        "--relevance-threshold",
        type=_positive_float,
        default=1.0,
        metavar="N",
        help="grade >= N is relevant for binary metrics (trec_eval -l)",
    )
    parser.add_argument(
        "--gain", choices=("linear", "exponential"), default="linear", help="nDCG gain: grade or 2^grade - 1"
    )
    parser.add_argument("--max-grade", type=_positive_float, default=3.0, metavar="N", help="ERR's maximum grade")
    parser.add_argument(
        "--resamples", type=_positive_int, default=1000, metavar="N", help="bootstrap and sign-flip resamples"
    )
    parser.add_argument("--confidence", type=_unit_interval, default=0.95, help="confidence level of the intervals")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    parser.add_argument(
        "--all-queries",
        action="store_true",
        help="score judged queries missing from a run as 0 instead of skipping them (trec_eval -c)",
    )


def _build_report(args: argparse.Namespace) -> dict[str, Any]:
    specs = _metric_specs(args.metrics, args.k)
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
    results = RankedResults.from_run(run, judged, all_queries=args.all_queries)
    if len(results) == 0:
        raise _InputError(
            f"no query of {args.run} has judgments in {args.qrels} "
            f"({len(qrels)} judged queries, {len(run)} run queries)"
        )
    per_query = evaluate(results, specs, **engine_options)
    report: dict[str, Any] = {
        "qrels": args.qrels,
        "settings": {**engine_options, **resampling, "all_queries": args.all_queries},
        "queries": len(results),
        "run": {"path": args.run, "metrics": _intervals_json(bootstrap_ci(per_query, **resampling))},
        "notes": notes,
    }
    if other is not None:
        other_results = RankedResults.from_run(other, judged, all_queries=args.all_queries)
        other_per_query = evaluate(other_results, specs, **engine_options)
        report["compare"] = {
            "path": args.compare,
            "metrics": _intervals_json(bootstrap_ci(other_per_query, **resampling)),
        }
        report["difference"] = _comparisons_json(compare_paired(per_query, other_per_query, **resampling))
    return report


def _metric_specs(names: Sequence[str] | None, cutoffs: Sequence[int]) -> list[MetricSpec]:
    if names is None:
        names = DEFAULT_FAMILIES if cutoffs else DEFAULT_METRICS
    try:
        return expand_metrics(names, cutoffs)
    except UnknownMetricError as error:
        raise _InputError(str(error)) from None


def _read(reader: Any, path: str) -> Any:
    try:
        return reader(path)
    except TrecFormatError as error:
        raise _InputError(str(error)) from None
    except OSError as error:
        raise _InputError(f"cannot read {path}: {error.strerror or error}") from None


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


def _format_table(report: dict[str, Any]) -> str:
    settings = report["settings"]
    lines = [
        f"qrels: {report['qrels']}   queries: {report['queries']}   "
        f"{settings['confidence']:.0%} percentile-bootstrap CI over queries "
        f"({settings['resamples']} resamples, seed {settings['seed']})"
    ]
    run_metrics = report["run"]["metrics"]
    if "compare" not in report:
        lines.append(f"run: {report['run']['path']}")
        rows = [("metric", "mean", "ci_lower", "ci_upper", "queries")]
        rows += [
            (name, f"{m['mean']:.4f}", f"{m['ci_lower']:.4f}", f"{m['ci_upper']:.4f}", str(m["n_queries"]))
            for name, m in run_metrics.items()
        ]
    else:
        lines.append(f"A (--run): {report['run']['path']}")
        lines.append(f"B (--compare): {report['compare']['path']}")
        lines.append(
            f"diff = B - A; p: paired sign-flip randomisation test, two-sided; p_bh: Benjamini-Hochberg "
            f"across metrics; significant: p_bh <= {1 - settings['confidence']:.2f}"
        )
        rows = [("metric", "A", "A_ci", "B", "B_ci", "diff", "diff_ci", "p", "p_bh", "significant", "queries")]
        for name, a in run_metrics.items():
            b = report["compare"]["metrics"][name]
            d = report["difference"][name]
            rows.append(
                (
                    name,
                    f"{a['mean']:.4f}",
                    f"[{a['ci_lower']:.4f}, {a['ci_upper']:.4f}]",
                    f"{b['mean']:.4f}",
                    f"[{b['ci_lower']:.4f}, {b['ci_upper']:.4f}]",
                    f"{d['mean_difference']:+.4f}",
                    f"[{d['ci_lower']:+.4f}, {d['ci_upper']:+.4f}]",
                    f"{d['p_value']:.4f}",
                    f"{d['p_value_bh']:.4f}",
                    "yes" if d["significant"] else "no",
                    str(a["n_queries"]),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _number(text: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _unit_interval(text: str) -> float:
    value = _number(text, float)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


if __name__ == "__main__":
    raise SystemExit(main())

