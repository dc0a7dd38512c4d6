"""Every kafka-python client the monitor builds, typed: the source's consumer, the replicas' partials
producer, and the consumers that read the partials topic (the reducer's intake, a replica's resume
reader, a replica's look at its group's commits).

One factory for each kind, so a caller holds a ``KafkaConsumer`` or a ``KafkaProducer``, never an
``Any``, and the option names each kind takes come from one place (kafka-python's own defaults).
The librdkafka source builds its consumer in :mod:`monitor.sources.confluent`.
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
    consumer = KafkaConsumer(**config)
    _honour_auto_create(consumer, config)
    return consumer


def new_producer(config: Mapping[str, Any]) -> KafkaProducer:
    """A kafka-python producer with ``config``."""
    producer = KafkaProducer(**config)
    _honour_auto_create(producer, config)
    return producer


def _honour_auto_create(client: KafkaConsumer | KafkaProducer, config: Mapping[str, Any]) -> None:
    """Pass ``allow_auto_create_topics`` on to the client's metadata requests.

    kafka-python 3.0 takes the option but builds its cluster metadata without it, so every metadata
    request asks the broker to create a topic it does not know (tansu then makes one of four partitions):
    a topic deleted or emptied under a running monitor came back before its owner created it. The
    client's cluster metadata is set here to what the settings say (its default, True, otherwise)."""
    cluster = getattr(client, "_cluster", None) or getattr(client, "_metadata", None)  # consumer, producer
    cluster_config = getattr(cluster, "config", None)
    if isinstance(cluster_config, dict):
        cluster_config["allow_auto_create_topics"] = bool(config.get("allow_auto_create_topics", True))
