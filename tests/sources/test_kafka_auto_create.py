"""``allow_auto_create_topics`` reaches the metadata requests of the clients the monitor builds.

kafka-python 3.0 accepts the option but sends every metadata request with auto-creation on, so a
consumer told not to create its topic made one of four partitions on tansu (a broker restarted
empty under a running monitor had the topic back before its owner created it with one).
"""

from __future__ import annotations

import pytest
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from monitor.sources.kafka.clients import new_consumer, new_producer
from tests.support.broker import Broker

pytestmark = [pytest.mark.broker]


def topics(broker: Broker) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def partitions(consumer: object, topic: str) -> set[int]:
    """The consumer's partitions of ``topic``; none when its metadata says the topic is unknown.
    kafka-python 3.0 says so either way: ``None`` from the cached metadata, or, when it refreshes
    them for the call, ``UnknownTopicOrPartitionError`` (the fast tier failed on that once)."""
    try:
        return set(consumer.partitions_for_topic(topic) or ())  # type: ignore[attr-defined]
    except UnknownTopicOrPartitionError:
        return set()


@pytest.mark.parametrize("allow", [False, True])
def test_a_consumer_creates_a_topic_it_reads_only_when_allowed(broker: Broker, allow: bool) -> None:
    topic = f"auto-create-consumer-{allow}"
    consumer = new_consumer({"bootstrap_servers": broker.bootstrap, "allow_auto_create_topics": allow})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        for _ in range(3):  # metadata for the assigned topic, its offsets, fetches
            consumer.poll(timeout_ms=200)
        assert bool(partitions(consumer, topic)) is allow
    finally:
        consumer.close()
    assert (topic in topics(broker)) is allow


def test_a_producer_told_not_to_create_a_topic_does_not(broker: Broker) -> None:
    topic = "auto-create-producer"
    producer = new_producer({"bootstrap_servers": broker.bootstrap, "allow_auto_create_topics": False,
                             "max_block_ms": 1000})
    try:
        with pytest.raises(KafkaTimeoutError):  # its metadata never names the topic
            producer.send(topic, b"x").get(timeout=5)
    finally:
        producer.close(timeout=2)
    assert topic not in topics(broker)
