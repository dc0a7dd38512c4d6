"""Reconnect backoff and lag readings shared by the Kafka source and the reducer's intake."""

from __future__ import annotations

from monitor.sources.kafka.reconnect import LAG_REFRESH_SECONDS, MAX_BACKOFF_SECONDS, Backoff, LagReading


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_to_its_cap_and_a_success_resets_it() -> None:
    clock = Clock()
    backoff = Backoff(clock)
    assert backoff.ready() and backoff.remaining() == 0.0
    waits = [backoff.failed() for _ in range(9)]
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0] and waits[-1] == MAX_BACKOFF_SECONDS
    assert not backoff.ready() and backoff.remaining() == MAX_BACKOFF_SECONDS
    clock.now += MAX_BACKOFF_SECONDS
    assert backoff.ready()
    backoff.succeeded()
    assert backoff.failed() == 0.5


def test_lag_is_measured_at_most_every_refresh_period() -> None:
    clock = Clock()
    reading = LagReading(clock)
    assert reading.lag is None and reading.updated is None
    assert reading.due()
    reading.record({"t": 3})
    assert reading.lag == {"t": 3} and reading.updated is not None
    assert not reading.due()
    clock.now += LAG_REFRESH_SECONDS
    assert reading.due() and not reading.due()
