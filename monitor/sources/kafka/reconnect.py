"""What every Kafka consumer of the daemon keeps besides the consumer: when to try the broker
again, and the last measured lag. The embeddings source and the reducer's partials intake share it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from monitor.blocking import BlockingCall
from monitor.sources.base import MessageKind, Partition, Source

logger = logging.getLogger(__name__)

LAG_REFRESH_SECONDS = 5.0  # end offsets are a request to the broker: not on every poll
FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
CLOSE_TIMEOUT_SECONDS = 3.0  # a consumer's close (leave the group, close sockets): abandoned past this


def close_in_time(close: Callable[[], None]) -> None:
    """Run a consumer's ``close`` in a thread of its own, abandoned (and logged) past ``CLOSE_TIMEOUT_SECONDS``."""
    if not BlockingCall("embmon-kafka-close", close).wait(CLOSE_TIMEOUT_SECONDS + 0.5):
        logger.warning("the Kafka consumer did not close within %.0fs: leaving it to end with the process",
                       CLOSE_TIMEOUT_SECONDS)


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


class ConsumerReadings(Source):
    """Lag and progress as both Kafka sources (kafka-python's and librdkafka's) export them.

    Progress (``embmon_source_last_progress_timestamp_seconds``): per topic, the last time the
    consumer was caught up (lag 0) or applied records; the subclass sets the attributes below.
    """

    _kinds: dict[str, MessageKind]
    _lag: LagReading
    _progress: dict[str, float]  # topic -> unix time it was last caught up or applied records
    _applied_seen: dict[Partition, int]
    _started_at: float | None

    def _note_progress(self, lag: Mapping[str, int], applied: Mapping[Partition, int]) -> None:
        """A topic progressed when it is caught up or one of its partitions applied records since the last look."""
        now = time.time()
        moved = {t for (t, p), offset in applied.items() if offset != self._applied_seen.get((t, p))}
        self._applied_seen = dict(applied)
        for topic, behind in lag.items():
            if behind == 0 or topic in moved:
                self._progress[topic] = now

    def last_progress(self) -> dict[str, float] | None:
        """Per consumed topic, the unix time it was last caught up or applied records (the start
        before either); None before the source started."""
        if self._started_at is None:
            return None
        return {topic: self._progress.get(topic, self._started_at) for topic in self._kinds}

    def lag(self) -> dict[str, int] | None:
        return self._lag.lag

    @property
    def lag_updated(self) -> float | None:
        """Unix time of the last lag measurement."""
        return self._lag.updated
