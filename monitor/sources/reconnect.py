"""What every Kafka consumer of the daemon keeps besides the consumer: when to try the broker
again, and the last measured lag. The embeddings source and the reducer's partials intake share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

LAG_REFRESH_SECONDS = 5.0  # end offsets are a request to the broker: not on every poll
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0


class Backoff:
    """Doubling waits between attempts to reach the broker (0.5 s up to 30 s), reset by a success,
    so an unreachable broker is retried promptly at first and then without hammering it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self.wait = FIRST_BACKOFF_SECONDS
        self._next_attempt = 0.0

    def ready(self) -> bool:
        return self._clock() >= self._next_attempt

    def remaining(self) -> float:
        """Seconds until the next attempt is due (0 when it is)."""
        return max(0.0, self._next_attempt - self._clock())

    def failed(self) -> float:
        """Note a failed attempt; the seconds until the next one."""
        waited = self.wait
        self._next_attempt = self._clock() + waited
        self.wait = min(2 * waited, MAX_BACKOFF_SECONDS)
        return waited

    def succeeded(self) -> None:
        self.wait = FIRST_BACKOFF_SECONDS


class LagReading:
    """Records behind the end of each consumed topic, measured at most every LAG_REFRESH_SECONDS."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._measured_at = -LAG_REFRESH_SECONDS
        self.lag: dict[str, int] | None = None
        self.updated: float | None = None  # Unix time of the last measurement

    def due(self) -> bool:
        """True (and the clock restarts) when a new measurement should be taken."""
        now = self._clock()
        if now - self._measured_at < LAG_REFRESH_SECONDS:
            return False
        self._measured_at = now
        return True

    def record(self, lag: dict[str, int]) -> None:
        self.lag, self.updated = lag, time.time()
