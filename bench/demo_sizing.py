"""How long each scheduled job of ``embedding-monitor demo`` takes, against its interval, over one loop.

The demo must never skip a job (a run due while the last one still runs) nor overrun one (a run
longer than its timeout) on a 2-core machine. This runs the daemon in-process with the demo's own
settings (:data:`monitor.cli.demo.DEMO_SETTINGS`) for one loop of the script, times every job run,
and prints per job: runs, mean, max, interval, the max's share of the interval, skipped and
overran; then how long ingest was paused by backpressure, CPU seconds per wall second (this
process and the JSON worker) and the load average:

    .venv/bin/python bench/demo_sizing.py                # one loop of the script (240 s)
    .venv/bin/python bench/demo_sizing.py --seconds 60   # a shorter look
    .venv/bin/python bench/demo_sizing.py --rate 1000    # another traffic rate
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.cli.demo import DEMO_SETTINGS, PHASES
from monitor.component import ScheduledJob
from monitor.config import load_settings
from monitor.daemon.service import Monitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=sum(s for _, s in PHASES), help="how long to run")
    parser.add_argument("--rate", type=float, help="records per second per model (default: the demo's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="embmon-demo-sizing-") as state:
        overrides = {"state_dir": state, "http": {"port": 0}}
        if args.rate is not None:
            overrides["synthetic"] = {"rate": args.rate}
        settings = load_settings(overrides=overrides, defaults=DEMO_SETTINGS)
        monitor = Monitor(settings)
        durations: dict[str, list[float]] = defaultdict(list)
        intervals: dict[str, float] = {}
        timed = monitor.jobs.run

        def run(job: ScheduledJob) -> None:
            intervals[job.name] = job.interval_seconds
            started = time.perf_counter()
            timed(job)
            durations[job.name].append(time.perf_counter() - started)

        monitor.jobs.run = run  # type: ignore[method-assign]  # before start: the scheduler binds it then
        cpu_before = _cpu()
        started = time.monotonic()
        monitor.serve(stop_after=args.seconds)
        wall = time.monotonic() - started
        cpu = _cpu() - cpu_before
    counts = monitor.status.job_run_counts()
    print(f"{'job':<14}{'runs':>6}{'mean s':>9}{'max s':>9}{'every s':>9}{'max/int':>9}{'skipped':>9}{'overran':>9}")
    for name in sorted(durations):
        values = durations[name]
        print(
            f"{name:<14}{len(values):>6}{sum(values) / len(values):>9.3f}{max(values):>9.3f}{intervals[name]:>9.1f}"
            f"{max(values) / intervals[name]:>9.2f}{counts.get((name, 'skipped'), 0):>9}"
            f"{counts.get((name, 'timeout'), 0):>9}"
        )
    load = os.getloadavg()
    drift = next((c for c in monitor.components if c.name == "drift"), None)
    if drift is not None:
        cut = sum(drift.snapshot().cuts.values())  # type: ignore[attr-defined]
        print(f"drift tests cut short by the cycle's time budget: {cut}")
    print(f"ingest paused by backpressure (apply queue full) for {monitor.daemon.status.backpressure_seconds():.1f} s")
    print(f"CPU {cpu / wall:.2f} s per wall second (daemon and JSON worker) over {wall:.0f} s; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the JSON worker, once it has exited
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
