"""The daemon's lifecycle: start-up, the ingest loop, scheduled refreshes, shutdown.

Threads:
* ``embmon-poll`` polls the source, decodes, hands batches to the apply thread and commits the
  offsets the apply thread reports as reflected in state (kafka-python is not thread-safe, so
  polling and committing stay on one thread);
* ``embmon-apply`` folds batches into the windows (BLAS releases the GIL, so this overlaps with
  polling and JSON parsing on a second core) and calls the components' cheap hooks;
* the apscheduler pool runs the refresh job and component jobs; the HTTP server has its own.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Histogram

from monitor.collector import MonitorCollector
from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.components import ComponentFactory, default_component_factories
from monitor.config import Settings
from monitor.decoding import Decoder, DecodeResult
from monitor.exporter import HttpServer
from monitor.logs import RateLimitedLog
from monitor.quality.intrinsic import IntrinsicReport, report_from_snapshot
from monitor.sources import Source, SourceMessage, build_source
from monitor.state.registry import StateRegistry, StreamKey
from monitor.state.window import WindowSnapshot

logger = logging.getLogger(__name__)

REFRESH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
APPLY_QUEUE_POLLS = 8  # polls buffered between the poll and apply threads: bounds memory


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


@dataclass
class _Applied:
    """A decoded poll on its way to the apply thread."""

    decoded: DecodeResult
    interactions: DecodeResult
    positions: dict[tuple[str, int], int]


class Monitor:
    """Wires source, decoder, state, components, scheduler and HTTP server together."""

    def __init__(
        self,
        settings: Settings,
        source: Source | None = None,
        clock: Callable[[], float] = time.time,
        component_factories: list[ComponentFactory] | None = None,
    ):
        self.settings = settings
        self.clock = clock
        self.source = source or build_source(settings)
        self.registry = StateRegistry(settings)
        self.decoder = Decoder(
            settings.limits,
            default_stream=settings.kafka.default_stream if settings.source == "kafka" else _default_stream(settings),
            declared_dims={name: m.dim for name, m in settings.models.items() if m.dim},
            admit=self.registry.admit,
            admit_model=self.registry.admit_model,
        )
        self.published = Published()
        self.metrics_registry = CollectorRegistry(auto_describe=False)
        self.refresh_duration = Histogram(
            "embmon_refresh_duration_seconds",
            "Wall time of one window-metric refresh over all streams.",
            buckets=REFRESH_BUCKETS,
            registry=self.metrics_registry,
        )
        self.job_duration = Histogram(
            "embmon_job_duration_seconds",
            "Wall time of one run of a scheduled job.",
            ["job"],
            buckets=REFRESH_BUCKETS,
            registry=self.metrics_registry,
        )
        self._job_runs: Counter[tuple[str, str]] = Counter()
        self._invalid: Counter[tuple[str, str]] = Counter()
        self._interactions: Counter[str] = Counter()
        self._internal_errors: Counter[str] = Counter()
        self._counter_lock = threading.Lock()
        self._applied: dict[tuple[str, int], int] = {}
        self._applied_lock = threading.Lock()
        self._committed: dict[tuple[str, int], int] = {}
        self._log = RateLimitedLog(logger)
        self._stop = threading.Event()  # set by stop() or a signal: intake ends
        self._stop_lock = threading.Lock()
        self._stopped = False  # stop() ran (idempotence)
        self._queue: queue.Queue[_Applied | None] = queue.Queue(maxsize=APPLY_QUEUE_POLLS)
        self._poll_thread = threading.Thread(target=self._poll_loop, name="embmon-poll", daemon=True)
        self._apply_thread = threading.Thread(target=self._apply_loop, name="embmon-apply", daemon=True)
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.http = HttpServer(
            self.metrics_registry,
            settings.http.host,
            settings.http.port,
            health=self.health,
            readiness=self.readiness,
        )
        self.context = MonitorContext(
            settings=settings,
            registry=self.registry,
            clock=clock,
            state_dir=settings.state_dir,
            latest_windows=lambda: self.published.windows,
            add_route=self.http.add_route,
        )
        if component_factories is None:
            component_factories = default_component_factories(settings)
        self.components: list[Component] = [factory(self.context) for factory in component_factories]
        self.metrics_registry.register(MonitorCollector(self))
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start serving, scheduling and consuming. Returns once everything runs."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.source.start()
        self.http.start()
        jobs = [ScheduledJob("refresh", self.refresh, self.settings.refresh_seconds)]
        for component in self.components:
            jobs.extend(component.jobs())
        for job in jobs:
            self._scheduler.add_job(
                self._run_job,
                "interval",
                args=[job],
                seconds=job.interval_seconds,
                id=job.name,
                name=job.name,
                next_run_time=None if job.name != "refresh" else _soon(),
            )
        self._scheduler.start()
        self._apply_thread.start()
        self._poll_thread.start()
        self._started = True
        logger.info(
            "embedding-monitor serving http://%s:%d/metrics, source=%s",
            self.settings.http.host,
            self.http.port,
            self.source.name,
        )

    def stop(self) -> None:
        """Stop intake, apply what was polled, commit, and shut down within the configured bound."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds
        self._stop.set()
        if self._started:
            self._poll_thread.join(timeout=max(0.1, deadline - time.monotonic()))
            self._apply_thread.join(timeout=max(0.1, deadline - time.monotonic()))
            if self._poll_thread.is_alive() or self._apply_thread.is_alive():
                logger.warning("ingest did not stop within %.1fs; exiting anyway", self.settings.shutdown_timeout_seconds)
            self._scheduler.shutdown(wait=False)
        for component in self.components:
            with self._guard(f"close:{component.name}"):
                component.close()
        self.http.stop()
        logger.info("embedding-monitor stopped")

    def run_until_stopped(self, stop_after: float | None = None) -> None:
        """Block until SIGTERM/SIGINT (or ``stop_after`` seconds), then stop cleanly."""
        with _stop_on_signals(self._stop):
            self._stop.wait(timeout=stop_after)
        self.stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------------ ingest
    def _poll_loop(self) -> None:
        timeout = self.settings.kafka.poll_timeout_seconds
        commit_every = self.settings.kafka.commit_interval_seconds
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    messages = self.source.poll(timeout)
                except Exception:  # noqa: BLE001 - never let a source bug end intake
                    self.count_internal_error("poll")
                    logger.exception("source poll failed")
                    time.sleep(min(timeout, 1.0))
                    continue
                if messages:
                    self._queue.put(self._decode(messages))
                if time.monotonic() - last_commit >= commit_every:
                    self._commit()
                    last_commit = time.monotonic()
        finally:
            with contextlib.suppress(queue.Full):  # tell the apply thread to finish what is queued
                self._queue.put(None, timeout=self.settings.shutdown_timeout_seconds / 2)
            self._apply_thread.join(timeout=self.settings.shutdown_timeout_seconds / 2)
            self._commit()
            with self._guard("close:source"):
                self.source.close()

    def _decode(self, messages: list[SourceMessage]) -> _Applied:
        embeddings = [(m.value, m.headers) for m in messages if m.kind == "embeddings"]
        interactions = [(m.value, m.headers) for m in messages if m.kind == "interactions"]
        positions: dict[tuple[str, int], int] = {}
        for m in messages:
            if m.position is not None:
                key = (m.position.topic, m.position.partition)
                positions[key] = max(positions.get(key, -1), m.position.offset)
        decoded = self.decoder.decode_embeddings(embeddings) if embeddings else DecodeResult()
        inter = self.decoder.decode_interactions(interactions) if interactions else DecodeResult()
        return _Applied(decoded, inter, positions)

    def _apply_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._apply(item)

    def _apply(self, item: _Applied) -> None:
        now = self.clock()
        for batch in item.decoded.batches:
            with self._guard("apply"):
                self.registry.apply(batch, now)
            for component in self.components:
                with self._guard(f"on_embeddings:{component.name}"):
                    component.on_embeddings(batch, now)
        for event in item.interactions.interactions:
            with self._counter_lock:
                self._interactions[event.model] += 1
            for component in self.components:
                with self._guard(f"on_interaction:{component.name}"):
                    component.on_interaction(event, now)
        for result in (item.decoded, item.interactions):
            if result.rejected:
                with self._counter_lock:
                    self._invalid.update(result.rejected)
                for reason, detail in result.examples.items():
                    self._log.warning(f"invalid:{reason}", "skipping invalid record (%s): %s", reason, detail)
        if item.positions:
            with self._applied_lock:
                for key, offset in item.positions.items():
                    self._applied[key] = max(self._applied.get(key, -1), offset)

    def _commit(self) -> None:
        with self._applied_lock:
            pending = {k: v for k, v in self._applied.items() if self._committed.get(k) != v}
        if pending:
            self.source.commit(pending)
            self._committed.update(pending)

    def applied_offsets(self) -> dict[tuple[str, int], int]:
        """The last offset per partition that state reflects."""
        with self._applied_lock:
            return dict(self._applied)

    # ------------------------------------------------------------------ refresh
    def refresh(self) -> Published:
        """Recompute window metrics for every stream and publish them (the scheduled job)."""
        started = time.perf_counter()
        now = self.clock()
        windows = self.registry.snapshot_windows(now)
        reports: dict[StreamKey, PublishedReport] = {}
        for key, window in windows.items():
            with self._guard(f"refresh:{key[0]}"):
                reports[key] = PublishedReport(
                    report_from_snapshot(window, self.settings.quality, device=self.settings.device), now
                )
        self.published = Published(reports=reports, windows=windows, computed_at=now)
        self.refresh_duration.observe(time.perf_counter() - started)
        return self.published

    def _run_job(self, job: ScheduledJob) -> None:
        started = time.perf_counter()
        outcome = "success"
        try:
            job.func()
        except Exception:  # noqa: BLE001 - a failing job is counted, never fatal
            outcome = "failure"
            logger.exception("job %s failed", job.name)
        elapsed = time.perf_counter() - started
        if outcome == "success" and job.timeout_seconds is not None and elapsed > job.timeout_seconds:
            outcome = "timeout"
            logger.warning("job %s took %.1fs, over its %.1fs timeout", job.name, elapsed, job.timeout_seconds)
        self.job_duration.labels(job.name).observe(elapsed)
        with self._counter_lock:
            self._job_runs[(job.name, outcome)] += 1

    # ------------------------------------------------------------------ status
    def health(self) -> tuple[bool, str]:
        """Liveness: the process can do its work (ingest threads alive). Broker outages do not count."""
        if self._started and not self._stop.is_set():
            if not self._poll_thread.is_alive() or not self._apply_thread.is_alive():
                return False, "ingest thread died"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: the source is connected and metrics have been computed at least once."""
        if not self.source.up:
            return False, f"source {self.source.name} is not connected"
        if self.published.computed_at is None:
            return False, "no metrics computed yet"
        return True, "ready"

    def source_up(self) -> bool:
        return bool(self.source.up)

    def source_lag(self) -> dict[str, int] | None:
        return self.source.lag()

    def invalid_counts(self) -> dict[tuple[str, str], int]:
        with self._counter_lock:
            return dict(self._invalid)

    def interaction_counts(self) -> dict[str, int]:
        with self._counter_lock:
            return dict(self._interactions)

    def internal_error_counts(self) -> dict[str, int]:
        with self._counter_lock:
            return dict(self._internal_errors)

    def job_run_counts(self) -> dict[tuple[str, str], int]:
        with self._counter_lock:
            return dict(self._job_runs)

    def count_internal_error(self, stage: str) -> None:
        with self._counter_lock:
            self._internal_errors[stage.split(":")[0]] += 1

    @contextlib.contextmanager
    def _guard(self, stage: str) -> Iterator[None]:
        try:
            yield
        except Exception:  # noqa: BLE001 - isolate failures; they are counted and logged
            self.count_internal_error(stage)
            self._log.warning(f"internal:{stage}", "internal error in %s (see debug log)", stage)
            logger.debug("internal error in %s", stage, exc_info=True)


def _default_stream(settings: Settings) -> str:
    if settings.source == "file":
        return settings.file.stream
    if settings.source == "synthetic":
        return settings.synthetic.stream
    return settings.kafka.default_stream


def _soon() -> Any:
    from datetime import datetime, timedelta, timezone

    return datetime.now(timezone.utc) + timedelta(seconds=0.5)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop``; the original handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum: int, frame: FrameType | None) -> None:
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
