"""Capture the daemon's whole state at a batch boundary, write it durably, and restore it at start.

A checkpoint (file format: :mod:`monitor.storage.checkpoint_format`) holds every stream's window, the counters,
each component's state and the source offsets all of that reflects, taken together on the apply
thread between two batches, so they always agree. Once a checkpoint is on disk its offsets become
durable and may be committed (:mod:`monitor.daemon.offsets`). Restore rebuilds everything from the
newest usable file, or changes nothing; a bad file is counted by reason, moved aside, and the
previous one (or empty state) is used: a checkpoint can never put the daemon in a crash loop.
Values are checked before anything is installed (monitor/state/checks.py): counters non-negative,
sums finite, every array of its stream's dimension and every stream of its model's, offsets of
real partitions. Whether an offset lies within its partition's log is for the source to tell once
it is assigned; here only what a checkpoint alone can show is checked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from monitor import catalog
from monitor.component import Component
from monitor.daemon import failpoints
from monitor.daemon.counters import InternalErrors
from monitor.daemon.offsets import OffsetTracker
from monitor.decoding.decoder import Decoder
from monitor.logs import RateLimitedLog
from monitor.sources.base import Offsets, Source
from monitor.state import checks
from monitor.state.registry import StateRegistry
from monitor.storage import checkpoint_format as ckpt
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.daemon.intake import Intake

logger = logging.getLogger(__name__)

CHECKPOINT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WRITE_STAGES = ("capture", "write")  # the `stage` label of embmon_checkpoint_write_failures_total


def checkpointing_enabled(settings: Settings) -> bool:
    """On by default for Kafka (offsets to protect), off for file and synthetic replays."""
    enabled = settings.checkpoint.enabled
    return settings.source == "kafka" if enabled is None else bool(enabled)


def checkpoint_interval(settings: Settings) -> float:
    """Commits wait for checkpoints, so a shorter commit interval also checkpoints more often."""
    interval = settings.checkpoint.interval_seconds
    if settings.source == "kafka":
        interval = min(interval, settings.kafka.commit_interval_seconds)
    return interval


class CheckpointObserver(Protocol):
    """What a scaled-out replica adds to checkpoints (monitor/scaleout/replica.py)."""

    def tag(self) -> dict[str, Any]:
        """Fields stored as ``scale_out`` in the checkpoint, taken with the state."""

    def check(self, state: Any) -> None:
        """Raise :class:`~monitor.storage.checkpoint_format.CheckpointError` to refuse restoring ``state``."""

    def written(self, state: dict[str, Any], offsets: Offsets) -> None:
        """The checkpoint of ``state`` is on disk (called in checkpoint order)."""

    def after_write(self) -> None:
        """Called once the checkpoint is done, outside its lock (slow work such as sending)."""


@dataclass(frozen=True)
class CheckpointStatus:
    """The last successful checkpoint, for the operations metrics."""

    last_success: float | None  # unix time
    size_bytes: float | None
    write_failures: dict[str, int]  # by stage
    restore_failures: dict[str, int]  # by reason


class Checkpointer:
    """Takes, writes and restores checkpoints of one daemon's state."""

    def __init__(
        self,
        settings: Settings,
        source: Source,
        registry: StateRegistry,
        decoder: Decoder,
        pipeline: Intake,
        components: Sequence[Component],
        offsets: OffsetTracker,
        errors: InternalErrors,
        metrics: CollectorRegistry,
        observer: CheckpointObserver | None = None,
    ):
        self.settings = settings
        self.observer = observer
        self.source = source
        self.registry = registry
        self.decoder = decoder
        self.pipeline = pipeline
        self.components = components
        self.offsets = offsets
        self.errors = errors
        self.store = ckpt.CheckpointStore(settings.state_dir, settings.checkpoint.max_bytes)
        self.restored_from: str | None = None
        self.write_failures: Tally[str] = Tally()
        self.restore_failures: Tally[str] = Tally()
        self.duration = catalog.histogram("embmon_checkpoint_duration_seconds", metrics, CHECKPOINT_BUCKETS)
        self._last_success: float | None = None
        self._size_bytes: float | None = None
        self._lock = threading.Lock()  # one checkpoint at a time
        self._log = RateLimitedLog(logger)

    def status(self) -> CheckpointStatus:
        return CheckpointStatus(
            self._last_success, self._size_bytes, self.write_failures.snapshot(), self.restore_failures.snapshot()
        )

    # ------------------------------------------------------------------ writing
    def checkpoint(self, reason: str = "periodic") -> bool:
        """Capture and write the state (the scheduled job; also on hand-off and shutdown). True if written."""
        with self._lock:
            started = time.perf_counter()
            try:
                state, tree, arrays, (offsets, generation) = self.pipeline.at_batch_boundary(self._capture)
            except Exception:  # noqa: BLE001 - counted; the previous checkpoint stays valid
                self._failed("capture", reason)
                return False
            try:
                failpoints.reach("checkpoint-write")  # tests: a write as slow as a stalled disk makes it
                written = self.store.write(tree, arrays)
            except Exception:  # noqa: BLE001 - disk full, permissions: counted, never fatal
                self._failed("write", reason)
                return False
            elapsed = time.perf_counter() - started
            # a partition reset while this was written (a recreated topic): its captured offset is not
            # in its log any more, so neither the durable mark nor a replica's manifest may carry it
            offsets = self.offsets.still_current(offsets, generation)
            if self.observer is not None and state is not None:
                with self.errors.guard("checkpoint:observer"):
                    self.observer.written(state, offsets)
            self.offsets.mark_durable(offsets)
            self._last_success = time.time()
            self._size_bytes = float(written.size_bytes)
        self.duration.observe(elapsed)
        if self.observer is not None:
            with self.errors.guard("checkpoint:observer"):
                self.observer.after_write()
        self.pipeline.commit_soon()
        logger.debug("checkpoint (%s): %d bytes in %.3fs", reason, written.size_bytes, elapsed)
        return True

    def ensure_current(self, reason: str) -> None:
        """Checkpoint unless the newest one already holds everything applied."""
        if not self.offsets.all_durable() or self._last_success is None:
            self.checkpoint(reason=reason)

    def _failed(self, stage: str, reason: str) -> None:
        self.write_failures.add(stage)
        self._log.warning(
            f"checkpoint:{stage}", "checkpoint (%s) failed at %s; keeping the previous one", reason, stage
        )
        logger.debug("checkpoint failure", exc_info=True)

    def _capture(self) -> tuple[dict[str, Any] | None, Any, list[Any], tuple[Offsets, int]]:
        """Everything a restart needs, flattened (arrays copied) so the live state can move on; and,
        for an observer only, the state itself (its arrays are copies too: nothing live leaks out)."""
        registry = self.registry.state_dict()
        components: dict[str, Any] = {}
        for component in self.components:
            with self.errors.guard(f"checkpoint:{component.name}"):
                components[component.name] = component.state_dict()
        counters = {
            "invalid": [[s, r, n] for (s, r), n in self.pipeline.invalid.snapshot().items()],
            "interactions": self.pipeline.interactions.snapshot(),
        }
        offsets, generation = self.offsets.capture()
        state = {
            "created_at": time.time(),
            "source": self.source.name,
            "group_id": self._group_id(),
            "offsets": [[t, p, o] for (t, p), o in sorted(offsets.items())],
            "streams": registry["streams"],
            "labels": registry["labels"],
            "dims": dict(self.decoder.dims),
            "counters": counters,
            "components": components,
        }
        topic_ids = self.source.topic_ids() if isinstance(self.source, Source) else {}  # the reducer's intake: none
        if topic_ids:  # a topic recreated while the daemon was stopped is told by its id (sources/kafka/positions.py)
            state["topic_ids"] = topic_ids
        if self.observer is not None:
            state["scale_out"] = self.observer.tag()
        arrays: list[Any] = []
        tree = ckpt.flatten(state, arrays)
        return (state if self.observer is not None else None), tree, arrays, (offsets, generation)

    def _group_id(self) -> str | None:
        return self.settings.kafka.group_id if self.settings.source == "kafka" else None

    # ------------------------------------------------------------------ restoring
    def restore(self) -> bool:
        """Load the newest usable checkpoint into the (still empty) state. Never raises."""
        try:
            path = self.store.load(self._install, self._unusable)
        except Exception:  # never a crash loop: start empty instead
            self._unusable("unreadable", self.store.current, "unexpected error")
            logger.exception("checkpoint restore failed")
            return False
        if path is None:
            if self.restore_failures.snapshot():
                logger.error("no usable checkpoint in %s: starting with empty state", self.settings.state_dir)
            return False
        self.restored_from = str(path)
        logger.info(
            "restored state from %s (%d streams, offsets %s)",
            path, len(self.registry), sorted(self.offsets.durable().items()),
        )
        return True

    def _unusable(self, reason: str, path: Any, message: str) -> None:
        self.restore_failures.add(reason)
        # a replica's checkpoint that was never published is the expected trace of a crash
        level = logging.WARNING if reason == "unpublished" else logging.ERROR
        logger.log(level, "checkpoint %s is unusable (%s): %s", path, reason, message)

    def _install(self, state: Any) -> None:
        """Rebuild everything from a decoded checkpoint; raises (changing nothing) if it does not fit."""
        self._check_compatible(state)
        dims = {str(k): int(v) for k, v in dict(state["dims"]).items()}
        offsets = _offsets(state["offsets"])
        topic_ids = _topic_ids(state.get("topic_ids"))
        invalid = {
            (str(s), str(r)): checks.count(n, f"invalid records of {s}/{r}") for s, r, n in state["counters"]["invalid"]
        }
        interactions = {
            str(m): checks.count(n, f"interactions of {m}") for m, n in dict(state["counters"]["interactions"]).items()
        }
        # Counters parsed; the registry validates every window before it installs any.
        try:
            self.registry.load_state_dict({"streams": state["streams"], "labels": state["labels"], "dims": dims})
        except checks.InvalidState as exc:
            raise ckpt.CheckpointError("invalid", str(exc)) from None
        except ValueError as exc:
            raise ckpt.CheckpointError("incompatible", str(exc)) from None
        for model, dim in dims.items():
            self.decoder.dims.setdefault(model, dim)
        self.pipeline.invalid.replace(invalid)
        self.pipeline.interactions.replace(interactions)
        self.offsets.restore(offsets)
        if isinstance(self.source, Source):
            self.source.remember_topic_ids(topic_ids)
        saved = dict(state.get("components") or {})
        for component in self.components:
            if component.name in saved:
                try:
                    component.load_state_dict(saved[component.name])
                except Exception as exc:  # one component's state must not discard the rest
                    self._unusable("invalid", f"component {component.name}", f"{exc}; it starts empty")
                    logger.debug("component restore failure", exc_info=True)

    def _check_compatible(self, state: Any) -> None:
        if not isinstance(state, dict):
            raise ckpt.CheckpointError("invalid", "the state is not a mapping")
        if state.get("source") != self.source.name:
            raise ckpt.CheckpointError(
                "incompatible", f"written by source {state.get('source')!r}, running {self.source.name!r}"
            )
        if self.settings.source == "kafka" and state.get("group_id") != self.settings.kafka.group_id:
            raise ckpt.CheckpointError("incompatible", f"written for consumer group {state.get('group_id')!r}")
        limit = self.settings.limits.max_dimension
        dims = {str(k): checks.integer(v, f"dimension of model {k}", 1, limit) for k, v in dict(state["dims"]).items()}
        for model, m in self.settings.models.items():
            if m.dim and model in dims and dims[model] != m.dim:
                raise ckpt.CheckpointError("incompatible", f"model {model} has dim {dims[model]}, configured {m.dim}")
        if self.observer is not None:
            self.observer.check(state)


# A Kafka offset is an int64 and the position after the last one read must be one too; -1 is "none
# read yet" (a partition assigned at its start). Topic names: Kafka's own limit of 249 characters.
_LAST_OFFSET = 2**63 - 2
_MAX_PARTITION = 2**31 - 1


def _offsets(entries: Any) -> Offsets:
    """The checkpoint's offsets, each (topic, partition) once, each a possible Kafka offset."""
    offsets: Offsets = {}
    for topic, partition, offset in entries:
        if not isinstance(topic, str) or not 0 < len(topic) <= 249:
            raise checks.InvalidState(f"offsets: {topic!r} is not a topic name")
        key = (topic, checks.integer(partition, f"offsets: partition of {topic}", 0, _MAX_PARTITION))
        if key in offsets:
            raise checks.InvalidState(f"offsets: {topic}[{key[1]}] appears twice")
        offsets[key] = checks.integer(offset, f"offsets: {topic}[{key[1]}]", -1, _LAST_OFFSET)
    return offsets


def _topic_ids(entries: Any) -> dict[str, str]:
    """The topic ids a checkpoint holds (none in one written before they were kept)."""
    if entries is None:
        return {}
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise checks.InvalidState("topic_ids: not a mapping of topic names to ids")
    return dict(entries)
