"""The job runner counts runs the scheduler skipped because the previous one was still going."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from monitor.component import ScheduledJob
from monitor.daemon.jobs import JobRunner
from tests.support.waiting import wait_until


def test_a_run_due_while_the_last_one_is_still_going_is_counted_as_skipped() -> None:
    runner = JobRunner(CollectorRegistry())
    release = threading.Event()
    started = threading.Event()

    def stuck() -> None:
        started.set()
        release.wait(timeout=30)

    runner.schedule(ScheduledJob("stuck", stuck, interval_seconds=0.1), run_soon=True)
    runner.schedule(ScheduledJob("quick", lambda: None, interval_seconds=0.1))
    runner.start()
    try:
        wait_until(started.is_set, timeout=10, message="the first run")
        wait_until(lambda: runner.runs.snapshot().get(("stuck", "skipped"), 0) >= 2, timeout=10, message="skips")
    finally:
        release.set()
        runner.shutdown()
    counts = runner.runs.snapshot()
    assert counts.get(("stuck", "success"), 0) <= 1  # the one run that was stuck
    assert counts.get(("quick", "success"), 0) >= 1 and ("quick", "skipped") not in counts
