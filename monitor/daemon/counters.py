"""The guard that counts internal errors (the tallies it keeps: :mod:`monitor.tally`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from monitor.logs import RateLimitedLog
from monitor.tally import Tally

logger = logging.getLogger(__name__)


class InternalErrors:
    """Unexpected exceptions caught inside the daemon, counted by stage (``embmon_internal_errors_total``).

    A stage is ``apply``, ``refresh:<model>``, ``on_embeddings:<component>``, ...; only the part
    before the first ``:`` becomes the label, so the label set stays bounded.
    """

    def __init__(self) -> None:
        self.counts: Tally[str] = Tally()
        self._log = RateLimitedLog(logger)

    def count(self, stage: str) -> None:
        self.counts.add(stage.split(":")[0])

    @contextlib.contextmanager
    def guard(self, stage: str) -> Iterator[None]:
        """Run the block; an exception is counted and logged (rate-limited), never raised."""
        try:
            yield
        except Exception:  # isolate failures; they are counted and logged
            self.count(stage)
            self._log.warning(f"internal:{stage}", "internal error in %s (see debug log)", stage)
            logger.debug("internal error in %s", stage, exc_info=True)
