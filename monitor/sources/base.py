"""The source interface: what the daemon polls, commits to, and tells about partition moves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from monitor.decoding.records import SourcePosition

MessageKind = Literal["embeddings", "interactions"]
Partition = tuple[str, int]  # (topic, partition)
Offsets = dict[Partition, int]  # partition -> an offset (the last one a state reflects, or where to read next)


@dataclass(frozen=True, slots=True)
class SourceMessage:
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    kind: MessageKind
    position: SourcePosition | None = None
    # Why the client could not read this record (``bad_header``, ``corrupt_record``; value and headers
    # are then empty): the daemon counts it in embmon_records_invalid_total and moves past it.
    unreadable: str | None = None


class PartitionListener:
    """What a source with partition ownership (a Kafka consumer group) asks of the daemon.

    The daemon passes one to :meth:`Source.set_listener`; the defaults describe a daemon that
    keeps no offsets, so a source works without one.
    """

    def on_revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        """Partitions are leaving this replica: make the state reflect everything polled from them
        (blocking; called off the poll thread) and return, per partition, the last offset to commit."""
        return {}

    def on_assigned(self, positions: Mapping[Partition, int]) -> None:
        """The consumer was sought to ``positions`` (next offset to read) on assignment."""

    def on_reset(self, positions: Mapping[Partition, int]) -> None:
        """The consumer's positions were found outside their logs and moved to ``positions``
        (called on the poll thread): what is kept for these partitions is replaced."""

    def resume_offsets(self) -> dict[Partition, int]:
        """Per partition, the last offset the restorable state reflects (where to resume after)."""
        return {}

    def applied_offsets(self) -> dict[Partition, int]:
        """Per partition, the last offset the in-memory state reflects (for lag)."""
        return {}


class Source:
    """Base class: a poll-based stream of messages with commit support."""

    name = "source"
    listener: PartitionListener = PartitionListener()

    def set_listener(self, listener: PartitionListener) -> None:
        """Who to tell about partition revocation and assignment (before :meth:`start`)."""
        self.listener = listener

    def start(self) -> None:
        """Connect/open. May raise on unrecoverable configuration errors only."""

    def poll(self, timeout: float) -> list[SourceMessage]:
        """Messages available within ``timeout`` seconds (possibly none)."""
        raise NotImplementedError

    def commit(self, offsets: Mapping[Partition, int]) -> bool:
        """Record that state reflects everything up to and including these offsets.

        False when the commit was refused (it is retried with the next one)."""
        return True

    def close(self) -> None:
        """Release connections."""

    @property
    def up(self) -> bool:
        """Whether the source is currently connected and readable."""
        return True

    @property
    def exhausted(self) -> bool:
        """True when a finite source has nothing more to give (file replay finished)."""
        return False

    def lag(self) -> dict[str, int] | None:
        """Records not yet consumed, per topic, when the source can tell."""
        return None

    @property
    def lag_updated(self) -> float | None:
        """Unix time :meth:`lag` was last measured, when the source measures it."""
        return None

    def error_counts(self) -> dict[str, int]:
        """Failed reads by reason (``embmon_source_errors_total``); empty for a source that has none."""
        return {}

    def offset_reset_counts(self) -> dict[str, int]:
        """Positions found outside their logs and reset, by reason (``embmon_source_offset_resets_total``)."""
        return {}

    def last_progress(self) -> dict[str, float] | None:
        """Per topic, the unix time the source was last caught up or applied records, when it tells."""
        return None

    def topic_ids(self) -> dict[str, str]:
        """The id of each topic as last seen (checkpointed, so a recreated topic is told after a restart)."""
        return {}

    def remember_topic_ids(self, ids: Mapping[str, str]) -> None:
        """The topic ids a restored checkpoint holds (before :meth:`start`)."""

    def pause(self) -> None:
        """Stop fetching while polling goes on (backpressure); a no-op where nothing is fetched ahead."""

    def resume(self) -> None:
        """Fetch again after :meth:`pause`."""
