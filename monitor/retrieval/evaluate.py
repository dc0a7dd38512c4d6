"""``embedding-monitor evaluate``: offline retrieval metrics of a TREC run, with confidence intervals.

    embedding-monitor evaluate --qrels qrels.txt --run run.txt --metrics ndcg recall --k 10 100
    embedding-monitor evaluate --qrels qrels.txt --run old.txt --compare new.txt --json
    embedding-monitor evaluate --qrels qrels.txt --run run.txt -q -M 100   # trec_eval -q -M100 layout

The same engine as the online probes (``monitor.retrieval.metrics``), trec_eval's semantics by
default, a bootstrap interval on every mean, and with ``--compare`` a paired test per metric with
Benjamini–Hochberg adjustment. Files are read as trec_eval reads them (``#`` comments, blank
lines, run columns after the tag ignored); ``-q`` prints trec_eval ``-q``'s per-query layout and
``-M N`` cuts every ranking to N documents first, as trec_eval's flags do. Also runnable as
``python -m monitor.retrieval.evaluate``. Exit status: 0 on success, 2 on unreadable or
malformed input or bad arguments.

This module is the command line only (standard library), so registering the command costs
nothing; the report is built by :mod:`monitor.retrieval.run_report` when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from monitor.retrieval.families import METRIC_FAMILY_NAMES

__all__ = ["DEFAULT_METRICS", "add_evaluate_parser", "build_parser", "main", "run_evaluate"]

DEFAULT_METRICS = ("ndcg@10", "recall@100", "map@100", "mrr@10", "precision@10")
# Families used when only --k is given.
DEFAULT_FAMILIES = ("ndcg", "recall", "map", "mrr", "precision")

_EXIT_BAD_INPUT = 2
# what the sub-command and the stand-alone parser show alike
_LOOK: dict[str, Any] = {
    "description": __doc__.split("\n\n")[0],
    "formatter_class": argparse.ArgumentDefaultsHelpFormatter,
}


def add_evaluate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``evaluate`` on an argparse subparsers object; it sets ``func=run_evaluate``.

    Light: the engine (numpy) is imported when the command runs, not when it is registered.
    """
    parser = subparsers.add_parser(
        "evaluate", help="offline retrieval metrics of a TREC run against qrels, with confidence intervals", **_LOOK
    )
    return _with_arguments(parser)


def build_parser(prog: str = "python -m monitor.retrieval.evaluate") -> argparse.ArgumentParser:
    """A stand-alone parser with the same arguments (for ``python -m`` and tests)."""
    return _with_arguments(argparse.ArgumentParser(prog=prog, **_LOOK))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


def run_evaluate(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Evaluate ``args.run`` (and ``args.compare``) against ``args.qrels``; print a table or JSON."""
    from monitor.retrieval.run_report import InputError, build_report  # numpy: only when the command runs

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    if args.per_query and args.compare and not args.json:
        print(
            "evaluate: error: --per-query prints one run in trec_eval's layout; "
            "with --compare add --json to get both runs' per-query values",
            file=stderr,
        )
        return _EXIT_BAD_INPUT
    try:
        report = build_report(args, _metric_names(args))
    except InputError as error:
        print(f"evaluate: error: {error}", file=stderr)
        return _EXIT_BAD_INPUT
    for note in report["notes"]:
        print(f"evaluate: {note}", file=stderr)
    if args.json:
        json.dump(report, stdout, indent=2)
        stdout.write("\n")
    elif args.per_query:
        stdout.write(_format_per_query(report["run"]))
    else:
        stdout.write(_format_table(report))
    return 0


def _with_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--qrels", required=True, help="TREC qrels file: qid 0 docid grade")
    parser.add_argument("--run", required=True, help="TREC run file: qid Q0 docid rank score tag")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="METRIC",
        help=f"metrics (family or family@k); families: {', '.join(METRIC_FAMILY_NAMES)} "
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
    parser.add_argument(
        "--max-grade",
        type=_positive_float,
        default=3.0,
        metavar="N",
        help="ERR's top grade g_max: stopping probability (2^min(g, g_max) - 1) / 2^g_max. The default 3 is "
        "the value of Elasticsearch's rank_eval examples (which require maximum_relevance); gdeval.pl fixes 4, "
        "so --max-grade 4 gives gdeval's err@k (and --gain exponential its ndcg@k)",
    )
    parser.add_argument(
        "-M",
        "--depth",
        type=_positive_int,
        default=None,
        metavar="N",
        help="keep only the top N documents of each ranking, in trec_eval's order, before every metric "
        "(trec_eval -M); None keeps them all",
    )
    parser.add_argument(
        "-q",
        "--per-query",
        action="store_true",
        help="print each query's values in trec_eval -q's layout (measure, query, value, then the 'all' means) "
        "instead of the table; with --json, add each run's per_query values",
    )
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
    parser.set_defaults(func=run_evaluate)
    return parser


def _metric_names(args: argparse.Namespace) -> Sequence[str]:
    if args.metrics is not None:
        return args.metrics
    return DEFAULT_FAMILIES if args.k else DEFAULT_METRICS


def _format_per_query(run: dict[str, Any]) -> str:
    """trec_eval ``-q``: ``%-22s\t%s\t%6.4f`` lines, each query's measures, then the ``all`` means.

    Queries in trec_eval's order (sorted as strcmp sorts them; Python's code-point order is the
    same order on UTF-8), measures in the order asked for. The names are ours (``ndcg@10``).
    """
    lines = [
        _trec_eval_line(name, qid, value)
        for qid, values in run["per_query"].items()
        for name, value in values.items()
    ]
    lines += [_trec_eval_line(name, "all", metric["mean"]) for name, metric in run["metrics"].items()]
    return "".join(lines)


def _trec_eval_line(measure: str, query: str, value: float) -> str:
    return f"{measure:<22}\t{query}\t{value:6.4f}\n"


def _format_table(report: dict[str, Any]) -> str:
    settings = report["settings"]
    depth = f"depth: {settings['depth']}   " if settings["depth"] is not None else ""
    lines = [
        f"qrels: {report['qrels']}   queries: {report['queries']}   {depth}"
        f"{settings['confidence']:.0%} percentile-bootstrap CI over queries "
        f"({settings['resamples']} resamples, seed {settings['seed']})"
    ]
    run_metrics = report["run"]["metrics"]
    if "compare" not in report:
        lines.append(f"run: {report['run']['path']}")
        rows: list[tuple[str, ...]] = [("metric", "mean", "ci_lower", "ci_upper", "queries")]
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
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
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

