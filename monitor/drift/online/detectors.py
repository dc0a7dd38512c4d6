"""Online change detection on cheap per-record signals, for the ingest thread.

The scheduled two-sample tests answer "is this window different from the reference?" every few
minutes. Between them, river's sequential detectors watch two scalars per record (``cosine`` to
the reference centroid and ``norm``, standardised with the reference's own spread:
:mod:`monitor.drift.online.signals`) and say *when* something changed, within seconds. The detector kinds,
their parameter names and our defaults are in :mod:`monitor.drift.online.detector_kinds`.

Records are fed as means of ``aggregate`` consecutive records (default 64, ``aggregate=1`` feeds
each one), rescaled by ``sqrt(aggregate)`` so the detectors still see unit variance under no drift.
Why, with river's measured per-value costs: docs/benchmarks.md, "Online change detectors".
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from river import base, drift

from monitor.drift.online.detector_kinds import (
    DEFAULT_DETECTOR_PARAMS,
    DEFAULT_DETECTORS,
    SIGNALS,
    DetectorKind,
    check_detector_params,
)
from monitor.drift.online.signals import SignalBaseline, record_signals

logger = logging.getLogger(__name__)

DEFAULT_AGGREGATE = 64

_FACTORIES: dict[str, type] = {
    "adwin": drift.ADWIN,
    "page_hinkley": drift.PageHinkley,
    "kswin": drift.KSWIN,
}


def build_detector(kind: str, params: Mapping[str, Any] | None = None) -> base.DriftDetector:
    """A fresh river detector; unknown kinds or parameter names fail here, with the valid ones listed,
    and bad values where river's constructor checks them."""
    params = dict(params or {})
    check_detector_params(kind, params)
    return _FACTORIES[kind](**params)


@dataclass(frozen=True)
class ChangePoint:
    """One detection: which signal and detector, at which record (0-based, stream order), when."""

    signal: str
    detector: str
    record_index: int
    timestamp: float


@dataclass(frozen=True)
class DetectorStatus:
    """Running totals for one (signal, detector) pair, for export as metrics."""

    changes: int
    last_record_index: int | None
    last_timestamp: float | None


class OnlineDriftMonitor:
    """Feeds standardised per-record signals to river detectors and records change points.

    Parameters
    ----------
    baseline
        The reference's centroid and signal scales (:meth:`SignalBaseline.from_reference`).
    detectors
        Detector kind → river parameters; defaults to :data:`DEFAULT_DETECTORS` with
        :data:`DEFAULT_DETECTOR_PARAMS`.
    signals
        Which signals to watch.
    aggregate
        Records per detector update (mini-batch mean, rescaled to unit variance); 1 = per record.
    history
        How many recent change points to keep in :attr:`recent_changes`.

    Examples
    --------
    >>> rng = np.random.default_rng(42)
    >>> center = np.r_[1.0, np.zeros(7)]
    >>> def records(n, pull):
    ...     v = rng.normal(0, 0.3, size=(n, 8)) + pull * center
    ...     return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)
    >>> baseline = SignalBaseline.from_reference(records(2000, 1.0))
    >>> monitor = OnlineDriftMonitor(baseline, signals=("cosine",), aggregate=16)
    >>> monitor.update(records(4000, 1.0), now=1.0)
    []
    >>> [(c.detector, c.record_index) for c in monitor.update(records(4000, 0.8), now=2.0)]
    [('page_hinkley', 4223), ('adwin', 4607)]
    """

    def __init__(
        self,
        baseline: SignalBaseline,
        detectors: Mapping[DetectorKind, Mapping[str, Any]] | None = None,
        *,
        signals: Sequence[str] = SIGNALS,
        aggregate: int = DEFAULT_AGGREGATE,
        history: int = 100,
    ) -> None:
        if aggregate < 1:
            raise ValueError(f"aggregate must be at least 1, got {aggregate}")
        unknown = set(signals) - set(SIGNALS)
        if unknown or not signals:
            raise ValueError(f"signals must be a non-empty subset of {SIGNALS}, got {list(signals)}")
        if detectors is None:
            detectors = {kind: DEFAULT_DETECTOR_PARAMS[kind] for kind in DEFAULT_DETECTORS}
        specs = dict(detectors)
        if not specs:
            raise ValueError("at least one detector is needed")
        self.baseline = baseline
        self.signals = tuple(signals)
        self.aggregate = aggregate
        self.detector_params = {kind: dict(params) for kind, params in specs.items()}
        self._detectors: dict[tuple[str, str], base.DriftDetector] = {
            (signal, kind): build_detector(kind, params) for signal in self.signals for kind, params in specs.items()
        }
        self._status = {key: DetectorStatus(0, None, None) for key in self._detectors}
        self._pending = np.zeros((len(self.signals), 0))
        self._records_seen = 0
        self._scale = math.sqrt(aggregate)
        self._lock = threading.Lock()
        self.recent_changes: deque[ChangePoint] = deque(maxlen=history)

    @property
    def records_seen(self) -> int:
        return self._records_seen

    def update(self, vectors: np.ndarray, now: float, norms: np.ndarray | None = None) -> list[ChangePoint]:
        """Feed a batch (n, d) of records (and their L2 norms, if known); returns the change points
        detected in it.

        Records that do not fill a mini-batch are kept for the next call.
        """
        if vectors.ndim != 2 or vectors.shape[1] != self.baseline.centroid_unit.shape[0]:
            raise ValueError(
                f"expected vectors of shape (n, {self.baseline.centroid_unit.shape[0]}), got {vectors.shape}"
            )
        raw = record_signals(vectors, self.baseline.centroid_unit, norms)
        z = np.stack([(raw[s] - self.baseline.means[s]) / self.baseline.stds[s] for s in self.signals])
        with self._lock:
            first_index = self._records_seen - self._pending.shape[1]
            if self._pending.shape[1]:
                z = np.concatenate([self._pending, z], axis=1)
            full = (z.shape[1] // self.aggregate) * self.aggregate
            means = z[:, :full].reshape(len(self.signals), -1, self.aggregate).mean(axis=2) * self._scale
            self._pending = z[:, full:]
            self._records_seen += len(vectors)
            found: list[ChangePoint] = []
            for (signal, kind), detector in self._detectors.items():
                row = means[self.signals.index(signal)].tolist()
                for j, value in enumerate(row):
                    detector.update(value)
                    if detector.drift_detected:
                        index = first_index + (j + 1) * self.aggregate - 1
                        found.append(ChangePoint(signal, kind, index, now))
            found.sort(key=lambda c: (c.record_index, c.signal, c.detector))
            for change in found:
                previous = self._status[(change.signal, change.detector)]
                self._status[(change.signal, change.detector)] = DetectorStatus(
                    previous.changes + 1, change.record_index, change.timestamp
                )
                self.recent_changes.append(change)
        if found:
            logger.info("online drift: %d change point(s), first %s", len(found), found[0])
        return found

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for checkpoints (river detectors pickle; the lock does not and is recreated)."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def status(self) -> dict[tuple[str, str], DetectorStatus]:
        """A copy of the per-(signal, detector) totals; safe to call from another thread."""
        with self._lock:
            return dict(self._status)
