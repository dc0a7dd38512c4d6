"""A broker that comes back with an emptied log, with both clients.

tansu with memory storage restarted on the same port is such a broker: its topics, records and the
group's committed offsets are gone. The daemon keeps running; its checkpoint says partition 0 was
read up to offset 299. When the topic is created again and written, offsets start at 0: a resume
position of 300 lies past the new log's end, and must be reset (``past_end``) before the new
records arrive, or the first 300 of them are skipped. librdkafka's cached high watermark still said
300 from before the restart, and ``_verify`` trusted it (400 of 700 counted); it now trusts only a
watermark from a fetch made after the assignment, or a fresh listing of the partition's offsets.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support.broker import CLIENTS, Broker, kafka_daemon_overrides
from tests.support.producers import produce_rows as produce
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_broker_back_with_an_emptied_log_has_every_new_record_counted(
    client: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Broker().start()
    topic, group = f"emb-emptied-{client}", f"emptied-{client}"
    try:
        broker.create_topics(topic)
        produce(broker, topic, 300, seed=1)
        settings = load_settings(overrides=kafka_daemon_overrides(
            broker, topic, group, tmp_path / "state", client=client,
            # the test creates the topic again, with one partition: the consumer must not create it first (tansu
            # would make four); kafka-python sent its metadata requests with auto-creation on whatever this said
            # until the client factory passed it on (tests/sources/test_kafka_auto_create.py)
            kafka={"commit_interval_seconds": 0.3, "options": {"allow_auto_create_topics": False}},
            checkpoint={"interval_seconds": 0.3}))  # fmt: skip
        with daemons.monitor(settings) as monitor:
            port = monitor.http.port

            def counted() -> float | None:
                return value(scrape(port), "embmon_records_total", model="m", stream="default")

            def resets() -> float:
                samples = scrape(port)
                return sum(value(samples, "embmon_source_offset_resets_total", reason=r) or 0
                           for r in ("past_end", "topic_recreated", "before_start"))

            wait_until(lambda: counted() == 300, timeout=60, message="the first log counted")
            wait_until(lambda: broker.committed(group, topic) == 300, timeout=20, message="its offsets committed")
            with caplog.at_level(logging.INFO, logger="monitor.sources"):
                caplog.clear()
                broker.stop()
                if client == "confluent":
                    # down past the group session: librdkafka drops the partition, so no fetch refreshes
                    # what it caches about it before it is assigned again (the case that skipped records)
                    wait_until(lambda: "partitions lost" in caplog.text, timeout=60, message="the partition lost")
                else:  # kafka-python notices no lost session without a coordinator: the broker seen down
                    wait_until(lambda: value(scrape(port), "embmon_source_up") == 0, timeout=60,
                               message="the broker seen down")  # fmt: skip
                broker = Broker(port=broker.port).start()  # the same address, nothing in it
                broker.create_topics(topic)
                # the daemon finds its position (300) past the new, empty log's end, and resets it
                # (kafka-python also tells a recreated topic by its id)
                wait_until(lambda: resets() == 1, timeout=60, message="the position past the emptied log reset")
            produce(broker, topic, 700, seed=2)
            wait_until(lambda: counted() == 1000, timeout=60, message="every record of the new log counted")
            wait_until(lambda: broker.committed(group, topic) == 700, timeout=20, message="the new log's end committed")
            wait_until(lambda: value(scrape(port), "embmon_consumer_lag_records", topic=topic) == 0, timeout=20,
                       message="lag 0 on the new log")
            assert counted() == 1000  # nothing of the new log skipped, nothing counted twice
    finally:
        broker.stop()
