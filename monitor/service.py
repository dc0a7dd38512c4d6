"""The daemon's lifecycle: start-up, the ingest loop, scheduled refreshes, checkpoints, shutdown.

Threads:
* ``embmon-poll`` polls the source, decodes, hands batches to the apply thread and commits the
  offsets the state reflects (kafka-python is not thread-safe, so polling and committing stay on
  one thread). When the apply queue is full it pauses the partitions and keeps polling, so the
  group never evicts it for not polling (backpressure: the lag grows, nothing is dropped);
* ``embmon-apply`` folds batches into the windows (BLAS releases the GIL, so this overlaps with
  polling and JSON parsing on a second core) and calls the components' cheap hooks. Between two
  batches it also captures checkpoints, so state and offsets always agree;
* the apscheduler pool runs the refresh, checkpoint and component jobs; the HTTP server has its own.

Exactly-once state (docs/operations.md): a checkpoint holds all state and the offsets it
reflects; with checkpointing on, only offsets in a durable checkpoint are committed, so the
group's committed offset is never ahead of what a restart can restore. On assignment each
partition resumes at max(checkpoint offset + 1, committed offset).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.util import undefined
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor import checkpoint as ckpt
from monitor.collector import MonitorCollector
from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.components import ComponentFactory, default_component_factories
from monitor.config import Settings
from monitor.decoding import Decoder, DecodeResult
from monitor.exporter import HttpServer
from monitor.logs import RateLimitedLog
from monitor.memory import release_free_memory
from monitor.quality.intrinsic import IntrinsicReport, report_from_snapshot
from monitor.sources import Source, SourceMessage, build_source
from monitor.security import read_token_file, server_ssl_context
from monitor.state.registry import StateRegistry, StreamKey
from monitor.state.window import WindowSnapshot

logger = logging.getLogger(__name__)

REFRESH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
APPLY_QUEUE_POLLS = 8  # polls buffered between the poll and apply threads: bounds memory
CHECKPOINT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OVERFLOW_STREAM = "_overflow"  # invalid-record label for stream names outside the label budget
HANDOFF_DRAIN_SECONDS = 30.0
Offsets = dict[tuple[str, int], int]


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


@dataclass
class _Capture:
    """A request for a consistent copy of the state, served by the apply thread between batches."""

    done: threading.Event = field(default_factory=threading.Event)
    claimed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: tuple[Any, list[Any], Offsets] | None = None
    error: BaseException | None = None

    def claim(self) -> bool:
        with self.lock:
            if self.claimed:
                return False
            self.claimed = True
            return True


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
        self._inflight = 0  # items queued or being applied
        self._inflight_cond = threading.Condition()
        self._backlog: list[_Applied] = []  # decoded polls waiting for room in the queue
        self._backlog_lock = threading.Lock()
        self._backpressure_seconds = 0.0
        self._paused_since: float | None = None
        self._commit_now = threading.Event()
        self._capture_req: _Capture | None = None
        self._capture_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._durable: Offsets = {}  # offsets reflected by the last checkpoint on disk
        self._checkpoint_stats: dict[str, float] = {}
        self._checkpoint_failures: Counter[str] = Counter()  # write failures by stage
        self._restore_failures: Counter[str] = Counter()  # by reason
        self.restored_from: str | None = None
        self.checkpoints = ckpt.CheckpointStore(settings.state_dir) if _checkpointing(settings) else None
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
            **_http_security(settings),
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
        self.checkpoint_duration = Histogram(
            "embmon_checkpoint_duration_seconds",
            "Wall time of one checkpoint: capture between batches, encode, write, fsync, rename.",
            buckets=CHECKPOINT_BUCKETS,
            registry=self.metrics_registry,
        )
        self.metrics_registry.register(_OperationsCollector(self))
        if hasattr(self.source, "on_revoked"):
            self.source.on_revoked = self._on_revoked  # type: ignore[attr-defined]
            self.source.on_assigned = self._on_assigned  # type: ignore[attr-defined]
            self.source.checkpoint_offsets = self._resume_offsets  # type: ignore[attr-defined]
            self.source.applied_offsets = self.applied_offsets  # type: ignore[attr-defined]
        self._started = False
        self.started_at = time.time()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start serving, scheduling and consuming. Returns once everything runs."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self.restore()
        self.source.start()
        self.http.start()
        jobs = [ScheduledJob("refresh", self.refresh, self.settings.refresh_seconds)]
        if self.checkpoints is not None:
            jobs.append(ScheduledJob("checkpoint", self.checkpoint, _checkpoint_interval(self.settings)))
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
                # None would add the job paused (APScheduler 3); undefined = first run after one interval
                next_run_time=_soon() if job.name == "refresh" else undefined,
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
                backlogged = self._flush_backlog(wait=min(timeout, 0.1))
                self._set_paused(backlogged)
                try:
                    messages = self.source.poll(min(timeout, 0.1) if backlogged else timeout)
                except Exception:  # noqa: BLE001 - never let a source bug end intake
                    self.count_internal_error("poll")
                    logger.exception("source poll failed")
                    time.sleep(min(timeout, 1.0))
                    continue
                if messages:
                    self._enqueue(self._decode(messages))
                if self._commit_now.is_set() or time.monotonic() - last_commit >= commit_every:
                    self._commit_now.clear()
                    self._commit()
                    last_commit = time.monotonic()
        finally:
            budget = self.settings.shutdown_timeout_seconds
            deadline = time.monotonic() + budget / 2
            while self._flush_backlog(wait=0.05) and time.monotonic() < deadline:
                pass
            with contextlib.suppress(queue.Full):  # tell the apply thread to finish what is queued
                self._queue.put(None, timeout=max(0.05, deadline - time.monotonic()))
            self._apply_thread.join(timeout=max(0.05, deadline - time.monotonic()))
            if self.checkpoints is not None and not self._apply_thread.is_alive():
                self.checkpoint(reason="shutdown")
            self._commit()
            with self._guard("close:source"):
                self.source.close()

    def _enqueue(self, item: _Applied) -> None:
        with self._backlog_lock:
            if not self._backlog:
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    pass
                else:
                    with self._inflight_cond:
                        self._inflight += 1
                    return
            self._backlog.append(item)

    def _flush_backlog(self, wait: float) -> bool:
        """Move backlogged polls into the queue; True while some remain (the queue is full)."""
        with self._backlog_lock:
            while self._backlog:
                try:
                    self._queue.put(self._backlog[0], timeout=wait)
                except queue.Full:
                    return True
                self._backlog.pop(0)
                with self._inflight_cond:
                    self._inflight += 1
            return False

    def _set_paused(self, paused: bool) -> None:
        pause, resume = getattr(self.source, "pause", None), getattr(self.source, "resume", None)
        now = time.monotonic()
        if paused and self._paused_since is None:
            self._paused_since = now
            if pause is not None:
                pause()
            self._log.warning("backpressure", "apply queue full: pausing fetches until it drains (lag will grow)")
        elif not paused and self._paused_since is not None:
            with self._counter_lock:
                self._backpressure_seconds += now - self._paused_since
            self._paused_since = None
            if resume is not None:
                resume()

    def backpressure_seconds(self) -> float:
        with self._counter_lock:
            total = self._backpressure_seconds
        since = self._paused_since
        return total + (time.monotonic() - since if since is not None else 0.0)

    def _drain(self, timeout: float) -> bool:
        """Wait until every polled record is applied (backlog and queue empty, nothing in flight)."""
        deadline = time.monotonic() + timeout
        while self._flush_backlog(wait=0.05):
            if time.monotonic() > deadline or not self._apply_thread.is_alive():
                return False
        with self._inflight_cond:
            while self._inflight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._apply_thread.is_alive():
                    return False
                self._inflight_cond.wait(min(remaining, 0.1))
        return True

    # ------------------------------------------------------------------ rebalances
    def _on_revoked(self, partitions: list[tuple[str, int]]) -> Offsets:
        """Hand-off (worker thread, during a rebalance): apply what was polled, checkpoint, and
        return the offsets to commit for ``partitions``, so the next owner starts right after."""
        if not self._drain(HANDOFF_DRAIN_SECONDS):
            logger.error("hand-off: queued records not applied within %.0fs", HANDOFF_DRAIN_SECONDS)
        if self.checkpoints is not None:
            if self.applied_offsets() != self._durable or self._checkpoint_stats.get("last_success") is None:
                self.checkpoint(reason="rebalance")
            source_offsets = dict(self._durable)
        else:
            source_offsets = self.applied_offsets()
        return {k: v for k, v in source_offsets.items() if k in set(partitions)}

    def _on_assigned(self, positions: dict[tuple[str, int], int]) -> None:
        """The consumer was sought to ``positions``: everything before them counts as accounted for."""
        with self._applied_lock:
            for key, position in positions.items():
                self._applied[key] = max(self._applied.get(key, -1), position - 1)
                self._durable[key] = max(self._durable.get(key, -1), position - 1)

    def _resume_offsets(self) -> Offsets:
        """Per partition, the last offset the state reflects (durable when checkpointing)."""
        return dict(self._durable) if self.checkpoints is not None else self.applied_offsets()

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
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                self._serve_capture()
                continue
            self._serve_capture()
            if item is None:
                return
            try:
                self._apply(item)
            finally:
                with self._inflight_cond:
                    self._inflight -= 1
                    self._inflight_cond.notify_all()
            self._serve_capture()

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
                bounded: Counter[tuple[str, str]] = Counter()
                for (stream, reason), count in result.rejected.items():
                    bounded[(self._bounded_stream(stream), reason)] += count
                with self._counter_lock:
                    self._invalid.update(bounded)
                for reason, detail in result.examples.items():
                    self._log.warning(f"invalid:{reason}", "skipping invalid record (%s): %s", reason, detail)
        if item.positions:
            with self._applied_lock:
                for key, offset in item.positions.items():
                    self._applied[key] = max(self._applied.get(key, -1), offset)

    def _bounded_stream(self, stream: str) -> str:
        """``stream`` when it is (or may become) a label of some model, else OVERFLOW_STREAM:
        rejected records must not let their stream names through the label budget."""
        if stream == self.decoder.default_stream or stream in self.registry.known_streams():
            return stream
        return OVERFLOW_STREAM

    def _commit(self) -> None:
        with self._applied_lock:
            source = self._durable if self.checkpoints is not None else self._applied
            pending = {k: v for k, v in source.items() if self._committed.get(k) != v}
        if pending:
            self.source.commit(pending)
            self._committed.update(pending)

    # ------------------------------------------------------------------ checkpoints
    def _serve_capture(self) -> None:
        """Apply thread, between two batches: fulfil a pending capture request."""
        req = self._capture_req
        if req is None or not req.claim():
            return
        try:
            req.result = self._capture_state()
        except BaseException as exc:  # noqa: BLE001 - handed to the requester
            req.error = exc
        finally:
            req.done.set()

    def _capture(self, timeout: float = 30.0) -> tuple[Any, list[Any], Offsets]:
        """A consistent (state, offsets) copy, taken between batches by the apply thread."""
        if threading.current_thread() is self._apply_thread or not self._apply_thread.is_alive():
            return self._capture_state()
        req = _Capture()
        with self._capture_lock:
            self._capture_req = req
            try:
                deadline = time.monotonic() + timeout
                while not req.done.wait(0.02):
                    if not self._apply_thread.is_alive() and req.claim():
                        req.result = self._capture_state()
                        req.done.set()
                    elif time.monotonic() > deadline:
                        raise TimeoutError("the apply thread did not reach a batch boundary in time")
            finally:
                self._capture_req = None
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _capture_state(self) -> tuple[Any, list[Any], Offsets]:
        """Everything a restart needs, flattened (arrays copied) so the live state can move on."""
        registry = self.registry.state_dict()
        components: dict[str, Any] = {}
        for component in self.components:
            with self._guard(f"checkpoint:{component.name}"):
                components[component.name] = component.state_dict()
        with self._counter_lock:
            counters = {
                "invalid": [[s, r, n] for (s, r), n in self._invalid.items()],
                "interactions": dict(self._interactions),
            }
        with self._applied_lock:
            offsets = dict(self._applied)
        state = {
            "created_at": time.time(),
            "source": self.source.name,
            "group_id": self.settings.kafka.group_id if self.settings.source == "kafka" else None,
            "offsets": [[t, p, o] for (t, p), o in sorted(offsets.items())],
            "streams": registry["streams"],
            "labels": registry["labels"],
            "dims": dict(self.decoder.dims),
            "counters": counters,
            "components": components,
        }
        arrays: list[Any] = []
        tree = ckpt.flatten(state, arrays)
        return tree, arrays, offsets

    def checkpoint(self, reason: str = "periodic") -> bool:
        """Write a checkpoint of the current state (the scheduled job; also on hand-off and shutdown)."""
        if self.checkpoints is None:
            return False
        with self._checkpoint_lock:
            started = time.perf_counter()
            try:
                tree, arrays, offsets = self._capture()
            except Exception:  # noqa: BLE001 - counted; the previous checkpoint stays valid
                self._checkpoint_failed("capture", reason)
                return False
            try:
                written = self.checkpoints.write(tree, arrays)
            except Exception:  # noqa: BLE001 - disk full, permissions: counted, never fatal
                self._checkpoint_failed("write", reason)
                return False
            elapsed = time.perf_counter() - started
            with self._applied_lock:
                for key, offset in offsets.items():
                    self._durable[key] = max(self._durable.get(key, -1), offset)
            self._checkpoint_stats = {
                "last_success": time.time(),
                "size_bytes": float(written.size_bytes),
                "last_duration": elapsed,
            }
        self.checkpoint_duration.observe(elapsed)
        self._commit_now.set()
        logger.debug("checkpoint (%s): %d bytes in %.3fs", reason, written.size_bytes, elapsed)
        return True

    def _checkpoint_failed(self, stage: str, reason: str) -> None:
        with self._counter_lock:
            self._checkpoint_failures[stage] += 1
        self._log.warning(f"checkpoint:{stage}", "checkpoint (%s) failed at %s; keeping the previous one", reason, stage)
        logger.debug("checkpoint failure", exc_info=True)

    def restore(self) -> bool:
        """Load the newest usable checkpoint into the (still empty) state. Never raises."""
        if self.checkpoints is None:
            return False
        try:
            path = self.checkpoints.load(self._restore_state, self._restore_failed)
        except Exception:  # noqa: BLE001 - never a crash loop: start empty instead
            self._restore_failed("unreadable", self.checkpoints.current, "unexpected error")
            logger.exception("checkpoint restore failed")
            return False
        if path is None:
            if self._restore_failures:
                logger.error("no usable checkpoint in %s: starting with empty state", self.settings.state_dir)
            return False
        self.restored_from = str(path)
        streams = len(self.registry)
        logger.info("restored state from %s (%d streams, offsets %s)", path, streams, sorted(self._durable.items()))
        return True

    def _restore_failed(self, reason: str, path: Any, message: str) -> None:
        with self._counter_lock:
            self._restore_failures[reason] += 1
        logger.error("checkpoint %s is unusable (%s): %s; trying the previous one", path, reason, message)

    def _restore_state(self, state: Any) -> None:
        """Rebuild everything from a decoded checkpoint; raises (changing nothing) if it does not fit."""
        if not isinstance(state, dict):
            raise ckpt.CheckpointError("invalid", "the state is not a mapping")
        if state.get("source") != self.source.name:
            raise ckpt.CheckpointError(
                "incompatible", f"written by source {state.get('source')!r}, running {self.source.name!r}"
            )
        if self.settings.source == "kafka" and state.get("group_id") != self.settings.kafka.group_id:
            raise ckpt.CheckpointError("incompatible", f"written for consumer group {state.get('group_id')!r}")
        declared = {name: m.dim for name, m in self.settings.models.items() if m.dim}
        dims = {str(k): int(v) for k, v in dict(state["dims"]).items()}
        for model, dim in declared.items():
            if model in dims and dims[model] != dim:
                raise ckpt.CheckpointError("incompatible", f"model {model} has dim {dims[model]}, configured {dim}")
        offsets = {(str(t), int(p)): int(o) for t, p, o in state["offsets"]}
        invalid = Counter({(str(s), str(r)): int(n) for s, r, n in state["counters"]["invalid"]})
        interactions = Counter({str(m): int(n) for m, n in dict(state["counters"]["interactions"]).items()})
        # Counters parsed; the registry validates every window before it installs any.
        try:
            self.registry.load_state_dict({"streams": state["streams"], "labels": state["labels"]})
        except ValueError as exc:
            raise ckpt.CheckpointError("incompatible", str(exc)) from None
        for model, dim in dims.items():
            self.decoder.dims.setdefault(model, dim)
        with self._counter_lock:
            self._invalid = invalid
            self._interactions = interactions
        with self._applied_lock:
            self._applied = dict(offsets)
            self._durable = dict(offsets)
        saved = dict(state.get("components") or {})
        for component in self.components:
            if component.name in saved:
                try:
                    component.load_state_dict(saved[component.name])
                except Exception:  # noqa: BLE001 - one component's state must not discard the rest
                    self._restore_failed("invalid", f"component {component.name}", "load_state_dict raised")
                    logger.debug("component restore failure", exc_info=True)

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
        release_free_memory()
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

    def checkpoint_status(self) -> dict[str, float]:
        return dict(self._checkpoint_stats)

    def checkpoint_failure_counts(self) -> dict[str, int]:
        with self._counter_lock:
            return dict(self._checkpoint_failures)

    def restore_failure_counts(self) -> dict[str, int]:
        with self._counter_lock:
            return dict(self._restore_failures)

    def queue_depth(self) -> int:
        with self._backlog_lock:
            backlog = len(self._backlog)
        return self._queue.qsize() + backlog

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


class _OperationsCollector(Collector):
    """Checkpoint, backpressure and access-control metrics (docs/metrics.md, "Operations")."""

    def __init__(self, monitor: Monitor):
        self._monitor = monitor

    def collect(self) -> Iterable[Metric]:
        m = self._monitor
        if m.checkpoints is not None:
            status = m.checkpoint_status()
            last = status.get("last_success")
            when = GaugeMetricFamily(
                "embmon_checkpoint_last_success_timestamp_seconds", "When the last checkpoint was written."
            )
            age = GaugeMetricFamily(
                "embmon_checkpoint_age_seconds", "Seconds since the last checkpoint was written (since start-up if none)."
            )
            size = GaugeMetricFamily("embmon_checkpoint_size_bytes", "Size of the last checkpoint file.")
            if last is not None:
                when.add_metric([], last)
                age.add_metric([], max(0.0, time.time() - last))
                size.add_metric([], status["size_bytes"])
            else:
                age.add_metric([], max(0.0, time.time() - m.started_at))
            yield when
            yield age
            yield size
            failures = CounterMetricFamily(
                "embmon_checkpoint_write_failures", "Checkpoints that could not be taken or written, by stage.",
                labels=["stage"],
            )
            counts = m.checkpoint_failure_counts()
            for stage in ("capture", "write"):
                failures.add_metric([stage], float(counts.get(stage, 0)))
            yield failures
            restore = CounterMetricFamily(
                "embmon_checkpoint_restore_failures",
                "Checkpoint files rejected at start-up (the previous one, or empty state, was used), by reason.",
                labels=["reason"],
            )
            counts = m.restore_failure_counts()
            for reason in ckpt.RESTORE_FAILURE_REASONS:
                restore.add_metric([reason], float(counts.get(reason, 0)))
            yield restore
        depth = GaugeMetricFamily(
            "embmon_ingest_queue_polls", "Decoded polls waiting to be applied (queue plus backlog)."
        )
        depth.add_metric([], float(m.queue_depth()))
        yield depth
        paused = GaugeMetricFamily(
            "embmon_ingest_paused", "1 while fetching is paused because the apply queue is full (backpressure)."
        )
        paused.add_metric([], 1.0 if m._paused_since is not None else 0.0)
        yield paused
        pressure = CounterMetricFamily(
            "embmon_ingest_backpressure_seconds", "Time fetching was paused because applying could not keep up."
        )
        pressure.add_metric([], m.backpressure_seconds())
        yield pressure
        lag_updated = getattr(m.source, "lag_updated", None)
        if lag_updated is not None:
            fresh = GaugeMetricFamily(
                "embmon_consumer_lag_timestamp_seconds", "When embmon_consumer_lag_records was last measured."
            )
            fresh.add_metric([], lag_updated)
            yield fresh
        auth = CounterMetricFamily(
            "embmon_http_auth_failures", "HTTP requests rejected for missing or wrong credentials, by endpoint kind.",
            labels=["endpoint"],
        )
        counts = m.http.auth_failure_counts()
        for kind in ("metrics", "admin", "other"):
            auth.add_metric([kind], float(counts.get(kind, 0)))
        yield auth


def _checkpointing(settings: Settings) -> bool:
    enabled = settings.checkpoint.enabled
    return settings.source == "kafka" if enabled is None else bool(enabled)


def _checkpoint_interval(settings: Settings) -> float:
    """Commits wait for checkpoints, so a shorter commit interval also checkpoints more often."""
    interval = settings.checkpoint.interval_seconds
    if settings.source == "kafka":
        interval = min(interval, settings.kafka.commit_interval_seconds)
    return interval


def _http_security(settings: Settings) -> dict[str, Any]:
    http = settings.http
    token: str | None = None
    if http.admin_token is not None:
        token = http.admin_token.get_secret_value()
    elif http.admin_token_file is not None:
        token = read_token_file(http.admin_token_file)
    context = None
    if http.tls_certfile is not None and http.tls_keyfile is not None:
        context = server_ssl_context(http.tls_certfile, http.tls_keyfile, http.tls_client_cafile)
    return {
        "ssl_context": context,
        "basic_auth_users": {u: h.get_secret_value() for u, h in http.basic_auth_users.items()} or None,
        "admin_token": token,
    }


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
