"""What the drift component keeps per (model, stream), its running totals, and their checkpoint form.

The component (:mod:`monitor.drift.component`) decides *when* these change; this module owns
*what* they are and how they survive a restart. Reference arrays are not here: they live in the
state directory (:mod:`monitor.drift.references.store`), the checkpoint only names the one a slot used.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from monitor.drift.export import ERROR_STAGES, ChangeKey, ChangeTotals, CycleResult, StreamKey, TestKey
from monitor.drift.online.detectors import ChangePoint, OnlineDriftMonitor
from monitor.drift.online.evidence_feed import EvidenceFeed, check_feed_state
from monitor.drift.online.online_state import decode_monitor, encode_monitor
from monitor.drift.references.first_records import FirstRecords
from monitor.drift.references.profile import ReferenceProfile
from monitor.drift.references.store import StoredReference
from monitor.state import checks

logger = logging.getLogger(__name__)

STATE_VERSION = 1  # of the component's checkpoint entry


@dataclass
class StreamSlot:
    """Everything the component keeps for one (model, stream); guarded by the component's lock."""

    dim: int
    history: deque[bool]  # the last ``drift.sustained.cycles`` verdicts
    reference: StoredReference | None = None
    builder: FirstRecords | None = None
    online: OnlineDriftMonitor | None = None
    online_for: float | None = None  # captured_at of the reference the detectors standardise with
    lagged: ReferenceProfile | None = None  # the lagged reference of the last cycle
    # the accumulating detector on the reference's regions (from the first cycle that has them);
    # checkpointed, resumed only on the same reference and regions (docs/drift.md, "Evidence that accumulates")
    evidence: EvidenceFeed | None = None
    last_end: float | None = None  # end of the last window tested
    problem: str | None = None

    def state_dict(self, key: StreamKey, result: CycleResult | None) -> dict[str, Any]:
        ref = self.reference
        return {
            "model": key[0],
            "stream": key[1],
            "dim": self.dim,
            "reference": None if ref is None else {
                "origin": ref.origin,
                "captured_at": ref.profile.captured_at,
                "records": ref.profile.count,
                "pin_sha256": ref.pin_sha256,
            },
            "builder": None if self.builder is None else self.builder.state_dict(),
            "online": None if self.online is None else encode_monitor(self.online),
            "online_for": self.online_for,
            "evidence": None if self.evidence is None else self.evidence.state_dict(),
            "history": [bool(h) for h in self.history],
            "last_end": self.last_end,
            "result": None if result is None else result.state_dict(),
        }

    def restore(
        self, key: StreamKey, entry: Mapping[str, Any], *, online_enabled: bool, lagged: bool
    ) -> CycleResult | None:
        """Take from a checkpoint entry what still fits this slot's reference; returns the last verdict if it does.

        A first-N builder resumes only with the same target and dimension. Detectors, verdict
        history and the last result belong to the reference they were computed against (or, in
        lagged mode, to the stream): after a re-pin they start afresh.
        """
        if self.builder is not None and entry.get("builder") is not None:
            builder = FirstRecords.from_state_dict(dict(entry["builder"]))
            if builder.target == self.builder.target and builder.dim == self.dim:
                self.builder = builder
        current_for = self.reference.profile.captured_at if self.reference is not None else None
        same = entry.get("online_for") == current_for or (self.reference is None and lagged)
        if not same:
            return None
        if entry.get("online") is not None and online_enabled:
            try:
                self.online = decode_monitor(dict(entry["online"]))
                self.online_for = entry.get("online_for")
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("drift: online detectors of %s/%s start afresh: %s", key[0], key[1], exc)
        if entry.get("evidence") is not None and self.evidence is not None:
            try:
                self.evidence.load_state_dict(dict(entry["evidence"]))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("drift: the accumulating detector of %s/%s starts afresh: %s", key[0], key[1], exc)
        self.history.extend(bool(h) for h in entry.get("history") or [])
        self.last_end = _last_end(entry)
        return None if entry.get("result") is None else CycleResult.from_state_dict(dict(entry["result"]))


def check_entry(entry: Mapping[str, Any]) -> None:
    """Parse everything :meth:`StreamSlot.restore` would install, changing nothing: raises
    :class:`~monitor.state.checks.InvalidState` on a value no run produces, so the component can
    refuse the whole state before any stream took part of it."""
    checks.integer(entry["dim"], "drift stream dimension", 1)
    if entry.get("builder") is not None:
        FirstRecords.from_state_dict(dict(entry["builder"]))
    if entry.get("online_for") is not None:
        checks.finite(entry["online_for"], "online detectors' reference time")
    if entry.get("evidence") is not None:
        check_feed_state(dict(entry["evidence"]))
    _last_end(entry)
    if entry.get("result") is not None:
        CycleResult.from_state_dict(dict(entry["result"]))


def _last_end(entry: Mapping[str, Any]) -> float | None:
    last = entry.get("last_end")
    return None if last is None else checks.finite(last, "end of the last window tested")


@dataclass
class DriftTotals:
    """Counters that only grow: cycles run, failures by stage, tests planned/cut/screened, online change points."""

    cycles: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_STAGES, 0))
    cuts: dict[TestKey, int] = field(default_factory=dict)  # tests cut short by the cycle's deadline
    screens: dict[TestKey, int] = field(default_factory=dict)  # costly tests the staged cycle's screen left out
    changes: dict[ChangeKey, ChangeTotals] = field(default_factory=dict)
    evidence_alarms: dict[StreamKey, int] = field(default_factory=dict)  # the accumulating detector's

    def count_changes(self, key: StreamKey, found: Iterable[ChangePoint]) -> None:
        for change in found:
            ckey = (*key, change.signal, change.detector)
            old = self.changes.get(ckey, ChangeTotals(0, None))
            self.changes[ckey] = ChangeTotals(old.changes + 1, change.timestamp)

    def count_planned(
        self, key: StreamKey, planned: Iterable[str], cut: Iterable[str], screened: Iterable[str] = ()
    ) -> None:
        """Every planned test gets a series (0 until one is cut or screened), so `rate()` has a start."""
        cut, screened = set(cut), set(screened)
        for test in planned:
            tkey = (*key, test)
            self.cuts[tkey] = self.cuts.get(tkey, 0) + (test in cut)
            self.screens[tkey] = self.screens.get(tkey, 0) + (test in screened)

    def state_dict(self) -> dict[str, Any]:
        return {
            "changes": [[*k, v.changes, v.last_timestamp] for k, v in sorted(self.changes.items())],
            "cycles": self.cycles,
            "cuts": [[*k, v] for k, v in sorted(self.cuts.items())],
            "screens": [[*k, v] for k, v in sorted(self.screens.items())],
            "evidence_alarms": [[*k, v] for k, v in sorted(self.evidence_alarms.items())],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Merge by maximum: counts restored twice, or after the component already counted, never go back.

        Everything is checked before anything is merged (:func:`parse_totals`)."""
        changes, cycles, cuts, alarms, screens = parse_totals(state)
        for ckey, (count, last) in changes.items():
            old = self.changes.get(ckey, ChangeTotals(0, None))
            self.changes[ckey] = ChangeTotals(max(old.changes, count), old.last_timestamp if last is None else last)
        self.cycles = max(self.cycles, cycles)
        for tkey, count in cuts.items():
            self.cuts[tkey] = max(self.cuts.get(tkey, 0), count)
        for tkey, count in screens.items():
            self.screens[tkey] = max(self.screens.get(tkey, 0), count)
        for skey, count in alarms.items():
            self.evidence_alarms[skey] = max(self.evidence_alarms.get(skey, 0), count)


def parse_totals(
    state: Mapping[str, Any],
) -> tuple[
    dict[ChangeKey, tuple[int, float | None]], int, dict[TestKey, int], dict[StreamKey, int], dict[TestKey, int]
]:
    """The totals of a checkpoint entry, each count non-negative and each time finite."""
    changes: dict[ChangeKey, tuple[int, float | None]] = {}
    for model, stream, signal, detector, count, last in state.get("changes") or []:
        what = f"change points of {model}/{stream} {signal} {detector}"
        when = None if last is None else checks.finite(last, f"last {what}")
        changes[(str(model), str(stream), str(signal), str(detector))] = (checks.count(count, what), when)
    cycles = checks.count(state.get("cycles") or 0, "drift cycles")
    cuts = {
        (str(model), str(stream), str(test)): checks.count(count, f"cut tests of {model}/{stream} {test}")
        for model, stream, test, count in state.get("cuts") or []
    }
    alarms = {
        (str(model), str(stream)): checks.count(count, f"evidence alarms of {model}/{stream}")
        for model, stream, count in state.get("evidence_alarms") or []
    }
    screens = {
        (str(model), str(stream), str(test)): checks.count(count, f"screened tests of {model}/{stream} {test}")
        for model, stream, test, count in state.get("screens") or []  # absent in checkpoints before the screen
    }
    return changes, cycles, cuts, alarms, screens
