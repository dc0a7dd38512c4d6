"""A burst far above what applying can sustain (a deliberately slow component): fetching pauses
instead of blocking the poll loop, so the group keeps the member past max_poll_interval; the
queue stays bounded; scrapes stay fast; lag is exported; every record is counted exactly once."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from monitor.component import Component
from monitor.config import load_settings
from monitor.daemon.ingest import APPLY_QUEUE_POLLS
from monitor.daemon.service import Monitor
from monitor.decoding.records import EmbeddingBatch
from tests.support import daemons
from tests.support.broker import FAST_GROUP_OPTIONS, Broker
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
DIM, MESSAGES, ROWS = 16, 400, 10


class Slow(Component):
    name = "slow"

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        time.sleep(0.3)  # the point: a slow consumer, ~30 records per second, far below the burst's rate


@pytest.mark.slow
def test_burst_backpressures_without_eviction_loss_or_slow_scrapes(broker: Broker, tmp_path: Path) -> None:
    topic, group = "emb-burst", "burst-group"
    broker.create_topics(topic)
    producer = broker.producer()
    rows = np.random.default_rng(8).standard_normal((MESSAGES, ROWS, DIM)).astype(np.float32)
    for i in range(MESSAGES):
        producer.send(topic, rows[i].tobytes(), headers=[("model", b"m"), ("dim", str(DIM).encode())])
    producer.flush()
    producer.close()
    settings = load_settings(
        overrides={
            "source": "kafka",
            "kafka": {"bootstrap_servers": broker.bootstrap, "embeddings_topic": topic, "group_id": group,
                      "auto_offset_reset": "earliest", "commit_interval_seconds": 0.5, "poll_timeout_seconds": 0.2,
                      "max_poll_records": 10, "options": dict(FAST_GROUP_OPTIONS)},
            "http": {"host": "127.0.0.1", "port": 0},
            "refresh_seconds": 0.5,
            "state_dir": str(tmp_path / "state"),
        }
    )
    monitor = Monitor(settings, component_factories=[lambda ctx: Slow()])
    assignments: list[dict] = []
    listener = monitor.source.listener
    on_assigned = listener.on_assigned
    listener.on_assigned = lambda positions: (assignments.append(positions), on_assigned(positions))  # type: ignore[method-assign]
    latencies, depths, paused, lags = [], [], [], []

    def sample_until_all_counted() -> bool:
        started = time.perf_counter()
        samples = scrape(monitor.http.port)
        latencies.append(time.perf_counter() - started)
        depths.append(monitor.status.queue_depth())
        paused.append(value(samples, "embmon_ingest_paused"))
        lags.append(value(samples, "embmon_consumer_lag_records", topic=topic))
        return value(samples, "embmon_records_total", model="m", stream="default") == MESSAGES * ROWS

    with daemons.running(monitor):
        wait_until(sample_until_all_counted, timeout=90, interval=0.1, message="every record of the burst counted")
        time.sleep(1.0)  # the point: no extra record and no re-join shows up within 1 s (nothing to wait for)
        samples = scrape(monitor.http.port)
        backpressure = value(samples, "embmon_ingest_backpressure_seconds_total")
    assert value(samples, "embmon_records_total", model="m", stream="default") == MESSAGES * ROWS
    assert len(assignments) == 1  # never evicted and re-joined, although paused far longer than 3 s
    assert backpressure is not None and backpressure > FAST_GROUP_OPTIONS["max_poll_interval_ms"] / 1000
    assert 1.0 in paused
    assert max(depths) <= APPLY_QUEUE_POLLS + 2
    assert max(latencies) < 1.0, max(latencies)
    assert max(v for v in lags if v is not None) > 100  # the backlog is visible as lag (in Kafka records)
    assert (value(samples, "embmon_consumer_lag_timestamp_seconds") or 0) > time.time() - 60  # and fresh
    print(f"\nscrape latency under burst: max {max(latencies) * 1000:.0f} ms, "
          f"median {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms over {len(latencies)} scrapes; "
          f"paused {backpressure:.1f} s; max queue {max(depths)} polls")
