"""The accumulating detector in a daemon: a stream's fresh rows, labelled as they arrive, bet on once a cycle.

:class:`EvidenceFeed` holds an :class:`~monitor.drift.online.evidence.EvidenceDetector` on one
reference's regions and the region labels of the rows that arrived since the last cycle. The
ingest thread labels each batch (:meth:`EvidenceFeed.add`: :meth:`Regions.assign
<monitor.drift.attribution.regions.Regions.assign>` in float32, one (n, d) x (d, k) product, outside
every lock); the drift cycle bets on what was gathered (:meth:`EvidenceFeed.step`). At most ``cap``
rows a cycle are labelled: the first to arrive, chosen without looking at their values, so the
rows bet on are as exchangeable as the stream's (docs/drift.md, "Evidence that accumulates").

Scaled out, no process sees the rows: each replica publishes the region counts of its rows per
closed sub-window and the reducer bets on the sums (:func:`labels_from_counts`: the counts as
labels in a uniformly random order, which keeps the conformal p-values exact, since the rows of
one sub-window are exchangeable under no change).

numpy only.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from monitor.drift.attribution.regions import Regions
from monitor.drift.online.evidence import EvidenceDetector, EvidenceStep
from monitor.state import checks
from monitor.state.reservoir import generator_from_state

MAX_REGIONS = 64  # drift.regions.max_regions at most
MAX_BETS = 1 + MAX_REGIONS * 32  # the adaptive bet and, per set of regions, each stake (a checkpoint holds each)


@dataclass(frozen=True)
class EvidenceResult:
    """One cycle's bet as published with the verdict: rows bet on, ``log R_t``, ``log A``, whether it alarmed.

    ``log_evidence`` is the statistic the cycle compared with the threshold (after an alarm the
    detector restarts at ``R = 0``, but the value shown is the one that crossed the line).
    """

    rows: int  # 0: no row arrived since the last bet (the values are the last bet's)
    log_evidence: float
    log_threshold: float
    alarmed: bool
    alarms: int  # alarms of this detector so far (since its reference was installed)

    def state(self) -> list[Any]:
        return [self.rows, self.log_evidence, self.log_threshold, self.alarmed, self.alarms]

    @classmethod
    def from_state(cls, entry: Any) -> EvidenceResult:
        """A checkpointed bet, ``[rows, log R, log A, alarmed, alarms]``; raises
        :class:`~monitor.state.checks.InvalidState` on a value no cycle writes."""
        if not isinstance(entry, list | tuple) or len(entry) != 5:
            raise checks.InvalidState(f"evidence must be [rows, log R, log A, alarmed, alarms], got {entry!r:.80}")
        rows, log_r, log_a, alarmed, alarms = entry
        if not isinstance(alarmed, bool):
            raise checks.InvalidState(f"evidence alarmed must be a boolean, got {alarmed!r:.40}")
        return cls(checks.count(rows, "evidence rows"), checks.finite(log_r, "log evidence"),
                   checks.finite(log_a, "log evidence threshold", low=0.0), alarmed,
                   checks.count(alarms, "evidence alarms"))


class EvidenceFeed:
    """One (model, stream)'s detector on ``regions``, and the labels of the fresh rows not yet bet on.

    Examples
    --------
    >>> from monitor.drift.attribution.regions import fit_regions
    >>> rng = np.random.default_rng(0)
    >>> regions = fit_regions(rng.standard_normal((400, 4)), seed=0)
    >>> feed = EvidenceFeed(regions, threshold=100.0, cap=150, seed=1)
    >>> feed.add(rng.standard_normal((100, 4))), feed.add(rng.standard_normal((100, 4))), feed.pending
    (100, 50, 150)
    >>> result = feed.step()
    >>> result.rows, result.alarmed, feed.pending
    (150, False, 0)
    >>> again = feed.step()  # nothing arrived: no bet, the statistic is unchanged
    >>> again.rows, again.log_evidence == result.log_evidence
    (0, True)
    """

    def __init__(self, regions: Regions, threshold: float, cap: int, seed: int | np.random.SeedSequence):
        if cap < 1:
            raise ValueError(f"cap must be at least 1, got {cap}")
        self.regions = regions
        # nearest centre by argmax(x · c - |c|² / 2), in float32: one (n, d) x (d, k) product a batch
        self._centres = np.ascontiguousarray(regions.centres, dtype=np.float32).T
        self._half_norms = (0.5 * (regions.centres.astype(np.float64) ** 2).sum(axis=1)).astype(np.float32)
        self.detector = EvidenceDetector(regions.reference_counts, threshold, seed=seed)
        self.cap = cap
        self.log_threshold = math.log(threshold)
        self._lock = threading.Lock()
        self._pending: list[np.ndarray] = []
        self._rows = 0
        self.last: EvidenceResult | None = None  # the last bet

    @property
    def pending(self) -> int:
        """Labelled rows waiting for the next cycle."""
        with self._lock:
            return self._rows

    def add(self, vectors: np.ndarray) -> int:
        """Label the first rows of ``vectors`` that fit under this cycle's cap; returns how many were taken.

        The cost is bounded by the cap: once it is reached, nothing more is labelled until the
        cycle takes the labels.
        """
        with self._lock:
            room = self.cap - self._rows
        if room <= 0 or not len(vectors):
            return 0
        return self.add_labels(self.label(vectors[:room]))

    def label(self, vectors: np.ndarray) -> np.ndarray:
        """The region of each row: the nearest centre (as :meth:`Regions.assign
        <monitor.drift.attribution.regions.Regions.assign>`, in float32; a row equally near two centres
        may go either way, which changes no guarantee: any fixed rule of the row alone will do)."""
        with np.errstate(over="ignore", invalid="ignore"):  # finite rows near float32's limit: still a fixed rule
            scores = np.asarray(vectors, dtype=np.float32) @ self._centres
            scores -= self._half_norms
            return np.argmax(scores, axis=1)

    def add_labels(self, labels: np.ndarray) -> int:
        """Keep region labels (in arrival order) for the next cycle, up to the cap; returns how many were kept."""
        labels = np.asarray(labels, dtype=np.int64).ravel()
        with self._lock:
            kept = labels[: max(0, self.cap - self._rows)]
            if kept.size:
                self._pending.append(kept)
                self._rows += int(kept.size)
            return int(kept.size)

    def take(self) -> np.ndarray:
        """The labels gathered since the last cycle, in arrival order; the feed starts the next cycle empty."""
        with self._lock:
            pending, self._pending, self._rows = self._pending, [], 0
        return np.concatenate(pending) if pending else np.zeros(0, dtype=np.int64)

    def step(self) -> EvidenceResult | None:
        """Bet on the gathered labels (one detector update). When no row arrived there is no update (a
        quiet stream cannot alarm by the mere passing of cycles): the last bet again, with ``rows``
        0 and no alarm, or None before the first."""
        labels = self.take()
        if not labels.size:
            return None if self.last is None else replace(self.last, rows=0, alarmed=False)
        self.last = self._result(self.detector.update(labels))
        return self.last

    def add_counts(self, counts: np.ndarray, rng: np.random.Generator) -> int:
        """Keep one sub-window's region counts (k,) as labels in a uniformly random order, up to the cap
        (reducers: the order, and which rows a full cap leaves out, depend on the counts and ``rng`` only)."""
        return self.add_labels(labels_from_counts(counts, self.regions.k, rng))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The detector's state (the bag, the recent counts, each bet's ``log R``, its random state) and the last
        bet; labels still pending are not kept (their rows are never bet on: a value-blind skip)."""
        d = self.detector
        return {
            "regions": regions_fingerprint(self.regions), "bag": [int(x) for x in d.bag],
            "recent": [float(x) for x in d.recent],
            "components": [None if x == -math.inf else float(x) for x in d.components],
            "cycles": d.cycles, "alarms": d.alarms, "rng": dict(d.rng.bit_generator.state),
            "last": None if self.last is None else self.last.state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume a checkpointed detector of these regions (:func:`check_feed_state` first); raises
        :class:`~monitor.state.checks.InvalidState` when it is not one this feed could have written."""
        parsed = check_feed_state(state)
        if parsed["regions"] != regions_fingerprint(self.regions):
            raise checks.InvalidState("the checkpointed evidence was gathered on other regions")
        bag = parsed["bag"]
        if len(bag) != self.regions.k or (bag < self.regions.reference_counts).any():
            raise checks.InvalidState(f"the evidence bag {bag.tolist()[:8]} does not hold the reference's counts")
        d = self.detector
        if len(parsed["components"]) != len(d.components):
            raise checks.InvalidState(f"the checkpointed evidence has {len(parsed['components'])} bets, "
                                      f"this detector {len(d.components)}")
        d.bag, d.recent, d.components = bag, parsed["recent"], parsed["components"]
        d.cycles, d.alarms, d.rng = parsed["cycles"], parsed["alarms"], parsed["rng"]
        self.last = parsed["last"]

    def _result(self, step: EvidenceStep) -> EvidenceResult:
        return EvidenceResult(step.rows, step.log_evidence, self.log_threshold, step.alarmed, self.detector.alarms)


def labels_from_counts(counts: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``counts[b]`` labels ``b`` for each region, in a uniformly random order.

    >>> labels_from_counts(np.array([2, 0, 1]), 3, np.random.default_rng(0)).tolist()
    [2, 0, 0]
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (k,) or (counts < 0).any():
        raise ValueError(f"need {k} non-negative region counts, got {counts.shape} {counts.tolist()[:8]}")
    return rng.permutation(np.repeat(np.arange(k), counts))


def regions_fingerprint(regions: Regions) -> int:
    """A checksum of the regions' centres and held-out counts: a checkpoint's detector resumes only on them."""
    centres = np.ascontiguousarray(regions.centres, dtype=np.float64).tobytes()
    return zlib.crc32(np.asarray(regions.reference_counts, dtype=np.int64).tobytes(), zlib.crc32(centres))


def check_feed_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpointed detector's values, each checked (a bounded number of regions, counts
    non-negative, finite recent counts, a finite ``log R`` or none, a random state numpy accepts);
    raises :class:`~monitor.state.checks.InvalidState`."""
    bag, recent = state["bag"], state["recent"]
    if not isinstance(bag, list | tuple) or not 2 <= len(bag) <= MAX_REGIONS:
        raise checks.InvalidState(f"the evidence bag must hold 2..{MAX_REGIONS} counts")
    if not isinstance(recent, list | tuple) or len(recent) != len(bag):
        raise checks.InvalidState("the evidence's recent counts must match its bag")
    rng_state = state["rng"]
    if not isinstance(rng_state, Mapping) or rng_state.get("bit_generator") != "PCG64":
        raise checks.InvalidState("the evidence's random state must be a PCG64 state")
    try:
        rng = generator_from_state(dict(rng_state))
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
        raise checks.InvalidState(f"the evidence's random state is not one numpy writes: {exc}") from None
    components = state["components"]
    if not isinstance(components, list | tuple) or not 1 <= len(components) <= MAX_BETS:
        raise checks.InvalidState(f"the evidence must hold 1..{MAX_BETS} bets")
    last = state.get("last")
    return {
        "regions": checks.integer(state["regions"], "evidence regions checksum", 0, 2**32 - 1),
        "bag": np.array([checks.count(x, "evidence bag count") for x in bag], dtype=np.int64),
        "recent": np.array([checks.finite(x, "evidence recent count", low=0.0) for x in recent]),
        "components": np.array([-math.inf if x is None else checks.finite(x, "log evidence of a bet")
                                for x in components]),
        "cycles": checks.count(state["cycles"], "evidence cycles"),
        "alarms": checks.count(state["alarms"], "evidence alarms"), "rng": rng,
        "last": None if last is None else EvidenceResult.from_state(last),
    }
