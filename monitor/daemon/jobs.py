"""Scheduled jobs: the refresh, checkpoints and every component's jobs, each counted and timed.

A job that raises or overruns its timeout is counted (``embmon_job_runs_total{outcome}``) and
logged; it never stops ingest or another job. APScheduler runs at most one instance of a job at
a time and coalesces missed runs: a run that falls due while the previous one is still going is
skipped (APScheduler logs "maximum number of running instances reached"), and counted here as
outcome ``skipped``.
"""

from __future__ import annotations

import logging
import time
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

JOB_WORKERS = 4


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

    def schedule(self, job: ScheduledJob, *, run_soon: bool = False) -> None:
        """Add ``job``; its first run comes after one interval, or within a second with ``run_soon``."""
        self.scheduler.add_job(
            self.run,
            "interval",
            args=[job],
            seconds=job.interval_seconds,
            id=job.name,
            name=job.name,
            # None would add the job paused (APScheduler 3); undefined = first run after one interval
            next_run_time=_soon() if run_soon else undefined,
        )

    def start(self) -> None:
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def run(self, job: ScheduledJob) -> None:
        """One run of ``job``, counted by outcome (success, failure, timeout) and timed."""
        started = time.perf_counter()
        outcome = "success"
        try:
            job.func()
        except Exception:  # a failing job is counted, never fatal
            outcome = "failure"
            logger.exception("job %s failed", job.name)
        elapsed = time.perf_counter() - started
        if outcome == "success" and job.timeout_seconds is not None and elapsed > job.timeout_seconds:
            outcome = "timeout"
            logger.warning("job %s took %.1fs, over its %.1fs timeout", job.name, elapsed, job.timeout_seconds)
        self.duration.labels(job.name).observe(elapsed)
        self.runs.add((job.name, outcome))


    def _skipped(self, event: JobSubmissionEvent) -> None:
        """A run fell due while the job's previous run was still going: the scheduler dropped it."""
        self.runs.add((event.job_id, "skipped"))


def _soon() -> Any:
    return datetime.now(UTC) + timedelta(seconds=0.5)
