"""Where records come from. The daemon only sees :class:`Source`; it never knows which one runs.

A source yields :class:`SourceMessage` batches from ``poll``, each message tagged with the kind of
stream it belongs to (``embeddings`` or ``interactions``) and, for Kafka, its position, so that the
daemon can commit exactly the offsets its state reflects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from monitor.records import SourcePosition

if TYPE_CHECKING:
    from monitor.config import Settings

MessageKind = Literal["embeddings", "interactions"]


@dataclass(frozen=True, slots=True)
class SourceMessage:
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    kind: MessageKind
    position: SourcePosition | None = None


class Source:
    """Base class: a poll-based stream of messages with commit support."""

    name = "source"

    def start(self) -> None:
        """Connect/open. May raise on unrecoverable configuration errors only."""

    def poll(self, timeout: float) -> list[SourceMessage]:
        """Messages available within ``timeout`` seconds (possibly none)."""
        raise NotImplementedError

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record that state reflects everything up to and including these offsets."""

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


def build_source(settings: Settings) -> Source:
    """The source the settings ask for."""
    if settings.source == "kafka":
        from monitor.sources.kafka import KafkaSource

        return KafkaSource(settings.kafka)
    if settings.source == "file":
        from monitor.sources.file import FileSource

        return FileSource(settings.file)
    from monitor.sources.synthetic import SyntheticSource

    return SyntheticSource(settings.synthetic)
