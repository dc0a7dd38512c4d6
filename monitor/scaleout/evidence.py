"""The accumulating detector when scaled out: the reducer bets on the merged closed sub-windows' rows.

One daemon labels every fresh row on its ingest thread (:mod:`monitor.drift.online.evidence_feed`).
No process of a scaled deployment sees the rows, so the reducer's drift component keeps the
detector (on its reference's regions, as in one daemon) and this job feeds it, once per **closed
sub-window**, the rows the replicas published for that sub-window: each replica's sample of its
rows in it (a uniform reservoir, chosen without looking at the values), merged over the replicas:
their region counts, expanded into labels in a uniformly random order. The drift cycle then bets
on what was fed, as one daemon's. While each replica's sample holds all its rows of a sub-window,
the sub-window's counts are those of all its rows, whatever the number of replicas, and so is
what the detector is fed, given its seed.

The guarantee is one daemon's (docs/drift.md, "Evidence that accumulates"): every row is bet on
once (a sub-window is fed once, when it is complete: closed on the reducer's clock and published
after its end by every replica that is not stale, the rule of :mod:`monitor.scaleout.detectors`),
the rows are chosen without looking at their values, and under no change the rows of one
sub-window are exchangeable, so a random order keeps the conformal p-values exact. What differs is
how many rows: each replica's sub-window sample (``drift.window_sample_size`` rows at most), not
every record, so a busy stream's detector sees a sample of it, at most ``drift.evidence_rows`` a
cycle as in one daemon. No new bytes cross the partials topic: the samples are those the
sub-window partials already carry (and that are checked when read).

The detector is checkpointed with the reducer's drift component; this job's position is not: a
restarted reducer resumes the detector and this job feeds it from the sub-window in progress (the
sub-windows between the checkpoint and the restart are skipped, never fed twice).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import StreamKey

if TYPE_CHECKING:
    from monitor.drift.component import DriftComponent
    from monitor.drift.online.evidence_feed import EvidenceFeed
    from monitor.scaleout.table import MergeTable

logger = logging.getLogger(__name__)

NAME = "subwindow_evidence"


class SubwindowEvidence(Component):
    """Feeds the drift component's accumulating detectors the merged closed sub-windows' rows (module docstring)."""

    name = NAME

    def __init__(self, context: MonitorContext, drift: DriftComponent):
        self.context = context
        self.table: MergeTable = context.registry  # type: ignore[assignment]  # the reducer's registry
        self.drift = drift
        self.seed = context.settings.drift.seed
        self._fed: dict[StreamKey, tuple[EvidenceFeed, int, np.random.Generator]] = {}  # feed, last fed, order
        self._lock = threading.Lock()
        # set by the reducer once its intake exists: feeding runs between two polls, as captures do
        self.boundary: Callable[[Callable[[], Any]], Any] | None = None

    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob(NAME, self.feed, self.context.settings.refresh_seconds)]

    def feed(self) -> int:
        """Feed every complete sub-window not fed yet to its stream's detector; returns the rows fed."""
        return self._feed() if self.boundary is None else int(self.boundary(self._feed))

    def _feed(self) -> int:
        complete = self.table.complete_before(self.context.clock())  # sub-windows below this index are complete
        fed = 0
        with self._lock:
            for key in self.table.streams():
                feed = self.drift.evidence_feed(*key)
                if feed is None:
                    self._fed.pop(key, None)
                    continue
                known = self._fed.get(key)
                if known is None or known[0] is not feed:  # a new detector: from the sub-window in progress
                    rng = np.random.default_rng([self.seed, zlib.crc32(f"{key[0]}/{key[1]}".encode()), complete])
                    known = (feed, complete - 1, rng)
                    logger.info("drift: %s/%s: the reducer's evidence starts at sub-window %d", *key, complete)
                feed_of, last, rng = known
                for index, rows in self.table.subwindow_rows(*key, last + 1, complete):
                    last = index
                    if len(rows):  # the region counts of the sub-window, as labels in a random order
                        counts = np.bincount(feed_of.label(rows), minlength=feed_of.regions.k)
                        fed += feed_of.add_counts(counts, rng)
                self._fed[key] = (feed_of, last, rng)
        return fed

    def status(self) -> dict[StreamKey, int]:
        """The last sub-window fed, per stream."""
        with self._lock:
            return {key: last for key, (_, last, _) in self._fed.items()}


def subwindow_evidence(context: MonitorContext, components: list[Component]) -> SubwindowEvidence | None:
    """The reducer's evidence feeder when drift runs with the accumulating detector, else None."""
    from monitor.drift.component import DriftComponent

    drift = next((c for c in components if isinstance(c, DriftComponent)), None)
    if drift is None or context.settings.drift.evidence_threshold is None:
        return None
    return SubwindowEvidence(context, drift)
