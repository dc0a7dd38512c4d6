"""Every kafka-python client the monitor builds, typed: the source's consumer, the replicas' partials
producer, and the consumers that read the partials topic (the reducer's intake, a replica's resume
reader, a replica's look at its group's commits).

One factory for each kind, so a caller holds a ``KafkaConsumer`` or a ``KafkaProducer``, never an
``Any``, and the option names each kind takes come from one place (kafka-python's own defaults).
The librdkafka source builds its consumer in :mod:`monitor.sources.kafka.confluent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer

CONSUMER_DEFAULTS: Mapping[str, Any] = KafkaConsumer.DEFAULT_CONFIG  # the option names a consumer takes
PRODUCER_DEFAULTS: Mapping[str, Any] = KafkaProducer.DEFAULT_CONFIG  # and a producer


def new_consumer(config: Mapping[str, Any]) -> KafkaConsumer:
    """A kafka-python consumer with ``config`` (its bootstrap may wait for a broker: run it where a stop
    request need not wait, :class:`~monitor.blocking.BlockingCall`)."""
    return KafkaConsumer(**config)


def new_producer(config: Mapping[str, Any]) -> KafkaProducer:
    """A kafka-python producer with ``config``."""
    return KafkaProducer(**config)
