"""The ``artifacts`` sub-command: regenerate (or ``--check``) every committed generated file.

Standard library only, so registering the command on the CLI costs nothing; the generator (YAML,
pydantic, the rule and dashboard builders) is imported when the command runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def add_artifacts_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``artifacts`` on an ``argparse`` subparsers object; sets ``func``."""
    parser = subparsers.add_parser(
        "artifacts",
        help="generate alert rules, promtool tests, Grafana alerts and dashboards, Kubernetes objects",
        description="Generate the Prometheus rules, their promtool tests, Grafana alert rules and "
        "dashboards, and the PrometheusRule/ConfigMap objects from one source.",
    )
    parser.add_argument("--thresholds", metavar="FILE", help="thresholds YAML (see alerts/thresholds.defaults.yaml)")
    parser.add_argument("--out", metavar="DIR", default=".", help="root to write alerts/, dashboards/, deploy/ under")
    parser.add_argument("--runbook-url", help="URL of docs/runbook.md; alerts link to its anchors")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if DIR differs from the output")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Write the generated files under ``args.out`` (or diff them with ``--check``); the exit status."""
    from monitor.artifacts.generate import check, render, write
    from monitor.artifacts.rules.model import DEFAULT_RUNBOOK
    from monitor.artifacts.thresholds import load_thresholds

    try:
        th = load_thresholds(args.thresholds)
        files = render(th, DEFAULT_RUNBOOK if args.runbook_url is None else args.runbook_url)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    out = Path(args.out)
    if args.check:
        problems = check(out, files)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    changed = write(out, files)
    logger.info("wrote %d generated files under %s (%d changed)", len(files), out, len(changed))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m monitor.artifacts [--out DIR] [--check] ...``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m monitor.artifacts")
    sub = parser.add_subparsers(dest="command", required=True)
    add_artifacts_parser(sub)
    args = parser.parse_args(["artifacts", *(argv if argv is not None else sys.argv[1:])])
    return int(args.func(args))
