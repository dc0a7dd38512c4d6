"""Stalls are visible: a consumer with records behind that applies none leaves
embmon_source_last_progress_timestamp_seconds behind (EmbeddingMonitorSourceStalled watches its
age, tests/artifacts run the rule); one that keeps up keeps it at the clock.

The stall is the real one kafka-python can get into: a partition whose records cannot be
decompressed (its codec's library missing; kafka-python's check is made to say so, as in
tests/sources/test_codecs.py, the one thing a test cannot otherwise arrange).
"""

from __future__ import annotations

import time
from pathlib import Path

import kafka.codec
import numpy as np
import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
DIM, MESSAGES = 4, 30


@pytest.mark.slow
def test_a_stalled_consumer_leaves_its_progress_time_behind_until_it_reads_again(
    broker: Broker, state_dir: Path
) -> None:
    topic = "progress-stalled"
    broker.create_topics(topic)
    producer = broker.producer(compression_type="lz4")
    rows = np.random.default_rng(8).integers(-3, 4, size=(MESSAGES, DIM)).astype(np.float32)
    for row in rows:
        producer.send(topic, row.tobytes(), headers=[("model", b"m"), ("dim", str(DIM).encode())])
    producer.flush()
    producer.close()
    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, "progress-group", state_dir))
    with pytest.MonkeyPatch.context() as no_lz4:
        no_lz4.setattr(kafka.codec, "has_lz4", lambda: False)
        with daemons.monitor(settings) as monitor:
            port = monitor.http.port
            started = time.time()

            def progress() -> float | None:
                return value(scrape(port), "embmon_source_last_progress_timestamp_seconds", topic=topic)

            def measured_after(moment: float) -> bool:
                return (value(scrape(port), "embmon_consumer_lag_timestamp_seconds") or 0) > moment

            # two lag measurements (every 5 s) with the partition stalled
            wait_until(lambda: measured_after(started + 5), timeout=30, message="lag measured twice while stalled")
            stalled = scrape(port)
            no_lz4.undo()  # the library is back: the next retry reads the partition
            recovered_at = time.time()
            wait_until(lambda: value(scrape(port), "embmon_records_total", model="m", stream="default") == MESSAGES,
                       timeout=60, message="the partition read")
            wait_until(lambda: (progress() or 0) >= recovered_at, timeout=30, message="progress noted")
            # caught up: every measurement is progress, so the time follows the clock
            caught_up = progress() or 0
            wait_until(lambda: (progress() or 0) > caught_up, timeout=30, message="progress while caught up")
            assert value(scrape(port), "embmon_consumer_lag_records", topic=topic) == 0

    behind = value(stalled, "embmon_consumer_lag_records", topic=topic)
    assert behind is not None and behind > 0
    assert value(stalled, "embmon_records_total", model="m", stream="default") is None  # none applied
    # never caught up nor applying: the time stays at the source's start, over 5 s behind the clock
    stuck = value(stalled, "embmon_source_last_progress_timestamp_seconds", topic=topic)
    assert stuck is not None and stuck <= started + 1
    assert (value(stalled, "embmon_consumer_lag_timestamp_seconds") or 0) - stuck > 5
