"""Thread-safe tallies the daemon keeps and collectors read, and the guard that counts internal errors.

Counts are written by the ingest and job threads and read at scrape time; each tally has its own
lock, held only for a dict update or copy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping
from typing import Generic, TypeVar

from monitor.logs import RateLimitedLog

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class Tally(Generic[K]):
    """Counts by key (a label value or a tuple of them), safe to update and read from any thread."""

    def __init__(self) -> None:
        self._counts: Counter[K] = Counter()
        self._lock = threading.Lock()

    def add(self, key: K, amount: int = 1) -> None:
        with self._lock:
            self._counts[key] += amount

    def update(self, counts: Mapping[K, int]) -> None:
        with self._lock:
            self._counts.update(counts)

    def replace(self, counts: Mapping[K, int]) -> None:
        """Start over from ``counts`` (checkpoint restore)."""
        with self._lock:
            self._counts = Counter(counts)

    def snapshot(self) -> dict[K, int]:
        with self._lock:
            return dict(self._counts)


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
