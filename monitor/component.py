"""The plug-in seam of the daemon: drift, probes and anything else beyond intrinsic health.

A component sees accepted records on the ingest thread (cheap hooks only), schedules its own
heavy jobs, and exposes metrics built from a snapshot it published earlier. The daemon isolates
components from each other: a hook or job that raises is counted and logged, never fatal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from monitor.decoding.records import EmbeddingBatch, InteractionEvent, StreamKey
from monitor.storage.durable_files import RejectedFiles

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.state.registry import StateRegistry
    from monitor.state.window import WindowSnapshot


@dataclass(frozen=True)
class ScheduledJob:
    """A periodic job; ``timeout_seconds`` bounds one run (a run over it is counted as timed out).

    ``outbound``: the job calls out of the process (a vector store, an index, an embedding endpoint).
    Such jobs run in a pool of their own, so that one that hangs never delays the refresh, the
    checkpoints, drift or the canaries (:class:`monitor.daemon.jobs.JobRunner`)."""

    name: str
    func: Callable[[], object]  # what it returns is not used
    interval_seconds: float
    timeout_seconds: float | None = None
    outbound: bool = False


@dataclass
class MonitorContext:
    """What a component may read: configuration, live state, the latest published windows."""

    settings: Settings
    registry: StateRegistry
    clock: Callable[[], float]
    state_dir: Path
    # (model, stream) -> the window snapshot the last refresh computed metrics from.
    latest_windows: Callable[[], Mapping[StreamKey, WindowSnapshot]]
    # Register an HTTP route on the daemon's port: (path, handler, methods, bearer_token).
    # handler(environ) -> (status, content type, body); see monitor/server/exporter.py.
    add_route: Callable[..., None] | None = None
    # Where a component sets aside a file of the state directory it cannot use (counted, logged).
    rejected_files: RejectedFiles = field(default_factory=RejectedFiles)


class Component:
    """Base class with no-op hooks; override what the component needs."""

    name: str = "component"

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        """Called on the ingest thread for every accepted batch. Must stay O(n·d)."""

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        """Called on the ingest thread for every accepted interaction event."""

    def jobs(self) -> list[ScheduledJob]:
        return []

    def collect(self) -> Iterable[Metric]:
        """Metric families for one scrape, read from a published snapshot."""
        return ()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned (checkpoint restore)."""

    def close(self) -> None:
        """Release resources at shutdown."""
