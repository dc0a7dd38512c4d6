"""The daemon's side of a consumer-group rebalance: hand partitions over without losing or doubling.

On revocation the daemon applies everything already polled, checkpoints if the newest checkpoint
does not hold it, and tells the source which offsets to commit before the partitions move, so the
next owner starts right after what this replica's durable state reflects. On assignment the
positions the source sought to count as accounted for (docs/operations.md, "Rebalances"); a
position the source found outside its log and reset replaces what was kept for the partition
(docs/operations.md, "Offsets out of range").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from monitor.daemon.checkpointing import Checkpointer
from monitor.daemon.ingest import IngestPipeline
from monitor.daemon.offsets import OffsetTracker
from monitor.sources.base import Partition, PartitionListener

logger = logging.getLogger(__name__)

HANDOFF_DRAIN_SECONDS = 30.0


class PartitionHandoff(PartitionListener):
    def __init__(self, pipeline: IngestPipeline, offsets: OffsetTracker, checkpointer: Checkpointer | None):
        self._pipeline = pipeline
        self._offsets = offsets
        self._checkpointer = checkpointer

    def on_revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        if not self._pipeline.drain(HANDOFF_DRAIN_SECONDS):
            logger.error("hand-off: queued records not applied within %.0fs", HANDOFF_DRAIN_SECONDS)
        if self._checkpointer is not None:
            self._checkpointer.ensure_current(reason="rebalance")
        leaving = set(partitions)
        return {key: offset for key, offset in self._offsets.resume_offsets().items() if key in leaving}

    def on_assigned(self, positions: Mapping[Partition, int]) -> None:
        self._offsets.mark_assigned(positions)

    def on_reset(self, positions: Mapping[Partition, int]) -> None:
        # what was polled before the reset is applied first: its offsets must not land on the new ones
        if not self._pipeline.drain(HANDOFF_DRAIN_SECONDS):
            logger.error("offset reset: queued records not applied within %.0fs", HANDOFF_DRAIN_SECONDS)
        self._offsets.reset(positions)

    def resume_offsets(self) -> dict[Partition, int]:
        return self._offsets.resume_offsets()

    def applied_offsets(self) -> dict[Partition, int]:
        return self._offsets.applied()
