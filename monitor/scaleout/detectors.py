"""Change detectors when scaled out: the reducer runs them on the merged per-sub-window signal series.

One daemon feeds river's detectors the online signals of every record in ingest order, as means
of ``drift.online.aggregate`` records (:mod:`monitor.drift.online.detectors`). No process of a
scaled deployment sees every record in order, so the reducer feeds them one observation per
signal per **closed sub-window**, computed from the merged exact statistics of that sub-window
(every replica's piece of it):

* ``cosine``: the mean cosine of the sub-window's records to the reference centroid direction
  ``c``, ``(Σ x/‖x‖) · c / n`` (the statistics keep ``Σ x/‖x‖``), and ``norm``: ``Σ‖x‖ / n``;
* standardised as one daemon's mini-batch means are: ``z = (mean − μ) / σ · √n``, with the
  reference's signal mean μ and spread σ (:class:`~monitor.drift.online.signals.SignalBaseline`),
  so ``z`` has unit variance under the reference when records are independent.

The series is the same whatever the number of replicas (the merged statistics of a sub-window
are exact), and a restart of the reducer neither feeds a sub-window twice nor skips one (the
detectors' state and the last sub-window fed are in its checkpoint, captured between two polls,
as the merge table is). A sub-window is fed once it is closed on the reducer's clock and every
replica that is not stale has published a capture taken after its end, so its statistics are
complete; a stale replica does not hold the series back.

The detectors are built from ``scale_out.detectors`` (one update per sub-window calls for other
pacing than one daemon's per-mini-batch defaults: see :mod:`monitor.scaleout.settings`), on the
signals of ``drift.online.signals``, and only when ``drift.online.enabled``. Change points are
counted in the drift component's totals, so they are exported as one daemon's are
(``embmon_drift_change_points_total``, ``embmon_drift_last_change_timestamp_seconds``: the end of
the sub-window that showed the change); a change point's record index is the number of records
in the sub-windows fed so far. Delay against one daemon: docs/drift.md, "Change detectors when
scaled out".
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import StreamKey
from monitor.drift.online.detector_kinds import DetectorKind
from monitor.drift.online.detectors import ChangePoint, build_detector
from monitor.drift.online.online_state import decode_detector, encode_detector
from monitor.drift.online.signals import SignalBaseline
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.drift.component import DriftComponent
    from monitor.drift.settings import OnlineSettings
    from monitor.scaleout.table import MergeTable

logger = logging.getLogger(__name__)

NAME = "subwindow_detectors"


@dataclass
class _Stream:
    """One (model, stream): its baseline, detectors, and the last sub-window fed."""

    baseline: SignalBaseline
    reference_at: float  # the reference's capture time: another reference starts fresh detectors
    last_fed: int
    detectors: dict[tuple[str, str], Any]  # (signal, kind) -> river detector
    records: int = 0
    fed: int = 0
    changes: list[ChangePoint] = field(default_factory=list)


class SubwindowDetectors(Component):
    """The reducer's online detectors on the merged per-sub-window signal series (module docstring)."""

    name = NAME

    def __init__(self, context: MonitorContext, online: OnlineSettings, drift: DriftComponent,
                 detectors: Mapping[DetectorKind, Mapping[str, Any]]):
        self.context = context
        self.table: MergeTable = context.registry  # type: ignore[assignment]  # the reducer's registry
        self.drift = drift
        self.signals = tuple(online.signals)
        self.params = {str(kind): dict(p) for kind, p in detectors.items()}
        self.lagged = drift.reference_settings.lagged_seconds is not None
        window = context.settings.window
        self.width = window.seconds / window.subwindows
        self.subwindows = window.subwindows
        self._streams: dict[StreamKey, _Stream] = {}
        self._lock = threading.Lock()
        # set by the reducer once its intake exists: feeding runs between two polls, as captures do
        self.boundary: Callable[[Callable[[], Any]], Any] | None = None

    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob(NAME, self.feed, self.context.settings.refresh_seconds)]

    # ------------------------------------------------------------------ feeding
    def feed(self) -> list[ChangePoint]:
        """Feed every complete sub-window not fed yet; returns the change points found."""
        return self._feed() if self.boundary is None else list(self.boundary(self._feed))

    def _feed(self) -> list[ChangePoint]:
        now = self.context.clock()
        complete = self.table.complete_before(now)  # sub-windows below this index are complete
        found: list[ChangePoint] = []
        with self._lock:
            for model, stream in self.table.streams():
                state = self._stream((model, stream), complete)
                if state is None:
                    continue
                for index, count, unit_sum, norm_sum in self.table.subwindow_sums(model, stream, state.last_fed + 1,
                                                                                  complete):
                    found += self._observe((model, stream), state, index, count, unit_sum, norm_sum)
        return found

    def _stream(self, key: StreamKey, complete: int) -> _Stream | None:
        """The stream's detectors, started (or restarted on a new reference) when it has a reference."""
        reference = self.drift.reference(*key)
        state = self._streams.get(key)
        if reference is None:
            return state
        if state is not None and (self.lagged or state.reference_at == reference.captured_at):
            return state
        try:
            baseline = reference.signal_baseline()
        except ValueError as exc:
            logger.error("drift: no online detectors for %s/%s on the reducer: %s", *key, exc)
            return None
        # fed from the sub-window in progress: the reference's records are not watched for a change
        state = _Stream(baseline, reference.captured_at, complete - 1,
                        {(s, k): build_detector(k, p) for s in self.signals for k, p in self.params.items()})
        self._streams[key] = state
        self._count(key, [])
        logger.info("drift: %s/%s: the reducer's change detectors start at sub-window %d", *key, complete)
        return state

    def _observe(self, key: StreamKey, state: _Stream, index: int, count: int, unit_sum: np.ndarray,
                 norm_sum: float) -> list[ChangePoint]:
        state.last_fed = index
        if count == 0 or unit_sum.shape != state.baseline.centroid_unit.shape:
            return []
        state.records += count
        state.fed += 1
        means = {"cosine": float(unit_sum @ state.baseline.centroid_unit) / count, "norm": norm_sum / count}
        at = (index + 1) * self.width  # the end of the sub-window that showed it
        found = []
        for (signal, kind), detector in state.detectors.items():
            z = (means[signal] - state.baseline.means[signal]) / state.baseline.stds[signal] * math.sqrt(count)
            detector.update(z)
            if detector.drift_detected:
                found.append(ChangePoint(signal, kind, state.records - 1, at))
        if found:
            logger.info("online drift (reducer): %s/%s sub-window %d: %s", *key, index,
                        ", ".join(f"{c.signal}/{c.detector}" for c in found))
            self._count(key, found)
        return found

    def _count(self, key: StreamKey, found: list[ChangePoint]) -> None:
        """Into the drift component's totals: exported, and checkpointed, as one daemon's change points."""
        self.drift.record_change_points(key, found, self.signals, list(self.params))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"streams": [
                {"model": m, "stream": s, "reference_at": st.reference_at, "last_fed": st.last_fed,
                 "records": st.records, "fed": st.fed,
                 "baseline": {"centroid_unit": st.baseline.centroid_unit.copy(), "means": dict(st.baseline.means),
                              "stds": dict(st.baseline.stds)},
                 "detectors": [[sig, kind, encode_detector(d)] for (sig, kind), d in st.detectors.items()]}
                for (m, s), st in sorted(self._streams.items())
            ]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        streams: dict[StreamKey, _Stream] = {}
        for entry in state["streams"]:
            b = entry["baseline"]
            baseline = SignalBaseline(np.asarray(b["centroid_unit"], dtype=np.float64),
                                      {str(k): float(v) for k, v in dict(b["means"]).items()},
                                      {str(k): float(v) for k, v in dict(b["stds"]).items()})
            detectors = {(str(sig), str(kind)): decode_detector(str(kind), self.params[str(kind)], dict(raw))
                         for sig, kind, raw in entry["detectors"]}
            if set(detectors) != {(s, k) for s in self.signals for k in self.params}:
                raise ValueError("the stored detectors differ from scale_out.detectors and drift.online.signals")
            streams[(str(entry["model"]), str(entry["stream"]))] = _Stream(
                baseline, checks.finite(entry["reference_at"], "reference time"),
                checks.integer(entry["last_fed"], "last sub-window fed", -checks.INT64_MAX), detectors,
                checks.count(entry["records"], "records fed"), checks.count(entry["fed"], "sub-windows fed"))
        with self._lock:
            self._streams = streams

    def status(self) -> dict[StreamKey, tuple[int, int]]:
        """(sub-windows fed, records in them) per stream."""
        with self._lock:
            return {key: (st.fed, st.records) for key, st in self._streams.items()}


def subwindow_detectors(context: MonitorContext, components: list[Component], online: OnlineSettings,
                        detectors: Mapping[DetectorKind, Mapping[str, Any]]) -> SubwindowDetectors | None:
    """The reducer's detectors when drift runs with ``drift.online.enabled``, else None."""
    from monitor.drift.component import DriftComponent

    drift = next((c for c in components if isinstance(c, DriftComponent)), None)
    if drift is None or not online.enabled:
        return None
    return SubwindowDetectors(context, online, drift, detectors)
