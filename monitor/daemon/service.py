"""The daemon: one object that wires source, ingest, state, jobs, components and the HTTP port.

The parts, in data-flow order (docs/architecture.md):

* :mod:`monitor.daemon.ingest`: poll and apply threads, decoding, backpressure, commits;
* :mod:`monitor.daemon.offsets`: applied, durable and committed offsets; :mod:`monitor.daemon.rebalance`: the
  hand-off when partitions move;
* :mod:`monitor.daemon.checkpointing`: capture at a batch boundary, durable write, restore;
* :mod:`monitor.daemon.refresh`: the intrinsic metrics of every window, published as one snapshot;
* :mod:`monitor.daemon.jobs`: the scheduler that runs refresh, checkpoint and component jobs;
* :mod:`monitor.daemon.export`: scrape-time families, reading :class:`~monitor.daemon.status.DaemonStatus`;
* :mod:`monitor.daemon.lifecycle`: signals, exception-safe start-up, bounded shutdown;
* the roles: :class:`Monitor` is the single daemon, and its injection points (the source wrapper,
  the partition hand-off, the component factories, extra collectors, the restore hooks) are what the
  replica role (:class:`monitor.scaleout.replica.Replica`) overrides; the reducer
  (:class:`monitor.scaleout.reducer.Reducer`) shares :class:`Daemon`'s lifecycle. ``cli/main.py``
  picks the role by name (``ROLES``), so nothing here names one.

Exactly-once state (docs/operations.md): a checkpoint holds all state and the offsets it
reflects; with checkpointing on, only offsets in a durable checkpoint are committed, so the
group's committed offset is never ahead of what a restart can restore. On assignment each
partition resumes at max(checkpoint offset + 1, committed offset).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from monitor.blocking import BlockingCall
from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.daemon import failpoints
from monitor.daemon.checkpointing import Checkpointer, checkpoint_interval, checkpointing_enabled
from monitor.daemon.counters import InternalErrors
from monitor.daemon.export import ComponentCollector, CoreCollector, OperationsCollector
from monitor.daemon.features import ComponentFactory, default_component_factories
from monitor.daemon.ingest import IngestPipeline
from monitor.daemon.jobs import JobRunner
from monitor.daemon.lifecycle import (
    ShutdownWatchdog,
    StartInterrupted,
    StartUp,
    StopRequest,
    capture_signals,
)
from monitor.daemon.offsets import OffsetTracker
from monitor.daemon.rebalance import PartitionHandoff
from monitor.daemon.refresh import Published, Refresher
from monitor.daemon.status import DaemonStatus
from monitor.decoding.decoder import Decoder
from monitor.errors import ConfigError
from monitor.server.exporter import HttpServer
from monitor.server.http_server import LOOP_FAILED_EXIT_STATUS
from monitor.server.settings import http_limits, http_security
from monitor.sources import build_source
from monitor.sources.base import PartitionListener, Source
from monitor.state.registry import StateRegistry

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from monitor.config import Settings
    from monitor.daemon.checkpointing import CheckpointObserver

logger = logging.getLogger(__name__)

# /readyz fails once the refresh (or a checkpoint) is older than this many periods of its job, and
# at least STALE_MIN_SECONDS past one period: a slow run or two is jitter, many missed ones are not.
STALE_PERIODS = 4
STALE_MIN_SECONDS = 60.0


def stale_after(period: float) -> float:
    """Seconds after which the output of a job run every ``period`` seconds is called stale."""
    return max(STALE_PERIODS * period, period + STALE_MIN_SECONDS)


def daemon_metrics_registry() -> CollectorRegistry:
    """A fresh registry with what every exporter shows (process_resident_memory_bytes, python_info,
    GC): prometheus-client puts those only on its global default registry."""
    registry = CollectorRegistry(auto_describe=False)
    for standard in (ProcessCollector, PlatformCollector, GCCollector):
        standard(registry=registry)
    return registry


class Daemon:
    """The lifecycle every role shares: signals first, start, wait for a stop request, stop once."""

    settings: Settings
    components: list[Component]
    errors: InternalErrors
    http: HttpServer
    jobs: JobRunner
    checkpointer: Checkpointer | None
    refresher: Refresher
    status: DaemonStatus
    computes_windows = True  # schedules the refresh of window metrics
    serves_port_while_building = False  # takes ``early_port`` and ``stop_request`` (cli/main.py)
    exit_status = 0  # what ``serve`` returns: non-zero once a part the process cannot do without failed

    def __init__(self, stop_request: StopRequest | None = None) -> None:
        self.stop_request = stop_request or StopRequest()
        self._startup: StartUp | None = None
        self._started = False
        self._started_at = 0.0  # unix time start() completed
        self._stopped = False
        self._stop_lock = threading.Lock()

    def serve(self, stop_after: float | None = None, on_started: Callable[[], None] | None = None) -> int:
        """The whole life of the daemon: signals first, start, wait for a stop request, stop; the exit status.

        A stop request in any phase, start-up included, ends the process within the shutdown
        bound (``shutdown_timeout_seconds`` + 1.5 s), with status 0 (:class:`ShutdownWatchdog`), or
        :data:`LOOP_FAILED_EXIT_STATUS` after :meth:`fail`."""
        self.http.server.on_failure = self.fail  # every role's port: exit non-zero if its I/O loop stops
        with capture_signals(self.stop_request, pipe=True) as signals:
            watchdog = ShutdownWatchdog(self.stop_request, self.settings.shutdown_timeout_seconds + 1.5,
                                        exit_status=lambda: self.exit_status, signals=signals).start()
            try:
                self.start()
            except StartInterrupted:
                pass  # logged by StartUp; stop() below releases what had started
            else:
                if on_started is not None:
                    on_started()
                if not self.stop_request.wait(timeout=stop_after):
                    watchdog.retire()  # served out: the stop below is ours, the process is not the watchdog's to end
            self.stop()
            watchdog.finished()
        return self.exit_status

    def fail(self, reason: str) -> None:
        """A part the process cannot do without stopped (the HTTP port's I/O loop): shut down as
        for a signal, then exit non-zero, so that the orchestrator restarts the process."""
        logger.critical("%s: shutting down, to exit with status %d", reason, LOOP_FAILED_EXIT_STATUS)
        self.exit_status = LOOP_FAILED_EXIT_STATUS
        self.stop_request.request()

    def start(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Stop intake and jobs (the role's own parts), within the configured bound."""

    def refresh(self) -> Published:
        """Recompute and publish every window's metrics now (the scheduled job)."""
        return self.refresher.refresh()

    @property
    def published(self) -> Published:
        return self.refresher.published

    def _intake(self) -> tuple[bool, bool, str]:
        """(threads alive, source connected, what to say when it is not)."""
        raise NotImplementedError

    def health(self) -> tuple[bool, str]:
        """Liveness: the process can do its work (intake threads alive). Broker outages do not count."""
        if not self._started or self.stop_request.requested:
            return True, "ok"  # starting (maybe still being built) or stopping
        alive, _, _ = self._intake()
        if not alive:
            return False, "ingest thread died"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: the source is connected, metrics have been computed at least once, and neither
        the refresh nor the checkpoints are stale (:func:`stale_after` their period); the body says which."""
        if not self._started:
            part = self._startup.current if self._startup is not None else None
            return False, f"starting: {part}" if part else "not started"
        _, up, why = self._intake()
        if not up:
            return False, why
        if self.computes_windows and self.refresher.published.computed_at is None:
            return False, "no metrics computed yet"
        stale = self._stale()
        if stale:
            return False, stale
        return True, "ready"

    def _mark_started(self) -> None:
        self._started_at = self.status.wall_clock()
        self._started = True

    def _stale(self) -> str:
        """Why the refresh or the checkpoints are stale; empty when neither is."""
        now = self.status.wall_clock()
        if self.computes_windows:
            period = self.settings.refresh_seconds
            age = now - (self.refresher.succeeded_at or self._started_at)
            if age > stale_after(period):
                return (f"refresh stale: the last refresh of the window metrics ended {age:.0f}s ago "
                        f"(refresh_seconds {period:g}, stale after {stale_after(period):.0f}s)")
        if self.checkpointer is not None:
            period = checkpoint_interval(self.settings)
            last = self.checkpointer.status().last_success
            age = now - max(last or 0.0, self._started_at)
            if age > stale_after(period):
                return (f"checkpoint stale: the last checkpoint was written {age:.0f}s ago "
                        f"(every {period:g}s, stale after {stale_after(period):.0f}s)")
        return ""

    def _schedule_jobs(self) -> None:
        if self.computes_windows:
            self.jobs.schedule(ScheduledJob("refresh", self.refresh, self.settings.refresh_seconds), run_soon=True)
        if self.checkpointer is not None:
            interval = checkpoint_interval(self.settings)
            self.jobs.schedule(ScheduledJob("checkpoint", self.checkpointer.checkpoint, interval))
        for component in self.components:
            for job in component.jobs():
                self.jobs.schedule(job)
        self.jobs.start()

    def stop(self) -> None:
        """Stop intake, save what must be saved, and shut down within the configured bound."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self.stop_request.request()
        self._shutdown()
        for component in self.components:
            with self.errors.guard(f"close:{component.name}"):
                component.close()
        self.http.stop()
        logger.info("embedding-monitor stopped")

    @property
    def stopping(self) -> bool:
        return self.stop_request.requested


class Monitor(Daemon):
    """Wires the daemon's parts together and runs their lifecycle: the single daemon (``scale_out.role:
    single``). A role built on it overrides the injection points below (``_source`` ... ``_after_restore``)."""

    role = "single"
    serves_port_while_building = True

    def __init__(
        self,
        settings: Settings,
        source: Source | None = None,
        clock: Callable[[], float] = time.time,
        component_factories: list[ComponentFactory] | None = None,
        *,
        early_port: bool = False,
        stop_request: StopRequest | None = None,
    ):
        """``early_port`` (the CLI): bind and serve the HTTP port as soon as it is built, before the
        components (whose imports take a second or more), so that ``/healthz`` answers within about
        a second of the process's start; ``stop_request``: one the caller's signal handlers already set."""
        super().__init__(stop_request)
        self.settings = settings
        self.clock = clock
        self._port_open = early_port
        if settings.scale_out.role != self.role:
            raise ConfigError(f"scale_out.role {settings.scale_out.role} is not built by {type(self).__name__}: "
                              "cli/main.py's ROLES names the class of each role (monitor.cli.main.role_class)")
        self.registry = StateRegistry(settings)
        self.decoder = Decoder(
            settings.limits,
            default_stream=default_stream(settings),
            declared_dims={name: m.dim for name, m in settings.models.items() if m.dim},
            admit=self.registry.admit,
            admit_model=self.registry.admit_model,
        )
        self.metrics_registry = daemon_metrics_registry()
        self.errors = InternalErrors()
        self.offsets = OffsetTracker(durable_commits=checkpointing_enabled(settings))
        self.refresher = Refresher(settings, self.registry, self.errors, self.metrics_registry, clock)
        self.jobs = JobRunner(self.metrics_registry)
        self.http = HttpServer(
            self.metrics_registry,
            settings.http.host,
            settings.http.port,
            health=self.health,
            readiness=self.readiness,
            **http_security(settings.http),
            **http_limits(settings.http),
        )
        self.http.server.on_failure = self.fail  # from the start: the port may open before serve()
        if early_port:
            self.http.start()
        self.source = self._source(settings, source)
        self.context = MonitorContext(
            settings=settings,
            registry=self.registry,
            clock=clock,
            state_dir=settings.state_dir,
            latest_windows=lambda: self.refresher.published.windows,
            add_route=self.http.add_route,
        )
        if component_factories is None:
            component_factories = self._component_factories(settings)
        self.components: list[Component] = [factory(self.context) for factory in component_factories]
        self.pipeline = IngestPipeline(
            settings, self.source, self.decoder, self.registry, self.components, self.offsets, self.errors, clock
        )
        self.checkpointer = (
            Checkpointer(
                settings, self.source, self.registry, self.decoder, self.pipeline, self.components, self.offsets,
                self.errors, self.metrics_registry, observer=self._checkpoint_observer(),
            )
            if checkpointing_enabled(settings)
            else None
        )
        self.source.set_listener(self._handoff())
        self.status = DaemonStatus(
            source=self.source,
            registry=self.registry,
            refresher=self.refresher,
            pipeline=self.pipeline,
            jobs=self.jobs,
            errors=self.errors,
            checkpointer=self.checkpointer,
            http=self.http,
            started_at=time.time(),
            wall_clock=time.time,
            rejected_files=self.context.rejected_files,
            computes_windows=self.computes_windows,
        )
        self.metrics_registry.register(CoreCollector(self.status))
        self.metrics_registry.register(ComponentCollector(self.components, self.errors))
        self.metrics_registry.register(OperationsCollector(self.status))
        for collector in self._collectors():
            self.metrics_registry.register(collector)

    # ------------------------------------------------------------------ injection points (the roles')
    def _source(self, settings: Settings, source: Source | None) -> Source:
        """The source ingest polls: ``source`` (a test's), or the one the settings ask for."""
        return source or build_source(settings)

    def _component_factories(self, settings: Settings) -> list[ComponentFactory]:
        """The components to build when the caller names none: the features the settings turn on."""
        return default_component_factories(settings)

    def _checkpoint_observer(self) -> CheckpointObserver | None:
        """Told of each checkpoint written (a replica publishes it)."""
        return None

    def _handoff(self) -> PartitionListener:
        """What runs when the source's partitions move (checkpoint, then commit, on revocation)."""
        return PartitionHandoff(self.pipeline, self.offsets, self.checkpointer)

    def _collectors(self) -> list[Collector]:
        """Collectors beyond the daemon's own and its components'."""
        return []

    def _before_restore(self) -> None:
        """Runs before the checkpoint restore, in the restore's thread."""

    def _after_restore(self) -> None:
        """Runs after the checkpoint restore, in the restore's thread."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the HTTP port, restore, then start source, scheduler and ingest; on failure undo and raise.

        The port comes first: ``/healthz`` (what a sidecar's probes may ask) answers while a large
        checkpoint is restored and while no broker answers; ``/readyz`` says what is still starting,
        then whether the source is connected (docs/deployment.md, "Probes"). The source connects in
        the background (kafka-python's bootstrap blocks for up to 30 s), and a stop request during
        the restore abandons it (:class:`~monitor.daemon.lifecycle.StartInterrupted`)."""
        self._startup = startup = StartUp(self.stop_request)
        with startup:
            startup.start("state directory", lambda: self.settings.state_dir.mkdir(parents=True, exist_ok=True))
            startup.start("http", self.http.start if not self._port_open else lambda: None, self.http.stop)
            if self.checkpointer is not None:
                startup.start("checkpoint restore", self._restore, background=True)
            startup.start("source", self.source.start, self.source.close)
            startup.start("scheduler", self._schedule_jobs, self.jobs.shutdown)
            startup.start(
                "ingest",
                lambda: self.pipeline.start(on_intake_end=self._final_checkpoint),
                lambda: self.pipeline.stop(self.settings.shutdown_timeout_seconds),
            )
        self._mark_started()
        logger.info(
            "embedding-monitor serving http://%s:%d/metrics, source=%s, state in %s",
            self.settings.http.host, self.http.port, self.source.name, self.settings.state_dir,
        )

    def _shutdown(self) -> None:
        """Stop intake, apply what was polled, checkpoint and commit."""
        if self._started:
            if not self.pipeline.stop(self.settings.shutdown_timeout_seconds):
                timeout = self.settings.shutdown_timeout_seconds
                logger.warning("ingest did not stop within %.1fs; exiting anyway", timeout)
            self.jobs.shutdown()

    def _restore(self) -> None:
        assert self.checkpointer is not None
        failpoints.reach("checkpoint-restore")  # tests: a restore as slow as a huge state makes it
        self._before_restore()
        self.checkpointer.restore()
        self._after_restore()

    def _final_checkpoint(self) -> None:
        """The shutdown checkpoint, waited for at most half the shutdown bound: one already being
        written (a slow disk) is waited for first, and a write that takes longer is abandoned (the
        last complete checkpoint stays, and only its offsets are committed)."""
        if self.checkpointer is None:
            return
        checkpointer, bound = self.checkpointer, self.settings.shutdown_timeout_seconds / 2
        if not BlockingCall("embmon-final-checkpoint", lambda: checkpointer.checkpoint(reason="shutdown")).wait(bound):
            logger.warning("the shutdown checkpoint did not finish within %.1fs: abandoning it; a restart resumes "
                           "from the last complete checkpoint", bound)

    def _intake(self) -> tuple[bool, bool, str]:
        return self.pipeline.alive, self.source.up, f"source {self.source.name} is not connected"


def default_stream(settings: Settings) -> str:
    """The stream of records that name none: the source's own default."""
    if settings.source == "file":
        return settings.file.stream
    if settings.source == "synthetic":
        return settings.synthetic.stream
    return settings.kafka.default_stream
