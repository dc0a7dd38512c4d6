"""Which source offsets the state reflects, which are durable, and which the group has committed.

Exactly-once state (docs/operations.md) rests on three numbers per partition, all "the last
offset included" (Kafka's committed position is that plus one):

* **applied**: folded into the in-memory state;
* **durable**: held by the newest checkpoint on disk;
* **committed**: told to the consumer group.

With checkpointing on, only durable offsets are committed, so the group is never ahead of what a
restart can restore; without it, applied offsets are. One lock guards all three.

A checkpoint marks durable the offsets it captured, after its write: a partition whose position was
reset in between (:meth:`OffsetTracker.reset`) keeps its new offsets, so the old, larger one (past
the end of a recreated topic's log) is neither made durable again nor committed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from monitor.sources.base import Offsets, Partition


class OffsetTracker:
    """The applied, durable and committed offsets of every partition this replica has seen."""

    def __init__(self, durable_commits: bool):
        self.durable_commits = durable_commits
        self._applied: Offsets = {}
        self._durable: Offsets = {}
        self._committed: Offsets = {}
        self._resets = 0  # resets so far: a capture's generation
        self._reset_at: dict[Partition, int] = {}  # the generation of each partition's last reset
        self._lock = threading.Lock()

    def applied(self) -> Offsets:
        """The last offset per partition that the in-memory state reflects."""
        with self._lock:
            return dict(self._applied)

    def capture(self) -> tuple[Offsets, int]:
        """The applied offsets and their generation, for :meth:`mark_durable` once they are on disk."""
        with self._lock:
            return dict(self._applied), self._resets

    def durable(self) -> Offsets:
        """The last offset per partition that the newest checkpoint reflects."""
        with self._lock:
            return dict(self._durable)

    def resume_offsets(self) -> Offsets:
        """Per partition, the last offset a restart of this state would not read again."""
        return self.durable() if self.durable_commits else self.applied()

    def all_durable(self) -> bool:
        """Whether the newest checkpoint holds everything applied."""
        with self._lock:
            return self._applied == self._durable

    def mark_applied(self, positions: Mapping[Partition, int]) -> None:
        with self._lock:
            _advance(self._applied, positions)

    def still_current(self, offsets: Mapping[Partition, int], generation: int) -> Offsets:
        """``offsets`` captured (:meth:`capture`) at ``generation``, less the partitions reset since:
        their logs no longer hold those offsets."""
        with self._lock:
            return {key: o for key, o in offsets.items() if self._reset_at.get(key, -1) <= generation}

    def mark_durable(self, offsets: Mapping[Partition, int], generation: int | None = None) -> None:
        """``offsets`` are on disk; those captured (:meth:`capture`) before their partition's reset are stale."""
        if generation is not None:
            offsets = self.still_current(offsets, generation)
        with self._lock:
            _advance(self._durable, offsets)

    def mark_assigned(self, positions: Mapping[Partition, int]) -> None:
        """The consumer was sought to ``positions``: everything before them is accounted for."""
        before = {key: position - 1 for key, position in positions.items()}
        with self._lock:
            _advance(self._applied, before)
            _advance(self._durable, before)

    def reset(self, positions: Mapping[Partition, int]) -> None:
        """The partitions' positions were reset (their logs no longer hold the old offsets):
        everything before ``positions`` counts as applied and durable, the old values are dropped
        (unlike every other update, this may move an offset back) and the next commit carries them."""
        with self._lock:
            self._resets += 1
            for key, position in positions.items():
                self._reset_at[key] = self._resets
                self._applied[key] = position - 1
                self._durable[key] = position - 1
                self._committed.pop(key, None)

    def restore(self, offsets: Mapping[Partition, int]) -> None:
        """State was loaded from a checkpoint reflecting ``offsets``."""
        with self._lock:
            self._applied = dict(offsets)
            self._durable = dict(offsets)

    def forget(self, partitions: set[Partition]) -> None:
        """Another consumer owns ``partitions`` now: what was known of them no longer applies."""
        with self._lock:
            for target in (self._applied, self._durable, self._committed):
                for key in partitions:
                    target.pop(key, None)

    def to_commit(self) -> Offsets:
        """Committable offsets that differ from what was last committed."""
        with self._lock:
            source = self._durable if self.durable_commits else self._applied
            return {key: offset for key, offset in source.items() if self._committed.get(key) != offset}

    def mark_committed(self, offsets: Mapping[Partition, int]) -> None:
        with self._lock:
            self._committed.update(offsets)


def _advance(target: Offsets, offsets: Mapping[Partition, int]) -> None:
    for key, offset in offsets.items():
        target[key] = max(target.get(key, -1), offset)
