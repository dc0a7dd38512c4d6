"""Every Kafka client the monitor builds, typed: the source's consumer, the replicas' partials
producer, and the consumers that read the partials topic (the reducer's intake, a replica's resume
reader, a replica's look at its group's commits), and the few kafka-python names the scale-out
roles use (partitions, errors, the cooperative assignor), so that nothing outside
``monitor/sources/kafka/`` imports a Kafka client library.

One factory for each kind, so a caller holds a :data:`Consumer` or a :data:`Producer`, never an
``Any``, and the option names each kind takes come from one place (kafka-python's own defaults).
Given the settings' ``kafka`` section with ``client: confluent``, the factories build the same
kind of client on librdkafka (:mod:`monitor.sources.kafka.rdkafka`: the kafka-python options
translated, ``kafka.librdkafka`` on top), so a replica or a reducer runs one client library, built
from one set of options. The librdkafka source builds its consumer in :mod:`monitor.sources.kafka.confluent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, overload

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import CorruptRecordError, KafkaError

if TYPE_CHECKING:
    from monitor.sources.kafka.rdkafka import LibrdkafkaConsumer, LibrdkafkaProducer
    from monitor.sources.settings import KafkaSettings

    Consumer: TypeAlias = KafkaConsumer | LibrdkafkaConsumer  # what a partials reader holds
    Producer: TypeAlias = KafkaProducer | LibrdkafkaProducer  # what the partials publisher holds

__all__ = ["CONSUMER_DEFAULTS", "PRODUCER_DEFAULTS", "CooperativeStickyAssignor", "CorruptRecordError", "KafkaError",
           "TopicPartition", "new_consumer", "new_producer"]

CONSUMER_DEFAULTS: Mapping[str, Any] = KafkaConsumer.DEFAULT_CONFIG  # the option names a consumer takes
PRODUCER_DEFAULTS: Mapping[str, Any] = KafkaProducer.DEFAULT_CONFIG  # and a producer


@overload
def new_consumer(config: Mapping[str, Any]) -> KafkaConsumer: ...
@overload
def new_consumer(config: Mapping[str, Any], kafka: KafkaSettings) -> Consumer: ...
def new_consumer(config: Mapping[str, Any], kafka: KafkaSettings | None = None) -> Consumer:
    """A consumer with ``config`` (kafka-python's option names): kafka-python's, or librdkafka's when
    ``kafka`` says ``client: confluent``. Its bootstrap may wait for a broker: run it where a stop
    request need not wait, :class:`~monitor.blocking.BlockingCall`."""
    if kafka is not None and kafka.client == "confluent":
        from monitor.sources.kafka.rdkafka import LibrdkafkaConsumer, consumer_properties

        return LibrdkafkaConsumer(consumer_properties(config, kafka))
    return KafkaConsumer(**config)


@overload
def new_producer(config: Mapping[str, Any]) -> KafkaProducer: ...
@overload
def new_producer(config: Mapping[str, Any], kafka: KafkaSettings) -> Producer: ...
def new_producer(config: Mapping[str, Any], kafka: KafkaSettings | None = None) -> Producer:
    """A producer with ``config`` (kafka-python's option names): kafka-python's, or librdkafka's when
    ``kafka`` says ``client: confluent``."""
    if kafka is not None and kafka.client == "confluent":
        from monitor.sources.kafka.rdkafka import LibrdkafkaProducer, producer_properties

        return LibrdkafkaProducer(producer_properties(config, kafka))
    return KafkaProducer(**config)
