"""Probes that hang never starve the daemon's own jobs: refresh, checkpoints, drift and canaries.

Outbound jobs (retrieval, index and serving probes) run in a pool of their own
(:mod:`monitor.daemon.jobs`). Here every probe blocks on an event that is only set when the test
ends, as a peer that accepts a connection and never answers would hold it; the refresh and the
checkpoints must go on every cycle regardless, and each hung run is counted once as timed out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.config import load_settings
from monitor.daemon.jobs import JOB_WORKERS, JobRunner
from monitor.daemon.service import Monitor
from tests.support import daemons
from tests.support.waiting import wait_until

HUNG_PROBES = JOB_WORKERS + 2  # more than the daemon's own pool: before the split, they took all of it


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so that the hung threads return and the process can exit."""
    event = threading.Event()
    yield event
    event.set()


def hung(release: threading.Event, started: list[str], name: str) -> Callable[[], None]:
    def run() -> None:
        started.append(name)
        release.wait(timeout=120)  # the bound only keeps a failed test from hanging the run

    return run


def test_hung_outbound_jobs_never_delay_the_daemons_own_jobs(release: threading.Event) -> None:
    runner = JobRunner(CollectorRegistry())
    started: list[str] = []
    for i in range(HUNG_PROBES):
        runner.schedule(ScheduledJob(f"probe:{i}", hung(release, started, f"probe:{i}"), 0.05, timeout_seconds=0.1,
                                     outbound=True), run_soon=True)
    runner.schedule(ScheduledJob("refresh", lambda: None, 0.05), run_soon=True)
    runner.schedule(ScheduledJob("checkpoint", lambda: None, 0.05), run_soon=True)
    runner.start()
    try:
        wait_until(lambda: len(started) == HUNG_PROBES, timeout=20, message="every probe hung")
        refreshes = runner.runs.snapshot().get(("refresh", "success"), 0)
        wait_until(lambda: runner.runs.snapshot().get(("refresh", "success"), 0) >= refreshes + 10
                   and runner.runs.snapshot().get(("checkpoint", "success"), 0) >= 10,
                   timeout=30, message="refreshes and checkpoints while every probe hangs")
        wait_until(lambda: all(runner.runs.snapshot().get((f"probe:{i}", "timeout"), 0) == 1
                               for i in range(HUNG_PROBES)), timeout=20, message="each hung run counted once")
        counts = runner.runs.snapshot()
        for i in range(HUNG_PROBES):
            assert counts[(f"probe:{i}", "skipped")] >= 1
            assert counts[(f"probe:{i}", "timeout")] == 1  # once per hung run, however many runs it skips
            assert (f"probe:{i}", "success") not in counts
        assert sorted(started) == sorted(f"probe:{i}" for i in range(HUNG_PROBES))  # one run each, no queue
    finally:
        release.set()
        runner.shutdown()


class HangingProbes(Component):
    """Outbound jobs whose every run blocks until the test ends (a peer that never answers)."""

    name = "hanging"

    def __init__(self, context: MonitorContext, release: threading.Event, started: list[str]):
        self.release, self.started = release, started

    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob(f"probe:hung{i}", hung(self.release, self.started, f"hung{i}"), 0.1,
                             timeout_seconds=0.2, outbound=True) for i in range(HUNG_PROBES)]


def test_a_daemon_whose_probes_all_hang_refreshes_every_cycle_and_checkpoints(tmp_path: Path,
                                                                              release: threading.Event) -> None:
    settings = load_settings(overrides={
        "source": "synthetic",
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path),
        "drift": {"enabled": False}, "checkpoint": {"enabled": True, "interval_seconds": 0.2},
        "refresh_seconds": 0.1,
    })
    started: list[str] = []
    daemon = Monitor(settings, component_factories=[lambda context: HangingProbes(context, release, started)])
    with daemons.running(daemon):
        wait_until(lambda: len(started) == HUNG_PROBES, timeout=30, message="every probe hung")

        def runs(job: str) -> int:
            return daemon.jobs.runs.snapshot().get((job, "success"), 0)

        refreshes, checkpoints = runs("refresh"), runs("checkpoint")
        first = daemon.status.checkpoint()
        assert first is not None
        wait_until(lambda: runs("refresh") >= refreshes + 10 and runs("checkpoint") >= checkpoints + 5,
                   timeout=60, message="refreshes and checkpoints while every probe hangs")
        latest = daemon.status.checkpoint()
        assert latest is not None and latest.last_success is not None
        assert first.last_success is None or latest.last_success > first.last_success
        ready, why = daemon.readiness()
        assert ready, why
