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

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, overload

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import CorruptRecordError, KafkaError

from monitor.sources.kafka import internals
from monitor.sources.kafka.internals import close_failed_connect_sockets

if TYPE_CHECKING:
    from monitor.sources.kafka.rdkafka import LibrdkafkaConsumer, LibrdkafkaProducer
    from monitor.sources.settings import KafkaSettings

    Consumer: TypeAlias = KafkaConsumer | LibrdkafkaConsumer  # what a partials reader holds
    Producer: TypeAlias = KafkaProducer | LibrdkafkaProducer  # what the partials publisher holds

__all__ = ["CONSUMER_DEFAULTS", "PRODUCER_DEFAULTS", "CooperativeStickyAssignor", "CorruptRecordError", "KafkaError",
           "TopicPartition", "close_producer", "new_consumer", "new_producer"]

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
    consumer = _built(KafkaConsumer, config)
    _honour_auto_create(consumer, config)
    return consumer


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
    producer = _built(KafkaProducer, config)
    _honour_auto_create(producer, config)
    return producer


Client = TypeVar("Client", KafkaConsumer, KafkaProducer)


def _built(kind: type[Client], config: Mapping[str, Any]) -> Client:
    """``kind(**config)``, whose sockets are closed when they are done with, not left to the collector.

    A refused connection attempt's socket is closed when it fails (kafka-python 3.0 left it open:
    :func:`~monitor.sources.kafka.internals.close_failed_connect_sockets`, applied here for every
    client, not only the source's). A constructor that raises (its bootstrap: no broker answered
    in time) closes the network client it had built, with its selector's wake-up sockets."""
    close_failed_connect_sockets()
    built: list[Any] = []
    make = config.get("kafka_client") or kind.DEFAULT_CONFIG["kafka_client"]

    def kafka_client(**options: Any) -> Any:
        built.append(make(**options))
        return built[-1]

    try:
        return kind(**{**config, "kafka_client": kafka_client})
    except BaseException:
        for client in built:
            client.close()
        raise


THREAD_END_SECONDS = 1.0  # close_producer: the least it waits for a force-closed I/O thread to end


def close_consumer(consumer: Consumer) -> None:
    """Close either client's consumer without committing. kafka-python's network client is closed even
    when leaving the group raised (:func:`monitor.sources.kafka.internals.close_consumer`); the close's
    own exception propagates."""
    if isinstance(consumer, KafkaConsumer):
        internals.close_consumer(consumer)
    else:
        consumer.close(autocommit=False)


def close_producer(producer: Producer, timeout: float) -> None:
    """Close ``producer``, waiting up to about ``timeout`` seconds for its pending records, and stop its
    I/O thread even when they cannot be delivered; the whole close takes about ``timeout`` at most.

    kafka-python's ``close`` flushes first, and when the records cannot be delivered (the broker is
    gone) the flush raises ``KafkaTimeoutError`` before the I/O thread is told to stop: that thread
    then retries for the life of the process, with its sockets, one more for every producer a
    failing publisher drops. On that error the I/O thread is force-closed (the pending records fail,
    as a close that cannot wait means) and joined, and the close finished. librdkafka's producer
    has no such thread of ours to stop."""
    deadline = time.monotonic() + timeout  # the whole close, the forced part included
    transports = internals.client_transports(getattr(getattr(producer, "_sender", None), "_client", None))
    try:
        producer.close(timeout=timeout)
    except KafkaError:
        sender = getattr(producer, "_sender", None)  # kafka-python's I/O thread
        if sender is None:
            raise
    else:
        # a close whose join ran out force-closes the thread and returns: it ends at its next loop,
        # moments later, unless the machine is busy; what is left of the deadline, a second at least
        sender = getattr(producer, "_sender", None)
        if sender is not None and sender.is_alive():
            sender.join(max(THREAD_END_SECONDS, deadline - time.monotonic()))
        internals.close_sockets(transports)
        return
    sender.force_close()
    sender.join(max(THREAD_END_SECONDS, deadline - time.monotonic()))
    producer.close(timeout=0)  # the aborted records are done now: the flush passes, the rest is released
    internals.close_sockets(transports)
    internals.close_abandoned_sockets(getattr(sender, "_client", None))


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
