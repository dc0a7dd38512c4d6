"""Broker outage: a TCP proxy between daemon and broker is cut and restored mid-stream."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support.broker import CLIENTS, FAST_GROUP_OPTIONS, Broker, client_settings, free_port
from tests.support.proxy import TcpProxy
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
DIM = 8
HEADERS = [("model", b"m"), ("dim", str(DIM).encode())]


def produce(broker: Broker, topic: str, rows: np.ndarray, per_message: int = 20) -> None:
    producer = broker.producer()
    for start in range(0, len(rows), per_message):
        producer.send(topic, rows[start : start + per_message].tobytes(), headers=HEADERS)
    producer.flush()
    producer.close()


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_broker_outage_flips_readiness_and_loses_or_duplicates_nothing(tmp_path: Path, client: str) -> None:
    proxy_port = free_port()
    broker = Broker(advertised_port=proxy_port).start()
    proxy = TcpProxy(broker.port, port=proxy_port).start()
    topic, group = "emb-outage", "outage-group"
    try:
        broker.create_topics(topic, partitions=2)
        rng = np.random.default_rng(3)
        first, second = rng.standard_normal((400, DIM)), rng.standard_normal((600, DIM))
        first, second = first.astype(np.float32), second.astype(np.float32)
        produce(broker, topic, first)
        settings = load_settings(
            overrides={
                "source": "kafka",
                "kafka": {
                    "bootstrap_servers": f"127.0.0.1:{proxy_port}",
                    "embeddings_topic": topic,
                    "group_id": group,
                    "auto_offset_reset": "earliest",
                    "commit_interval_seconds": 0.3,
                    "poll_timeout_seconds": 0.2,
                    "options": {**FAST_GROUP_OPTIONS, "reconnect_backoff_max_ms": 500, "request_timeout_ms": 4000},
                    **client_settings(client),
                },
                "http": {"host": "127.0.0.1", "port": 0},
                "refresh_seconds": 0.3,
                "state_dir": str(tmp_path / "state"),
            }
        )
        with daemons.monitor(settings) as monitor:
            port = monitor.http.port

            def counted() -> float | None:
                return value(scrape(port), "embmon_records_total", model="m", stream="default")

            wait_until(lambda: counted() == 400, timeout=60, message="first batch counted")
            wait_until(lambda: http_status(port, "/readyz") == 200, timeout=10, message="ready before the outage")

            proxy.cut()
            cut_at = time.monotonic()
            wait_until(lambda: http_status(port, "/readyz") == 503, timeout=30, message="readiness drops")
            samples = scrape(port)  # /metrics keeps being served
            assert value(samples, "embmon_source_up") == 0
            assert value(samples, "embmon_records_total", model="m", stream="default") == 400
            assert value(samples, "embmon_last_record_timestamp_seconds", model="m", stream="default") < time.time()
            # the outage's length is the point, not an event: it must outlast the group session (6 s
            # from the last heartbeat, at most 1 s before the cut) so that the member is evicted and
            # must rejoin; 2 s to spare
            time.sleep(max(0.0, cut_at + 8 - time.monotonic()))
            assert monitor.health()[0]
            assert http_status(port, "/healthz") == 200

            proxy.restore()
            wait_until(lambda: http_status(port, "/readyz") == 200, timeout=60, message="readiness recovers")
            produce(broker, topic, second)
            wait_until(lambda: counted() == 1000, timeout=60, message="second batch counted")
            time.sleep(2)  # the point: no duplicate shows up within 2 s (nothing to wait for)
            samples = scrape(port)
            assert value(samples, "embmon_records_total", model="m", stream="default") == 1000
            assert value(samples, "embmon_source_up") == 1
            stats = monitor.registry.get("m", "default").window.snapshot(time.time()).stats
            expected = np.concatenate([first, second]).astype(np.float64)
            np.testing.assert_allclose(stats.vector_sum, expected.sum(axis=0), rtol=1e-9, atol=1e-9)
            assert monitor.status.internal_error_counts() == {}
        del monitor  # a socket it leaked would warn in the collection below
    finally:
        proxy.stop()
        broker.stop()
        gc.collect()  # a socket leaked by a failed reconnect would warn (= fail) here, not in a later test
