"""``embedding-monitor drift explain``: what moved at a running daemon's last drift cycle.

``drift explain --url http://HOST:9464 --token-file F --model M [--stream S] [--json]`` asks the
daemon (``GET /admin/drift/explain``, bearer token) and prints, per stream, the verdict, the novel
share and the reference's regions ranked by their part of the MMD statistic (where the kernel
test sees the difference): that part, reference and window share, change, Benjamini–Hochberg
adjusted p-value, and exemplar ids from the reference and from the window
(open those items to see what moved). docs/drift.md, "What moved"; the runbook starts here.

Exit status: 0 success, 1 the daemon refused or could not be reached, 2 bad usage.
The CLI registers this whenever it builds its parser: standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from monitor.drift.admin import EXPLAIN_PATH
from monitor.server.admin_client import AdminCallFailed, add_admin_flags, fail, get_admin


def add_drift_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``drift`` (with ``explain``) on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "drift", help="explain a running daemon's drift verdicts",
        description="Explain a running daemon's drift verdicts (docs/drift.md, \"What moved\").",
    )
    sub = parser.add_subparsers(dest="drift_command", required=True, metavar="ACTION")
    explain = sub.add_parser("explain",
                             help="the last cycle's regions ranked by their part of the MMD, with exemplar ids")
    add_admin_flags(explain)
    explain.add_argument("--model", required=True)
    explain.add_argument("--stream", help="default: every stream of the model")
    explain.add_argument("--json", action="store_true", help="print the daemon's JSON answer")
    explain.set_defaults(func=run_drift)
    return parser


def run_drift(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    query = {"model": args.model, **({"stream": args.stream} if args.stream else {})}
    try:
        answer = get_admin(args, EXPLAIN_PATH, query)
    except ValueError as exc:
        print(f"embedding-monitor drift: {exc}", file=stderr)
        return 2
    except AdminCallFailed as exc:
        return fail("drift", str(exc), stderr)
    if args.json:
        print(json.dumps(answer, indent=2), file=stdout)
        return 0
    for entry in answer.get("explanations", []):
        print(format_explanation(entry), file=stdout)
    return 0


def format_explanation(entry: dict[str, Any]) -> str:
    """One stream's explanation as a readable block: verdict, tests, novel share, the ranked regions.

    Examples
    --------
    >>> entry = {"model": "m", "stream": "s", "computed_at": 0.0, "detected": True, "detected_tests": ["ks"],
    ...          "cycle_alpha": 1e-4, "window_rows": 900, "tests": [], "cut": {}, "notes": [],
    ...          "regions": {"k": 2, "alpha": 1e-4, "reference_rows": 500, "window_rows": 900, "shifted": [1],
    ...                      "novel_share": 0.2, "novel_reference_share": 0.01, "novel_p_adjusted": 1e-30,
    ...                      "novel_shifted": True, "novel_exemplars": ["d9"], "ranked": [
    ...              {"region": 1, "reference_share": 0.5, "window_share": 0.8, "change": 0.3, "p_adjusted": 1e-12,
    ...               "mmd_share": 0.9, "shifted": True, "reference_exemplars": ["r1"],
    ...               "window_exemplars": ["w1", "w2"]}]}}
    >>> print(format_explanation(entry))  # doctest: +NORMALIZE_WHITESPACE
    m/s  cycle at 1970-01-01T00:00:00Z  verdict: DRIFT (ks)  alpha 0.0001  900 window rows
    novel: 20.0% of the window (reference 1.0%), p (BH) 1e-30, shifted: yes; window exemplars: d9
    region  of MMD  reference  window  change  p (BH)   shifted  exemplars: reference / window
         1   90.0%      50.0%   80.0%  +30.0%  1e-12    yes      r1 / w1, w2
    """
    evidence = entry.get("evidence")
    why = list(entry["detected_tests"]) + (["accumulated evidence"] if evidence and evidence["alarmed"] else [])
    verdict = "DRIFT (" + ", ".join(why) + ")" if entry["detected"] else "no drift"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["computed_at"]))
    lines = [f"{entry['model']}/{entry['stream']}  cycle at {stamp}  verdict: {verdict}  "
             f"alpha {entry['cycle_alpha']:.3g}  {entry['window_rows']} window rows"]
    if evidence is not None:
        lines.append(f"  evidence   log R {evidence['log_evidence']:.2f}  "
                     f"threshold log A {evidence['log_threshold']:.2f}  {evidence['rows']} fresh rows"
                     f"{'  alarmed' if evidence['alarmed'] else ''}")
    for test in entry.get("tests", []):
        floor = test.get("p_value_floor")
        reach = "" if not floor or floor <= test["threshold"] else "  (could not reach its threshold)"
        lines.append(f"  {test['test']:<10} p {test['p_value']:.3g}  threshold {test['threshold']:.3g}"
                     f"{'  detected' if test['detected'] else ''}{reach}")
    for test, how in sorted(entry.get("cut", {}).items()):
        lines.append(f"  {test:<10} cut by the cycle's time budget ({how})")
    regions = entry.get("regions")
    if regions is not None:
        novel = ", ".join(regions["novel_exemplars"]) or "-"
        lines.append(
            f"novel: {100 * regions['novel_share']:.1f}% of the window "
            f"(reference {100 * regions['novel_reference_share']:.1f}%), p (BH) {regions['novel_p_adjusted']:.2g}, "
            f"shifted: {'yes' if regions['novel_shifted'] else 'no'}; window exemplars: {novel}"
        )
        lines.append("region  of MMD  reference  window  change  p (BH)   shifted  exemplars: reference / window")
        for r in regions["ranked"]:
            exemplars = f"{', '.join(r['reference_exemplars']) or '-'} / {', '.join(r['window_exemplars']) or '-'}"
            lines.append(f"{r['region']:>6}  {100 * r.get('mmd_share', 0.0):5.1f}%  "
                         f"{100 * r['reference_share']:8.1f}%  {100 * r['window_share']:5.1f}%  "
                         f"{100 * r['change']:+5.1f}%  {r['p_adjusted']:<7.2g}  {'yes' if r['shifted'] else 'no':<7}  "
                         f"{exemplars}")
    lines.extend(f"note: {note}" for note in entry.get("notes", []))
    return "\n".join(lines)
