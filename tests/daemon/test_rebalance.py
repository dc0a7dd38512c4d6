"""Two replicas in one consumer group: partitions move when a replica joins and when one leaves,
and across both replicas every record is counted exactly once (counts and exact vector sums)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.daemon.service import Monitor
from tests.support import daemons
from tests.support.broker import CLIENTS, Broker, kafka_daemon_overrides
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
DIM, PARTITIONS, MESSAGES, ROWS = 8, 4, 240, 10


def replica(broker: Broker, topic: str, group: str, state_dir: Path, client: str) -> Monitor:
    """A replica that commits every 0.3 s and polls 5 records at a time, so a hand-off falls mid-stream."""
    return Monitor(load_settings(overrides=kafka_daemon_overrides(
        broker, topic, group, state_dir, client, kafka={"commit_interval_seconds": 0.3, "max_poll_records": 5})))


def totals(monitor: Monitor) -> tuple[int, np.ndarray]:
    state = monitor.registry.get("m", "default")
    if state is None:
        return 0, np.zeros(DIM)
    with state.lock:
        stats = state.window.snapshot(time.time()).stats
    return state.records_total, stats.vector_sum.copy()


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_two_replicas_hand_partitions_over_without_double_counting(broker: Broker, tmp_path: Path, client: str) -> None:
    topic, group = f"emb-rebalance-{client}", f"rebalance-group-{client}"
    broker.create_topics(topic, partitions=PARTITIONS)
    rows = np.random.default_rng(5).standard_normal((MESSAGES, ROWS, DIM)).astype(np.float32)

    def produce() -> None:
        producer = broker.producer()
        for i in range(MESSAGES):
            producer.send(topic, rows[i].tobytes(), headers=[("model", b"m"), ("dim", str(DIM).encode())],
                          partition=i % PARTITIONS)
            if i % 8 == 0:
                producer.flush()
                time.sleep(0.5)  # pacing: the writes span the hand-off
        producer.flush()
        producer.close()

    writer = threading.Thread(target=produce, daemon=True)
    with daemons.running(replica(broker, topic, group, tmp_path / "a", client)) as a:
        writer.start()
        wait_until(lambda: totals(a)[0] > 200, timeout=40, message="replica A consuming")
        # B joins: A's partitions are revoked (hand-off), half go to B
        with daemons.running(replica(broker, topic, group, tmp_path / "b", client)) as b:
            wait_until(lambda: totals(b)[0] > 0, timeout=40, message="replica B got partitions")
            a.stop()  # leaves: B gets everything
            count_a, sum_a = totals(a)
            writer.join(timeout=60)
            expected = MESSAGES * ROWS
            wait_until(lambda: count_a + totals(b)[0] >= expected, timeout=60, message="all records counted")
            time.sleep(2)  # the point: no double-counted poll lands within 2 s (nothing to wait for)
            count_b, sum_b = totals(b)
    assert 0 < count_a < expected and 0 < count_b < expected
    assert count_a + count_b == expected
    np.testing.assert_allclose(
        sum_a + sum_b, rows.reshape(-1, DIM).astype(np.float64).sum(axis=0), rtol=1e-9, atol=1e-9
    )
    assert a.status.internal_error_counts() == {} and b.status.internal_error_counts() == {}
