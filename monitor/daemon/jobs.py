"""Scheduled jobs: the refresh, checkpoints and every component's jobs, each counted and timed.

A job that raises or overruns its timeout is counted (``embmon_job_runs_total{outcome}``) and
logged; it never stops ingest or another job. APScheduler runs at most one instance of a job at
a time and coalesces missed runs: a run that falls due while the previous one is still going is
skipped (APScheduler logs "maximum number of running instances reached"), and counted here as
outcome ``skipped``.

Two pools. The daemon's own work (refresh, checkpoints, drift, canaries) runs in ``default``;
jobs that call out of the process (``ScheduledJob.outbound``: retrieval, index and serving probes)
run in ``outbound``, one thread per such job up to :data:`OUTBOUND_WORKERS`. A probe whose peer
never answers therefore holds at most its own thread, never one the refresh or a checkpoint
needs. Its queue is bounded too: a job has at most one run in progress or waiting, so a hung
run is counted once as ``timeout`` when its next run falls due past its timeout, and every run
due meanwhile as ``skipped``, rather than piling up.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.util import undefined
from prometheus_client import CollectorRegistry

from monitor import catalog
from monitor.component import ScheduledJob
from monitor.daemon.refresh import REFRESH_BUCKETS
from monitor.tally import Tally

logger = logging.getLogger(__name__)

JOB_WORKERS = 4  # the daemon's own jobs: refresh, checkpoint, drift, canaries
OUTBOUND_WORKERS = 8  # at most; one per outbound job below that
OUTBOUND = "outbound"


@dataclass
class _Running:
    """A run in progress: when it started and whether it was already counted as timed out."""

    started: float
    timeout: float | None
    counted: bool = False


class JobRunner:
    """Owns the scheduler; runs jobs with outcome counts and duration histograms."""

    def __init__(self, metrics: CollectorRegistry):
        self.runs: Tally[tuple[str, str]] = Tally()  # (job, outcome)
        self.duration = catalog.histogram("embmon_job_duration_seconds", metrics, REFRESH_BUCKETS)
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(JOB_WORKERS)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES)
        self.outbound_jobs = 0
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()

    def schedule(self, job: ScheduledJob, *, run_soon: bool = False) -> None:
        """Add ``job``; its first run comes after one interval, or within a second with ``run_soon``.
        An outbound job runs in the outbound pool (the module docstring)."""
        if job.outbound:
            self.outbound_jobs += 1
        self.scheduler.add_job(
            self.run,
            "interval",
            args=[job],
            seconds=job.interval_seconds,
            id=job.name,
            name=job.name,
            # None would add the job paused (APScheduler 3); undefined = first run after one interval
            next_run_time=_soon() if run_soon else undefined,
            executor=OUTBOUND if job.outbound else "default",
        )

    def start(self) -> None:
        """Start the scheduler, with an outbound pool sized for the outbound jobs scheduled so far."""
        self.scheduler.add_executor(ThreadPoolExecutor(max(1, min(self.outbound_jobs, OUTBOUND_WORKERS))), OUTBOUND)
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def run(self, job: ScheduledJob) -> None:
        """One run of ``job``, counted by outcome (success, failure, timeout) and timed."""
        started = time.perf_counter()
        running = _Running(started, job.timeout_seconds)
        with self._lock:
            self._running[job.name] = running
        outcome = "success"
        try:
            job.func()
        except Exception:  # a failing job is counted, never fatal
            outcome = "failure"
            logger.exception("job %s failed", job.name)
        elapsed = time.perf_counter() - started
        with self._lock:
            self._running.pop(job.name, None)
            counted = running.counted
        if outcome == "success" and job.timeout_seconds is not None and elapsed > job.timeout_seconds:
            outcome = "timeout"
            logger.warning("job %s took %.1fs, over its %.1fs timeout", job.name, elapsed, job.timeout_seconds)
        self.duration.labels(job.name).observe(elapsed)
        if not counted:  # a run counted as timed out while it still ran is not counted twice
            self.runs.add((job.name, outcome))


    def _skipped(self, event: JobSubmissionEvent) -> None:
        """A run fell due while the job's previous run was still going: the scheduler dropped it.
        A previous run past its timeout is counted as timed out now, once, however long it hangs."""
        self.runs.add((event.job_id, "skipped"))
        with self._lock:
            running = self._running.get(event.job_id)
            if running is None or running.counted or running.timeout is None:
                return
            elapsed = time.perf_counter() - running.started
            if elapsed <= running.timeout:
                return
            running.counted = True
        self.runs.add((event.job_id, "timeout"))
        logger.warning("job %s has run %.1fs, over its %.1fs timeout, and still runs: its next runs are skipped "
                       "until it returns", event.job_id, elapsed, running.timeout)


def _soon() -> Any:
    return datetime.now(UTC) + timedelta(seconds=0.5)
