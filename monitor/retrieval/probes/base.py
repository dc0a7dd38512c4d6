"""What every probe shares: results as data, the interaction buffer, summaries, the base class.

A probe is an object with ``name``, ``interval_seconds``, ``timeout_seconds``, cheap ingest hooks
and ``run(deadline) -> ProbeResult`` (the deadline and the errors that end a run are in
:mod:`monitor.retrieval.probes.deadline`). The result is plain immutable data (estimates with their
intervals, query counts, extra gauges); :mod:`monitor.retrieval.probes.export` turns it into
metric families and never computes anything.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.logs import RateLimitedLog
from monitor.retrieval.metrics import parse_metric
from monitor.retrieval.settings import ProbeSettings, ProbeSpec, StatisticsSettings
from monitor.retrieval.stats import bootstrap_ci, slice_report
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.component import MonitorContext

logger = logging.getLogger(__name__)
_log = RateLimitedLog(logger, interval=3600.0)

ALL = "all"  # the slice label of the value over every query
OTHER = "other"  # where slices past the cap (and a query's own slice named "all") go


@dataclass(frozen=True, slots=True)
class Estimate:
    """One exported retrieval value: ``embmon_retrieval_<family>{probe, model, slice, k}``."""

    family: str
    model: str
    slice: str
    k: int
    mean: float
    lower: float
    upper: float


@dataclass(frozen=True, slots=True)
class Sample:
    """Any other gauge a probe exports (name without ``embmon_``, label values by name)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class ProbeResult:
    """What one successful run computed (immutable; replaced whole by the next run)."""

    estimates: tuple[Estimate, ...] = ()
    queries: tuple[tuple[str, str, int], ...] = ()  # (model, slice, number of queries)
    samples: tuple[Sample, ...] = ()
    notes: tuple[str, ...] = ()  # human-readable remarks (why nothing was computed, ...)

    def estimate(self, family: str, model: str, k: int, slice_: str = ALL) -> Estimate | None:
        """Look one estimate up (for tests and the inspection tools)."""
        for e in self.estimates:
            if (e.family, e.model, e.k, e.slice) == (family, model, k, slice_):
                return e
        return None

    def sample(self, name: str, **labels: str) -> float | None:
        wanted = tuple(sorted(labels.items()))
        for s in self.samples:
            if s.name == name and tuple(sorted(s.labels)) == wanted:
                return s.value
        return None


def sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, tuple(labels.items()), float(value))


@dataclass
class Summary:
    """What :func:`summarise` computed for one model: the parts a :class:`ProbeResult` is made of."""

    estimates: list[Estimate] = field(default_factory=list)
    queries: list[tuple[str, str, int]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)


def slice_labels(raw: Iterable[str | None]) -> list[str | None]:
    """Slices as given, except the reserved overall label ``all``, which is counted as ``other``."""
    return [OTHER if label == ALL else label for label in raw]


def summarise(
    per_query: Mapping[str, np.ndarray],
    slices: Sequence[str | None],
    *,
    probe: str,
    model: str,
    stats: StatisticsSettings,
    family: Callable[[str], str] | None = None,
    folded_upstream: bool = False,
) -> Summary:
    """Means with bootstrap intervals, overall (``slice="all"``) and per slice when any query has one.

    ``per_query`` maps metric names with a cutoff (``ndcg@10``) to one value per query.
    ``family`` renames a metric family for export (``recall`` -> ``ann_recall``);
    ``folded_upstream`` says the caller already folded the labels past the cap. Slice warnings
    (small slices, folded slices) become ``retrieval_slice_warnings{probe, model, kind}`` samples
    and a rate-limited log line.
    """
    out = Summary()
    n = len(slices)
    out.queries.append((model, ALL, n))
    if n == 0 or not per_query:
        return out
    specs = {name: parse_metric(name) for name in per_query}
    rename = family or (lambda f: f)

    def add(slice_: str, intervals: Mapping[str, object]) -> None:
        for name, ci in intervals.items():
            spec = specs[name]
            assert spec.k is not None, f"probe metrics carry a cutoff, got {name}"
            out.estimates.append(
                Estimate(rename(spec.family), model, slice_, spec.k, ci.mean, ci.lower, ci.upper)  # type: ignore[attr-defined]
            )

    add(ALL, bootstrap_ci(per_query, resamples=stats.resamples, confidence=stats.confidence, seed=stats.seed))
    labels = slice_labels(slices)
    warnings: Counter[str] = Counter()
    if any(label is not None for label in labels):
        report = slice_report(
            per_query,
            labels,
            max_slices=stats.max_slices,
            min_queries=stats.min_slice_queries,
            resamples=stats.resamples,
            confidence=stats.confidence,
            seed=stats.seed,
        )
        for slice_, intervals in report.intervals.items():
            add(slice_, intervals)
            out.queries.append((model, slice_, report.n_queries[slice_]))
        for warning in report.warnings:
            warnings[warning.kind] += 1
            _log.warning(f"{probe}:{model}:{warning.kind}:{warning.slice}", "probe %s model %s: %s",
                         probe, model, warning.message)
    if folded_upstream:
        warnings["folded_slices"] = 1
    for kind in ("small_slice", "folded_slices"):
        out.samples.append(sample("retrieval_slice_warnings", warnings[kind], probe=probe, model=model, kind=kind))
    return out


T = TypeVar("T")


class EventBuffer(Generic[T]):
    """The recent interaction events a probe evaluates: a bounded ring over a processing-time window.

    ``add`` is O(1) on the ingest thread. When the ring is full the oldest event is evicted; if it
    was still inside the window it is counted in ``dropped`` (the ring was too small for the
    traffic, so the probe sees only the most recent ``capacity`` events of the window).
    """

    def __init__(self, capacity: int, window_seconds: float):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not window_seconds > 0:
            raise ValueError(f"window_seconds must be positive, got {window_seconds}")
        self.capacity = int(capacity)
        self.window_seconds = float(window_seconds)
        self._ring: deque[tuple[float, T]] = deque()
        self._lock = threading.Lock()
        self.dropped = 0

    def add(self, item: T, now: float) -> None:
        with self._lock:
            if len(self._ring) >= self.capacity:
                at, _ = self._ring.popleft()
                if at >= now - self.window_seconds:
                    self.dropped += 1
            self._ring.append((now, item))

    def recent(self, now: float, limit: int | None = None) -> list[T]:
        """Items added within the window before ``now``, oldest first (at most the newest ``limit``)."""
        start = now - self.window_seconds
        with self._lock:
            while self._ring and self._ring[0][0] < start:
                self._ring.popleft()
            items = [item for _, item in self._ring]
        return items if limit is None or len(items) <= limit else items[-limit:]

    def __len__(self) -> int:
        return len(self._ring)

    def state_dict(self, encode: Callable[[list[T]], Any]) -> dict[str, Any]:
        """Times, ``encode(items)`` and the drop count, for checkpoints."""
        with self._lock:
            times = np.fromiter((at for at, _ in self._ring), dtype=np.float64, count=len(self._ring))
            items = [item for _, item in self._ring]
            dropped = self.dropped
        return {"times": times, "items": encode(items), "dropped": dropped}

    def load_state_dict(self, state: Mapping[str, Any], decode: Callable[[Any], list[T]]) -> None:
        """Checked whole before anything is installed: a value no run produces raises ``InvalidState``."""
        items = decode(state["items"])
        times = checks.finite_array(np.asarray(state["times"]), (len(items),), "probe buffer times")
        dropped = checks.count(state["dropped"], "probe buffer dropped events")
        keep = slice(max(0, len(items) - self.capacity), None)
        with self._lock:
            self._ring = deque(zip(times[keep].tolist(), items[keep], strict=True))
            self.dropped = dropped


def identified_rows(sample_ids: Sequence[str | None]) -> tuple[list[str], np.ndarray]:
    """Ids and row numbers of the sample rows that carry an id (the first row of a repeated id).

    Rows without an id cannot be matched to served or judged ids, so probes leave them out.
    """
    seen: dict[str, int] = {}
    for row, doc_id in enumerate(sample_ids):
        if doc_id is not None and doc_id not in seen:
            seen[doc_id] = row
    return list(seen), np.fromiter(seen.values(), dtype=np.int64, count=len(seen))


class Probe:
    """Base class: the scheduling attributes and no-op hooks."""

    kind = "probe"

    def __init__(self, name: str, interval_seconds: float, timeout_seconds: float):
        self.name = name
        self.interval_seconds = float(interval_seconds)
        self.timeout_seconds = float(timeout_seconds)

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        """Ingest-thread hook (cheap)."""

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        """Ingest-thread hook (cheap)."""

    def run(self, deadline: Deadline) -> ProbeResult:
        raise NotImplementedError

    @property
    def dropped_events(self) -> int | None:
        """Interaction events evicted before use (None: the probe buffers none)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs to resume (buffered events, caches); plain data and numpy arrays."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output; raise ``ValueError`` when it does not fit."""

    def close(self) -> None:
        """Release resources (encoder models, connections)."""


S = TypeVar("S", bound=ProbeSpec)


class ConfiguredProbe(Probe, Generic[S]):
    """A probe built from its settings: its own section ``spec``, the daemon's ``context`` and the
    ``shared`` probe settings (device, k-NN block size, statistics)."""

    def __init__(self, spec: S, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec.name, spec.interval_seconds, spec.timeout_seconds)
        self.spec = spec
        self.context = context
        self.shared = shared

    @property
    def device(self) -> str | None:
        """Where k-NN and encoders run: the probes' own ``device``, else the daemon's."""
        return self.shared.device or self.context.settings.device
