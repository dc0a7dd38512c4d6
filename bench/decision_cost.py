"""The drift suite's cost per decision, this tree against an earlier commit, in one run.

    PYTHONPATH=. .venv/bin/python -m bench.decision_cost                 # against BEFORE (below)
    PYTHONPATH=. .venv/bin/python -m bench.decision_cost --before HEAD~3 --rows 1000 --dim 384

The earlier commit's ``monitor/`` is unpacked (``git archive``) into a temporary directory; two
worker processes, one per tree, each decide the same seeded windows against the same reference
(the settings of the detection benchmark: a 60 s cycle, a false alarm a week, one thread, so the
held-out nulls). Rounds alternate between the two workers, so load on a shared machine falls on
both alike; each round reports the CPU time of its decisions (``time.process_time``, one
thread: the cost on one core, less sensitive to other processes than wall time) and the wall
time. The workers also print each decision's p-values, and the run checks that both trees give
the same ones (to 1e-9 relative) and the same verdicts. Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "6f6b56b"  # the last commit before the reference cache and the shared-Gram held-out MMD

WORKER = r"""
import json, sys, time
import numpy as np
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import run_drift_suite

rows, reference_rows, dim = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(20261128)
def unit(a):
    return (a / np.linalg.norm(a, axis=1, keepdims=True)).astype(np.float32)
centre = rng.normal(size=dim)
reference = unit(centre + 1.5 * rng.normal(size=(reference_rows, dim)))
settings = DriftSettings(interval_seconds=60, false_alarm_every="7d", window_sample_size=rows,
                         reference_sample_size=reference_rows, threads=1)
run_drift_suite(unit(centre + 1.5 * rng.normal(size=(rows, dim))), reference, settings, seed=0)  # warm-up
for line in sys.stdin:
    seed, count = map(int, line.split())
    out = []
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        window_rng = np.random.default_rng([seed, i])
        shift = 0.15 if i % 2 else 0.0
        window = unit(centre + 1.5 * window_rng.normal(size=(rows, dim)) + shift * np.eye(dim)[0])
        report = run_drift_suite(window, reference, settings, seed=seed * 1000 + i)
        out.append({"p": {r.test: r.p_value for r in report.results}, "detected": report.detected})
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu": cpu / count, "wall": wall / count, "decisions": out}), flush=True)
"""


def unpack(rev: str, into: Path) -> None:
    git = shutil.which("git") or "git"
    archive = subprocess.run([git, "archive", rev, "monitor"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"the commit to compare with (default {BEFORE})")
    parser.add_argument("--rows", type=int, default=1000, help="window rows (default 1000)")
    parser.add_argument("--reference-rows", type=int, default=1000, help="reference rows (default 1000)")
    parser.add_argument("--dim", type=int, default=384, help="dimension (default 384)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per tree (default 6)")
    parser.add_argument("--per-round", type=int, default=4, help="decisions per round (default 4)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.before, Path(tmp))
        workers = {}
        for name, path in (("before", tmp), ("after", str(ROOT))):
            workers[name] = subprocess.Popen(
                [sys.executable, "-c", WORKER, str(args.rows), str(args.reference_rows), str(args.dim)],
                cwd=path, env={"PYTHONPATH": path, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                               "PATH": "/usr/bin:/bin"},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        rounds: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
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
    mismatches = 0
    for b, a in zip(rounds["before"], rounds["after"], strict=True):
        for db, da in zip(b["decisions"], a["decisions"], strict=True):  # type: ignore[call-overload]
            same = db["detected"] == da["detected"] and all(
                abs(db["p"][t] - da["p"][t]) <= 1e-9 * max(abs(db["p"][t]), 1e-300) for t in db["p"])
            mismatches += not same
    cpu = {name: statistics.median(r["cpu"] for r in runs) * 1000 for name, runs in rounds.items()}  # type: ignore[misc]
    wall = {name: statistics.median(r["wall"] for r in runs) * 1000 for name, runs in rounds.items()}  # type: ignore[misc]
    summary = {
        "before": args.before, "rows": args.rows, "reference_rows": args.reference_rows, "dim": args.dim,
        "decisions_per_tree": args.rounds * args.per_round,
        "cpu_ms_per_decision": {k: round(v, 1) for k, v in cpu.items()},
        "wall_ms_per_decision": {k: round(v, 1) for k, v in wall.items()},
        "cpu_ratio_before_over_after": round(cpu["before"] / cpu["after"], 2),
        "wall_ratio_before_over_after": round(wall["before"] / wall["after"], 2),
        "decisions_that_differ": mismatches,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
