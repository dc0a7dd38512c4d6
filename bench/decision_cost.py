"""The drift suite's cost per decision, this tree against an earlier commit, in one run.

    PYTHONPATH=. .venv/bin/python -m bench.decision_cost                 # against BEFORE (below)
    PYTHONPATH=. .venv/bin/python -m bench.decision_cost --before HEAD~3 --rows 1000 --dim 384
    PYTHONPATH=. .venv/bin/python -m bench.decision_cost --topics --shift 0.05   # power on real sentences

The earlier commit's ``monitor/`` is unpacked (``git archive``) into a temporary directory; two
worker processes, one per tree, each decide the same seeded windows against the same reference
(the settings of the detection benchmark: a 60 s cycle, a false alarm a week, one thread, so the
held-out nulls). Rounds alternate between the two workers, so load on a shared machine falls on
both alike; each round reports the CPU time of its decisions (``time.process_time`` around each
``run_drift_suite`` call, not the drawing of its window; one thread: the cost on one core, less
sensitive to other processes than wall time) and the wall time. The workers also print each
decision's p-values: the run counts the decisions whose verdicts differ (it exits 1 if any does)
and, per test, how many p-values differ by more than 1e-9 relative and the largest difference in
log10 p (an intended change of a test's p-value construction shows there, not as a failure).
Every other decision is drawn shifted (``--shift`` along one axis; with ``--topics`` the windows
are real MiniLM sentences and ``--shift`` is the share of topics the reference never had): the
summary gives the share of those each tree detected, the false alarms on the others, and each
test's median log10 p on the shifted ones. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "ea9c9d3"  # the last commit before the sketched KS basis and the cheaper held-out tests

WORKER = r"""
import json, sys, time
import numpy as np
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import run_drift_suite

rows, reference_rows, dim, shift_size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
topics = sys.argv[5] if len(sys.argv) > 5 else ""
rng = np.random.default_rng(20261128)
def unit(a):
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)
if topics:  # real MiniLM sentences: the shifted windows hold a share of topics the reference never had
    stored = np.load(topics)
    vectors, usual, new = stored["vectors"], stored["usual"], stored["new"]
    def draw(r, count, share):
        fresh = int(round(count * share))
        picked = np.r_[r.choice(usual, count - fresh), r.choice(new, fresh)]
        return vectors[picked[r.permutation(count)]]
    reference = draw(rng, reference_rows, 0.0)
else:
    centre = rng.normal(size=dim)
    def draw(r, count, shift):
        return unit(centre + 1.5 * r.normal(size=(count, dim)) + shift * np.eye(dim)[0])
    reference = draw(rng, reference_rows, 0.0)
settings = DriftSettings(interval_seconds=60, false_alarm_every="7d", window_sample_size=rows,
                         reference_sample_size=reference_rows, threads=1)
run_drift_suite(draw(rng, rows, 0.0), reference, settings, seed=0)  # warm-up
for line in sys.stdin:
    seed, count = map(int, line.split())
    out = []
    cpu = wall = 0.0
    for i in range(count):
        window = draw(np.random.default_rng([seed, i]), rows, shift_size if i % 2 else 0.0)
        cpu_started, wall_started = time.process_time(), time.perf_counter()  # the decision alone
        report = run_drift_suite(window, reference, settings, seed=seed * 1000 + i)
        cpu += time.process_time() - cpu_started
        wall += time.perf_counter() - wall_started
        out.append({"p": {r.test: r.p_value for r in report.results}, "detected": report.detected,
                    "shifted": bool(i % 2)})
    print(json.dumps({"cpu": cpu / count, "wall": wall / count, "decisions": out}), flush=True)
"""


def unpack(rev: str, into: Path) -> None:
    git = shutil.which("git") or "git"
    archive = subprocess.run([git, "archive", rev, "monitor"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def _topics(path: Path) -> str:
    """The help-topic sentences' MiniLM embeddings and which are usual and which new, saved for the workers."""
    sys.path.insert(0, str(ROOT))
    from tests.support import topics

    usual, new = topics.usual_and_new()
    np.savez(path, vectors=topics.embeddings(), usual=usual, new=new)
    return str(path)


def _log10(p: float) -> float:
    return math.log10(max(p, 1e-300))


def _power(decisions: list[Any]) -> dict[str, Any]:
    """The shifted decisions detected, the unshifted ones that alarmed, each test's median log10 p when shifted."""
    shifted = [d for d in decisions if d["shifted"]]
    quiet = [d for d in decisions if not d["shifted"]]
    return {
        "detected_shifted": f"{sum(d['detected'] for d in shifted)}/{len(shifted)}",
        "false_alarms_unshifted": f"{sum(d['detected'] for d in quiet)}/{len(quiet)}",
        "median_log10_p_shifted": {
            test: round(statistics.median(_log10(d["p"][test]) for d in shifted), 2)
            for test in sorted(shifted[0]["p"])} if shifted else {},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    parser.add_argument("--rows", type=int, default=1000, help="window rows (default 1000)")
    parser.add_argument("--reference-rows", type=int, default=1000, help="reference rows (default 1000)")
    parser.add_argument("--dim", type=int, default=384, help="dimension (default 384)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per tree (default 6)")
    parser.add_argument("--per-round", type=int, default=4, help="decisions per round (default 4)")
    parser.add_argument("--shift", type=float, default=0.15,
                        help="the shifted windows' shift along one axis (default 0.15), or with --topics their share "
                             "of new topics")
    parser.add_argument("--topics", action="store_true",
                        help="real MiniLM embeddings of help-topic sentences (tests/support/topics.py) instead of "
                             "Gaussian rows; d = 384")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.before, Path(tmp))
        extra = [_topics(Path(tmp) / "topics.npz")] if args.topics else []
        workers = {}
        for name, path in (("before", tmp), ("after", str(ROOT))):
            workers[name] = subprocess.Popen(
                [sys.executable, "-c", WORKER, str(args.rows), str(args.reference_rows), str(args.dim),
                 str(args.shift), *extra],
                cwd=path, env={"PYTHONPATH": path, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        rounds: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        try:
            for r in range(args.rounds):
                for name, worker in workers.items():
                    assert worker.stdin is not None and worker.stdout is not None
                    worker.stdin.write(f"{r} {args.per_round}\n")
                    worker.stdin.flush()
                    line = worker.stdout.readline()
                    if not line:
                        raise RuntimeError(f"the {name} worker stopped (exit {worker.wait()})")
                    rounds[name].append(json.loads(line))
        finally:
            for worker in workers.values():
                if worker.stdin is not None:
                    worker.stdin.close()
                worker.wait(timeout=60)
    decisions: dict[str, list[Any]] = {name: [d for r in runs for d in r["decisions"]]
                                       for name, runs in rounds.items()}
    pairs = list(zip(decisions["before"], decisions["after"], strict=True))
    verdicts_differ = sum(b["detected"] != a["detected"] for b, a in pairs)
    p_values: dict[str, dict[str, float]] = {}
    for b, a in pairs:
        for test in sorted(set(b["p"]) & set(a["p"])):
            entry = p_values.setdefault(test, {"differ": 0, "max_abs_log10_difference": 0.0})
            entry["differ"] += abs(b["p"][test] - a["p"][test]) > 1e-9 * max(abs(b["p"][test]), 1e-300)
            gap = abs(_log10(b["p"][test]) - _log10(a["p"][test]))
            entry["max_abs_log10_difference"] = round(max(entry["max_abs_log10_difference"], gap), 3)
    power = {name: _power(made) for name, made in decisions.items()}
    cpu = {name: statistics.median(r["cpu"] for r in runs) * 1000 for name, runs in rounds.items()}
    wall = {name: statistics.median(r["wall"] for r in runs) * 1000 for name, runs in rounds.items()}
    summary = {
        "before": args.before, "rows": args.rows, "reference_rows": args.reference_rows, "dim": args.dim,
        "decisions_per_tree": args.rounds * args.per_round,
        "cpu_ms_per_decision": {k: round(v, 1) for k, v in cpu.items()},
        "wall_ms_per_decision": {k: round(v, 1) for k, v in wall.items()},
        "cpu_ratio_before_over_after": round(cpu["before"] / cpu["after"], 2),
        "wall_ratio_before_over_after": round(wall["before"] / wall["after"], 2),
        "data": "topics" if args.topics else "gaussian",
        "shift": args.shift,
        "verdicts_that_differ": verdicts_differ,
        "p_values_that_differ": p_values,
        "power": power,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary, indent=1))
    return 1 if verdicts_differ else 0


if __name__ == "__main__":
    sys.exit(main())
