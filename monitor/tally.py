"""Thread-safe tallies: counts by key that one thread writes and another reads.

Counts are written by the ingest, source and job threads and read at scrape time; each tally has
its own lock, held only for a dict update or copy. Shared by the daemon, the sources, the state
directory's files and the scale-out roles, so it lives below all of them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

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
