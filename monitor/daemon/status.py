"""The read-only view of a running daemon that collectors and health checks are given.

Collectors must not be able to change the daemon, and must not need to know how it is wired:
they get a :class:`DaemonStatus`, whose methods return copies or immutable snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.daemon.checkpointing import Checkpointer, CheckpointStatus
    from monitor.daemon.counters import InternalErrors
    from monitor.daemon.intake import Intake
    from monitor.daemon.jobs import JobRunner
    from monitor.daemon.refresh import Published, Refresher
    from monitor.server.exporter import HttpServer
    from monitor.sources.base import Source
    from monitor.state.registry import StateRegistry
    from monitor.storage.durable_files import RejectedFiles


@dataclass(frozen=True)
class StreamCounts:
    model: str
    stream: str
    records_total: int
    last_record_time: float | None


class DaemonStatus:
    """Counters, published metrics and health of the daemon's parts, for reading only."""

    def __init__(
        self,
        *,
        source: Source,
        registry: StateRegistry,
        refresher: Refresher,
        pipeline: Intake,
        jobs: JobRunner,
        errors: InternalErrors,
        checkpointer: Checkpointer | None,
        http: HttpServer,
        started_at: float,
        wall_clock: Callable[[], float],
        rejected_files: RejectedFiles | None = None,
        computes_windows: bool = True,
    ):
        self._source = source
        self._registry = registry
        self._refresher = refresher
        self._pipeline = pipeline
        self._jobs = jobs
        self._errors = errors
        self._checkpointer = checkpointer
        self._http = http
        self.started_at = started_at
        self.wall_clock = wall_clock
        self._rejected_files = rejected_files
        self.computes_windows = computes_windows  # a replica's windows are computed by the reducer

    def refresh_succeeded_at(self) -> float | None:
        """Unix time the last refresh of the window metrics ended; None before the first."""
        return self._refresher.succeeded_at

    @property
    def published(self) -> Published:
        """The last refresh's immutable snapshot."""
        return self._refresher.published

    def streams(self) -> list[StreamCounts]:
        return [StreamCounts(s.model, s.stream, s.records_total, s.last_record_time) for s in self._registry]

    def invalid_counts(self) -> dict[tuple[str, str], int]:
        return self._pipeline.invalid.snapshot()

    def interaction_counts(self) -> dict[str, int]:
        return self._pipeline.interactions.snapshot()

    def internal_error_counts(self) -> dict[str, int]:
        return self._errors.counts.snapshot()

    def job_run_counts(self) -> dict[tuple[str, str], int]:
        return self._jobs.runs.snapshot()

    def source_up(self) -> bool:
        return bool(self._source.up)

    def source_lag(self) -> dict[str, int] | None:
        return self._source.lag()

    def lag_updated(self) -> float | None:
        return self._source.lag_updated

    def source_error_counts(self) -> dict[str, int]:
        return self._source.error_counts()

    def source_offset_resets(self) -> dict[str, int]:
        return self._source.offset_reset_counts()

    def source_progress(self) -> dict[str, float] | None:
        return self._source.last_progress()

    def queue_depth(self) -> int:
        return self._pipeline.queue_depth()

    def ingest_paused(self) -> bool:
        return self._pipeline.paused

    def backpressure_seconds(self) -> float:
        return self._pipeline.backpressure_seconds()

    def checkpoint(self) -> CheckpointStatus | None:
        """None when checkpointing is off."""
        return self._checkpointer.status() if self._checkpointer is not None else None

    def auth_failure_counts(self) -> dict[str, int]:
        return self._http.auth_failure_counts()

    def rejected_file_counts(self) -> dict[str, int]:
        return {} if self._rejected_files is None else self._rejected_files.counts.snapshot()
