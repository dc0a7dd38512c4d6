"""Transactional producers: the daemon reads committed data (``read_committed`` by default), counts a
transactional producer's committed records exactly, and its lag reads 0 past the trailing commit
marker (the marker takes an offset but holds no record).

Aborted transactions cannot be tested here: tansu 0.6 returns an aborted transaction's records
even to a ``read_committed`` consumer (checked with kafka-python's own consumer: the records of an
aborted transaction come back at either isolation level), so a test that they are skipped would
test the broker. What is tested instead is that the setting reaches the consumer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from monitor.config import load_settings
from monitor.errors import ConfigError
from monitor.sources.kafka.source import KafkaSource
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.paths import REPO
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

DIM, TRANSACTIONS, PER_TRANSACTION = 4, 3, 40


def kafka_settings(**kafka: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides={"source": "kafka", "kafka": kafka})


def test_the_consumer_reads_committed_data_unless_told_otherwise() -> None:
    config = KafkaSource(kafka_settings().kafka).consumer_config()
    assert config["isolation_level"] == "read_committed"
    # kafka.auto_offset_reset is the daemon's to apply (monitor/sources/kafka/positions.py)
    assert config["auto_offset_reset"] == "none" and config["enable_auto_commit"] is False
    uncommitted = kafka_settings(options={"isolation_level": "read_uncommitted"}).kafka
    assert KafkaSource(uncommitted).consumer_config()["isolation_level"] == "read_uncommitted"
    with pytest.raises(ConfigError, match=r"kafka\.options\.isolation_level: 'committed' is not read_committed"):
        KafkaSource(kafka_settings(options={"isolation_level": "committed"}).kafka)


def test_a_bad_isolation_level_stops_the_cli_with_one_line_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "run", "--bootstrap-servers", "127.0.0.1:1", "--metrics-port", "0",
         "--state-dir", str(tmp_path), "--kafka-option", "isolation_level=committed"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "embedding-monitor: kafka.options.isolation_level: 'committed' is not read_committed or read_uncommitted"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.broker
def test_a_transactional_producers_committed_records_are_counted_exactly_and_lag_reads_0(
    broker: Broker, state_dir: Path
) -> None:
    topic, group = "emb-transactions", "transactions-group"
    broker.create_topics(topic)
    rows = np.random.default_rng(4).standard_normal((TRANSACTIONS, PER_TRANSACTION, DIM)).astype(np.float32)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="embmon-test-tx", linger_ms=5)
    try:
        producer.init_transactions()
        for batch in rows:
            producer.begin_transaction()
            for row in batch:
                producer.send(topic, row.tobytes(), headers=[("model", b"m"), ("dim", str(DIM).encode())])
            producer.commit_transaction()
    finally:
        producer.close()
    records = TRANSACTIONS * PER_TRANSACTION
    tp = TopicPartition(topic, 0)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed")
    try:
        end = reader.end_offsets([tp])[tp]
    finally:
        reader.close()
    assert end == records + TRANSACTIONS  # each commit left a marker: the log ends one past the last record

    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, group, state_dir))
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port

        def caught_up() -> bool:
            samples = scrape(port)
            return (value(samples, "embmon_records_total", model="m", stream="default") == records
                    and value(samples, "embmon_consumer_lag_records", topic=topic) == 0)

        # the lag is measured every 5 s: a reading taken after every record was applied must be 0
        wait_until(caught_up, timeout=60, message="every committed record counted and the lag 0 past the marker")
        stats = monitor.registry.get("m", "default").window.snapshot(monitor.clock()).stats
        np.testing.assert_allclose(stats.vector_sum, rows.reshape(-1, DIM).astype(np.float64).sum(axis=0), rtol=1e-9)
        # the position the group commits is past the trailing marker too
        wait_until(lambda: broker.committed(group, topic) == end, timeout=30, message="the commit past the marker")
