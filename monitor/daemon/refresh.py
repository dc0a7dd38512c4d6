"""The scheduled refresh: window metrics for every stream, published as one immutable snapshot.

The refresh copies each stream's window totals under its lock, computes outside it, and replaces
:class:`Published` whole, so scrapes and components read it without a lock and never see a
half-updated set of gauges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from monitor import catalog
from monitor.daemon.counters import InternalErrors
from monitor.daemon.memory import release_free_memory
from monitor.quality.intrinsic import IntrinsicReport, report_from_snapshot
from monitor.state.registry import StateRegistry, StreamKey
from monitor.state.window import WindowSnapshot

if TYPE_CHECKING:
    from monitor.config import Settings

REFRESH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class PublishedReport:
    report: IntrinsicReport
    computed_at: float


@dataclass(frozen=True)
class Published:
    """What the last refresh computed; replaced whole, never mutated, so scrapes need no lock."""

    reports: Mapping[StreamKey, PublishedReport] = field(default_factory=dict)
    windows: Mapping[StreamKey, WindowSnapshot] = field(default_factory=dict)
    computed_at: float | None = None


class Refresher:
    """Computes the intrinsic report of every stream's window and publishes them together."""

    def __init__(
        self,
        settings: Settings,
        registry: StateRegistry,
        errors: InternalErrors,
        metrics: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.registry = registry
        self.errors = errors
        self.clock = clock
        self.published = Published()
        self.succeeded_at: float | None = None  # unix time the last refresh ended (its clock may be a test's)
        self.duration = catalog.histogram("embmon_refresh_duration_seconds", metrics, REFRESH_BUCKETS)

    def refresh(self) -> Published:
        """Recompute window metrics for every stream and publish them (the scheduled job)."""
        started = time.perf_counter()
        now = self.clock()
        windows = self.registry.snapshot_windows(now)
        reports: dict[StreamKey, PublishedReport] = {}
        for key, window in windows.items():
            with self.errors.guard(f"refresh:{key[0]}"):
                reports[key] = PublishedReport(
                    report_from_snapshot(window, self.settings.quality, device=self.settings.device), now
                )
        self.published = Published(reports=reports, windows=windows, computed_at=now)
        release_free_memory()
        self.duration.observe(time.perf_counter() - started)
        self.succeeded_at = time.time()
        return self.published
