"""The reducer role: a daemon that merges the replicas' publications and exports the global gauges.

Wiring (the counterpart of :class:`monitor.daemon.service.Monitor` for ``scale_out.role: reducer``):

* :class:`~monitor.scaleout.intake.PartialsReader` reads the partials topic (and the interactions
  topic) by assignment, into the :class:`~monitor.scaleout.table.MergeTable` (and the probes);
* the refresh job computes the intrinsic metrics of the merged windows
  (:class:`~monitor.daemon.refresh.Refresher`, reading the table as it reads a replica's registry);
* the components run on the merged windows: drift test cycles against pinned, captured, lagged or
  first-window references, and the retrieval probes, fed the interactions this reducer reads.
  What needs the record stream in order runs differently: the online change detectors watch the
  merged per-sub-window series (:mod:`monitor.scaleout.detectors`), the accumulating detector bets on
  the merged closed sub-windows' samples (:mod:`monitor.scaleout.evidence`), the canaries are compared with
  this reducer's pins from the arrivals replicas forward (:mod:`monitor.scaleout.canaries`), and a
  first-records reference becomes the first merged window holding ``drift.reference.records``
  records (docs/deployment.md, "What the reducer cannot do");
* checkpoints (:class:`~monitor.daemon.checkpointing.Checkpointer`) hold the table, the components' state
  and the reader's positions, taken between two polls, so a restart resumes exactly once;
* the HTTP port exports what a single daemon exports, minus the ingest counters of embeddings
  (each replica exports its own), plus the reducer's view of the replicas. In a group of reducers
  (``scale_out.reducer_group``) only the streams of its partitions, and the model-level gauges of
  the models whose first stream (by name) is one of them (:class:`~monitor.scaleout.export.Ownership`);
  every reducer reads all interactions, so the probes of a model that moves here are warm.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client.registry import Collector

from monitor.component import Component, MonitorContext
from monitor.daemon.checkpointing import Checkpointer
from monitor.daemon.counters import InternalErrors
from monitor.daemon.export import ComponentCollector, CoreCollector, OperationsCollector
from monitor.daemon.features import ComponentFactory
from monitor.daemon.jobs import JobRunner
from monitor.daemon.lifecycle import StartUp, StopRequest
from monitor.daemon.refresh import Published, Refresher
from monitor.daemon.service import Daemon, daemon_metrics_registry
from monitor.daemon.status import DaemonStatus, StreamCounts
from monitor.decoding.decoder import Decoder
from monitor.errors import ConfigError
from monitor.scaleout.canaries import ReducerCanaries, for_reducer
from monitor.scaleout.detectors import SubwindowDetectors, subwindow_detectors
from monitor.scaleout.evidence import SubwindowEvidence, subwindow_evidence
from monitor.scaleout.export import OwnedOnly, Ownership, ReducerCollector, SigningCollector, probe_home
from monitor.scaleout.intake import PartialsReader
from monitor.scaleout.signing import warn_if_unsigned
from monitor.scaleout.table import MergeTable
from monitor.server.exporter import HttpServer
from monitor.server.settings import http_limits, http_security

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.sources.kafka.clients import Consumer

logger = logging.getLogger(__name__)


def reducer_settings(settings: Settings) -> Settings:
    """The settings the reducer runs with: online drift detectors off (they need the record stream)."""
    if settings.source != "kafka":
        raise ConfigError(f"scale_out.role reducer reads Kafka, not source {settings.source}")
    if settings.scale_out.partials_topic in (settings.kafka.embeddings_topic, settings.kafka.interactions_topic):
        raise ConfigError("scale_out.partials_topic must differ from the embeddings and interactions topics")
    if settings.scale_out.reducer_group == settings.kafka.group_id:
        raise ConfigError("scale_out.reducer_group must differ from kafka.group_id (the replicas' group)")
    online = settings.drift.online.model_copy(update={"enabled": False})
    return settings.model_copy(update={"drift": settings.drift.model_copy(update={"online": online})})


class ReducerStatus(DaemonStatus):
    """The daemon status collectors read; a reducer ingests no embeddings, so it counts none."""

    def streams(self) -> list[StreamCounts]:
        return []

    def source_error_counts(self) -> dict[str, int]:
        """None: the partials intake is the reducer's own topic, not a record source of producers'."""
        return {}

    def source_offset_resets(self) -> dict[str, int]:
        return {}

    def source_progress(self) -> dict[str, float] | None:
        return None


class Reducer(Daemon):
    """Merged windows of every replica, their metrics, drift and probes: the global gauges."""

    checkpointer: Checkpointer  # always one (a replica's may be off)

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        component_factories: list[ComponentFactory] | None = None,
        consumer_factory: Callable[[], Consumer] | None = None,
        *,
        stop_request: StopRequest | None = None,
    ):
        """``stop_request``: one the caller's signal handlers already set (the CLI's, while this is built)."""
        super().__init__(stop_request)
        online = settings.drift.online  # the drift component's are off here: the reducer runs its own
        self.settings = settings = reducer_settings(settings)
        self.clock = clock
        self.table = MergeTable(settings, clock)
        self.metrics_registry = daemon_metrics_registry()
        self.errors = InternalErrors()
        # the table reads like a registry: snapshot_windows(now)
        self.refresher = Refresher(settings, self.table, self.errors, self.metrics_registry, clock)  # type: ignore[arg-type]
        self.jobs = JobRunner(self.metrics_registry)
        self.http = HttpServer(self.metrics_registry, settings.http.host, settings.http.port, health=self.health,
                               readiness=self.readiness, **http_security(settings.http), **http_limits(settings.http))
        self.context = MonitorContext(
            settings=settings, registry=self.table, clock=clock, state_dir=settings.state_dir,  # type: ignore[arg-type]
            latest_windows=lambda: self.refresher.published.windows, add_route=self.http.add_route,
        )
        if component_factories is None:  # canaries: compared here, with the arrivals the replicas publish
            component_factories = for_reducer(settings)
        self.components: list[Component] = [factory(self.context) for factory in component_factories]
        detectors = subwindow_detectors(self.context, self.components, online, settings.scale_out.detectors)
        if detectors is not None:
            self.components.append(detectors)
        evidence = subwindow_evidence(self.context, self.components)
        if evidence is not None:
            self.components.append(evidence)
        self.decoder = Decoder(
            settings.limits, default_stream=settings.kafka.default_stream,
            declared_dims={name: m.dim for name, m in settings.models.items() if m.dim},
            admit_model=_ModelBudget(settings.limits.max_models),
        )
        self.intake = PartialsReader(settings, self.table, self.decoder, self.components, self.errors, clock,
                                     consumer_factory)
        self.intake.refreshed_at = lambda: self.refresher.published.computed_at  # a caught-up partition waits for it
        for component in self.components:  # canaries and detectors feed from the table between two polls
            if isinstance(component, (ReducerCanaries, SubwindowDetectors, SubwindowEvidence)):
                component.boundary = self.intake.at_batch_boundary
        # the intake is an Intake (daemon/intake.py) for the checkpointer and the status; as the source
        # and the registry, it and the table stand in for what they hold (names, topic ids, streams)
        self.checkpointer = Checkpointer(
            settings, self.intake, self.table,  # type: ignore[arg-type]
            self.decoder, self.intake, self.components,
            self.intake.offsets, self.errors, self.metrics_registry,
        )
        self.status = ReducerStatus(
            source=self.intake, registry=self.table,  # type: ignore[arg-type]
            refresher=self.refresher, pipeline=self.intake,
            jobs=self.jobs, errors=self.errors, checkpointer=self.checkpointer, http=self.http,
            started_at=time.time(), wall_clock=time.time, rejected_files=self.context.rejected_files,
        )
        # in a group, every global gauge is exported by the reducer that owns its stream (or model)
        ownership = Ownership(self.table, self.intake.owned_partitions, self.intake.read_partitions,
                              {spec.name: probe_home(spec) for spec in settings.probes.all_probes()})
        core: Collector = CoreCollector(self.status)
        components: Collector = ComponentCollector(self.components, self.errors)
        if settings.scale_out.reducer_group is not None:
            core, components = OwnedOnly(core, ownership), OwnedOnly(components, ownership)
            from monitor.retrieval.probes.component import ProbeComponent
            from monitor.serving.component import ServingComponent

            for component in self.components:
                if isinstance(component, ProbeComponent):  # a probe runs where its window is
                    component.runs_here = ownership.runs_probe
                elif isinstance(component, ServingComponent):  # an endpoint: by the model's exporter
                    component.runs_here = ownership.runs_model
        warn_if_unsigned(settings.scale_out)
        for collector in (core, components, OperationsCollector(self.status),
                          SigningCollector(settings.scale_out.partials_key_file is not None),
                          ReducerCollector(self.table, time.time, ownership, lambda: self.intake.rebalances)):
            self.metrics_registry.register(collector)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        with StartUp() as startup:
            startup.start("state directory", lambda: self.settings.state_dir.mkdir(parents=True, exist_ok=True))
            startup.start("checkpoint restore", self.checkpointer.restore)
            startup.start("http", self.http.start, self.http.stop)
            startup.start("scheduler", self._schedule_jobs, self.jobs.shutdown)
            startup.start("intake", self.intake.start, lambda: self.intake.stop(self.settings.shutdown_timeout_seconds))
        self._mark_started()
        logger.info("embedding-monitor reducer serving http://%s:%d/metrics, merging %s, state in %s",
                    self.settings.http.host, self.http.port, self.settings.scale_out.partials_topic,
                    self.settings.state_dir)

    def _shutdown(self) -> None:
        if self._started:
            if not self.intake.stop(self.settings.shutdown_timeout_seconds / 2):
                logger.warning("the reducer's intake did not stop in time")
            self.checkpointer.checkpoint(reason="shutdown")
            self.jobs.shutdown()

    # ------------------------------------------------------------------ entry points
    def refresh(self) -> Published:
        """Merge, compute and publish every stream's window metrics; then first-window references."""
        published = super().refresh()
        self._first_window_references(published)
        return published

    def _first_window_references(self, published: Published) -> None:
        """A first-records reference needs the records in order, which only replicas see: the reducer
        pins instead the first merged window that holds ``drift.reference.records`` records."""
        if not self.settings.drift.enabled:
            return
        from monitor.drift.component import DriftComponent

        drift = next((c for c in self.components if isinstance(c, DriftComponent)), None)
        if drift is None or drift.reference_settings.fallback_mode != "first_records":
            return
        wanted = self.settings.drift.reference.records
        for stream in self.table:
            window = published.windows.get((stream.model, stream.stream))
            if window is None or window.records < wanted or drift.reference(stream.model, stream.stream) is not None:
                continue
            _pin, problem = drift.pins.match(stream.model, stream.stream, window.dim)
            if problem is None:
                with self.errors.guard("first_window_reference"):
                    drift.capture_current([stream])

    def _intake(self) -> tuple[bool, bool, str]:
        return self.intake.alive, self.intake.up, f"not connected to {self.settings.scale_out.partials_topic}"


class _ModelBudget:
    """The label budget for interaction events' models (a replica's is its state registry's)."""

    def __init__(self, max_models: int):
        self.max_models = max_models
        self.models: set[str] = set()

    def __call__(self, model: str) -> bool:
        if model in self.models:
            return True
        if len(self.models) >= self.max_models:
            return False
        self.models.add(model)
        return True
