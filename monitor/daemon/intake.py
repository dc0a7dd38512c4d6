"""The surface of what takes records in, as checkpoints and scrapes see it.

Two things take records in: the ingest pipeline (:class:`~monitor.daemon.ingest.IngestPipeline`:
source polls, decoded and applied to the streams' windows) and the reducer's partials reader
(:class:`~monitor.scaleout.intake.PartialsReader`: the partials topic, merged into its table). The
checkpointer and the daemon's status need the same few things of either, typed here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from monitor.tally import Tally

T = TypeVar("T")


class Intake(Protocol):
    """What a checkpoint captures through, and what a scrape reads of, the part that takes records in."""

    invalid: Tally[tuple[str, str]]  # records rejected, by (stream, reason)
    interactions: Tally[str]  # interaction events applied, by model

    def at_batch_boundary(self, work: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``work`` where no batch is half-applied; TimeoutError when none came within ``timeout``."""
        ...

    def commit_soon(self) -> None:
        """Commit what the newest checkpoint made durable, at the next chance."""
        ...

    def queue_depth(self) -> int: ...

    @property
    def paused(self) -> bool: ...

    def backpressure_seconds(self) -> float: ...
