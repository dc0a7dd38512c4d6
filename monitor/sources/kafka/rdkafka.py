"""The scale-out roles' Kafka clients on librdkafka (``kafka.client: confluent``), in kafka-python's shape.

A replica or a reducer on ``client: confluent`` builds every client from the same options, on the
same library: its source (:mod:`monitor.sources.kafka.confluent`), and here the partials producer
and the readers of the partials topic (the reducer's intake, a replica's resume reader, its look
at the group's commits). Each wraps a ``confluent_kafka`` client behind the few kafka-python
methods those callers use (assign, seek, poll, position, end offsets, offsets by time, send,
flush), with kafka-python's partition and error types, so that one caller serves both libraries.

The options are the kafka-python ones the callers build (:func:`consumer_properties`,
:func:`producer_properties`): each is translated to its librdkafka property
(:data:`~monitor.sources.kafka.options.LIBRDKAFKA_NAMES`, or its producer or fetch equivalent
below), then ``kafka.librdkafka`` is set on top, as for the source.

Where librdkafka and kafka-python differ:

* a position librdkafka does not know yet (nothing fetched since an assignment or a seek) is
  resolved as kafka-python resolves it: a seek's target, else the log's start or end by the
  reset policy (``auto_offset_reset``);
* a record whose headers cannot be read (a header key that is not UTF-8) stands in the poll with
  no key or value and :class:`~monitor.sources.kafka.internals.UnreadableRecord` headers, as
  kafka-python's reader does once :func:`~monitor.sources.kafka.internals.read_unreadable_records`
  is installed: counted and skipped by the caller;
* an error librdkafka reports from a poll is raised as kafka-python's ``KafkaError`` when fatal,
  and logged otherwise (librdkafka retries by itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, Message, Producer, libversion
from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import TopicPartition as RdPartition
from kafka import TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError

from monitor.sources.kafka.confluent import message_headers
from monitor.sources.kafka.internals import UnreadableRecord
from monitor.sources.kafka.options import LIBRDKAFKA_NAMES
from monitor.sources.settings import KafkaSettings

logger = logging.getLogger(__name__)

QUERY_TIMEOUT_SECONDS = 10.0  # metadata, watermarks, offsets by time, committed offsets
FETCH_MAX_BYTES = 52_428_800  # librdkafka's default fetch.max.bytes; never set below it
RECEIVE_MAX_BYTES = 100_000_000  # librdkafka's default receive.message.max.bytes

# kafka-python option -> librdkafka property, for the options the callers set themselves (the ones a
# user may pass through kafka.options are in LIBRDKAFKA_NAMES)
_CONSUMER_NAMES = {
    "client_id": "client.id",
    "group_id": "group.id",
    "enable_auto_commit": "enable.auto.commit",
    "auto_offset_reset": "auto.offset.reset",
    "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "fetch_max_bytes": "fetch.max.bytes",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
}
_PRODUCER_NAMES = {
    "client_id": "client.id",
    "acks": "acks",
    "linger_ms": "linger.ms",
    "max_request_size": "message.max.bytes",
    "delivery_timeout_ms": "message.timeout.ms",
    "request_timeout_ms": "request.timeout.ms",
}
# kafka-python options with no librdkafka counterpart the callers set (librdkafka never blocks a send)
_NOT_TRANSLATED = {"max_block_ms", "partition_assignment_strategy", "bootstrap_servers", "max_poll_records"}
# librdkafka consumer properties kafka.librdkafka may hold that a producer refuses outright
_CONSUMER_ONLY = frozenset({"partition.assignment.strategy", "group.instance.id", "isolation.level"})


def _translated(config: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"bootstrap.servers": ",".join(config["bootstrap_servers"])}
    for key, value in config.items():
        if key in _NOT_TRANSLATED or value is None:
            continue
        if key == "ssl_check_hostname":
            value = "https" if value else "none"
        elif key == "api_version" and isinstance(value, (tuple, list)):
            value = ".".join(str(v) for v in value)
        elif key == "auto_offset_reset" and value == "none":
            value = "error"  # kafka-python's "raise, do not reset"
        name = names.get(key) or LIBRDKAFKA_NAMES.get(key)
        if name is None:
            raise ValueError(f"kafka option {key!r} has no librdkafka equivalent (kafka.client: confluent)")
        out[name] = value
    return out


def consumer_properties(config: Mapping[str, Any], kafka: KafkaSettings) -> dict[str, Any]:
    """librdkafka consumer properties for a kafka-python consumer ``config``, ``kafka.librdkafka`` on top.

    >>> from monitor.sources.settings import KafkaSettings
    >>> props = consumer_properties({"bootstrap_servers": ["a:9092", "b:9092"], "client_id": "r", "group_id": "g",
    ...     "enable_auto_commit": False, "auto_offset_reset": "earliest", "ssl_check_hostname": False,
    ...     "partition_assignment_strategy": (object,)}, KafkaSettings(client="confluent"))
    >>> [props[k] for k in ("bootstrap.servers", "group.id", "auto.offset.reset", "partition.assignment.strategy",
    ...                     "ssl.endpoint.identification.algorithm")]
    ['a:9092,b:9092', 'g', 'earliest', 'cooperative-sticky', 'none']
    """
    props = _translated(config, _CONSUMER_NAMES)
    props.setdefault("group.id", f"{config.get('client_id') or 'embmon'}-unjoined")  # assign() only: never joins
    props["fetch.max.bytes"] = max(int(props.get("fetch.max.bytes", 0)), FETCH_MAX_BYTES)
    props.update(kafka.librdkafka)
    if config.get("partition_assignment_strategy"):  # the reducer group's: cooperative, as with kafka-python
        props["partition.assignment.strategy"] = "cooperative-sticky"
    props["receive.message.max.bytes"] = max(int(props.get("receive.message.max.bytes", RECEIVE_MAX_BYTES)),
                                             int(props["fetch.max.bytes"]) + 512)
    props["enable.auto.commit"] = False  # the positions are the callers' (checkpoints, manifests)
    return props


def producer_properties(config: Mapping[str, Any], kafka: KafkaSettings) -> dict[str, Any]:
    """librdkafka producer properties for a kafka-python producer ``config``, ``kafka.librdkafka`` on top.

    >>> from monitor.sources.settings import KafkaSettings
    >>> props = producer_properties({"bootstrap_servers": ["a:9092"], "acks": "all", "max_request_size": 2_000_000,
    ...     "delivery_timeout_ms": 10_000, "max_block_ms": 10_000}, KafkaSettings(client="confluent"))
    >>> [props[k] for k in ("acks", "message.max.bytes", "message.timeout.ms")], "max_block_ms" in str(props)
    (['all', 2000000, 10000], False)
    """
    props = _translated(config, _PRODUCER_NAMES)
    props.update({key: value for key, value in kafka.librdkafka.items() if key not in _CONSUMER_ONLY})
    return props


class OffsetAndTimestamp(NamedTuple):
    """kafka-python's answer to an offset lookup by time (the timestamp is the one asked for)."""

    offset: int
    timestamp: int


@dataclass(frozen=True)
class Fetched:
    """One record of a poll, with kafka-python's attribute names."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = -1


def _fetched(message: Message) -> Fetched:
    topic, partition, offset = str(message.topic()), int(message.partition() or 0), int(message.offset() or 0)
    try:
        # through the checked call (see message_headers): a key that is not UTF-8 raises here, and
        # its broken list (a NULL key) is never touched
        headers = [(str(k), bytes(v or b"")) for k, v in (message_headers(message) or ())]
    except Exception:  # noqa: BLE001 - a header key that is not UTF-8: this record alone, counted by the caller
        return Fetched(topic, partition, offset, None, None, UnreadableRecord("bad_header"))
    key, value = message.key(), message.value()
    return Fetched(topic, partition, offset, key if isinstance(key, bytes) else None,
                   value if isinstance(value, bytes) else None, headers, int(message.timestamp()[1]))


def _raise(exc: KafkaException) -> KafkaError:
    return KafkaError(str(exc))


class LibrdkafkaConsumer:
    """A ``confluent_kafka.Consumer`` behind the kafka-python consumer methods the partials readers use."""

    def __init__(self, properties: Mapping[str, Any]):
        self.reset = str(properties.get("auto.offset.reset", "latest"))
        try:
            self._consumer = Consumer(dict(properties))
        except KafkaException as exc:
            raise _raise(exc) from exc
        logger.info("Kafka consumer %s on librdkafka %s", properties.get("client.id"), libversion()[0])
        self._targets: dict[tuple[str, int], int] = {}  # a seek's target, until a record is read there
        self._next: dict[tuple[str, int], int] = {}  # after the last record read
        self._assigned: list[tuple[str, int]] = []

    # ------------------------------------------------------------------ metadata
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        try:
            listed = self._consumer.list_topics(timeout=QUERY_TIMEOUT_SECONDS).topics.get(topic)
        except KafkaException as exc:
            raise _raise(exc) from exc
        if listed is None or listed.error is not None:
            return None
        return set(listed.partitions)

    def end_offsets(self, partitions: Iterable[Any]) -> dict[Any, int]:
        return {tp: self._watermarks(tp)[1] for tp in partitions}

    def beginning_offsets(self, partitions: Iterable[Any]) -> dict[Any, int]:
        return {tp: self._watermarks(tp)[0] for tp in partitions}

    def _watermarks(self, tp: Any) -> tuple[int, int]:
        try:
            low, high = self._consumer.get_watermark_offsets(RdPartition(tp[0], tp[1]), timeout=QUERY_TIMEOUT_SECONDS,
                                                             cached=False)
        except KafkaException as exc:
            raise _raise(exc) from exc
        return int(low), int(high)

    def offsets_for_times(self, timestamps: Mapping[Any, int]) -> dict[Any, OffsetAndTimestamp | None]:
        asked = [RdPartition(tp[0], tp[1], int(ms)) for tp, ms in timestamps.items()]
        try:
            found = self._consumer.offsets_for_times(asked, timeout=QUERY_TIMEOUT_SECONDS)
        except KafkaException as exc:
            raise _raise(exc) from exc
        by_key = {(tp.topic, tp.partition): tp.offset for tp in found}
        out: dict[Any, OffsetAndTimestamp | None] = {}
        for tp, ms in timestamps.items():
            offset = by_key.get((tp[0], tp[1]))
            out[tp] = OffsetAndTimestamp(int(offset), int(ms)) if offset is not None and offset >= 0 else None
        return out

    def committed(self, tp: Any, timeout_ms: int = 10_000) -> int | None:
        """The group's committed position of ``tp`` (``None``: no commit); asks without joining the group."""
        try:
            got = self._consumer.committed([RdPartition(tp[0], tp[1])], timeout=timeout_ms / 1000)
        except KafkaException as exc:
            raise _raise(exc) from exc
        offset = got[0].offset if got else -1
        return int(offset) if offset >= 0 else None

    # ------------------------------------------------------------------ assignment and positions
    def assign(self, partitions: Sequence[Any]) -> None:
        self._assigned = [(tp[0], int(tp[1])) for tp in partitions]
        self._targets, self._next = {}, {}
        self._consumer.assign([RdPartition(t, p) for t, p in self._assigned])

    def subscribe(self, topics: Sequence[str]) -> None:
        self._consumer.subscribe(list(topics))  # cooperative: librdkafka assigns incrementally by itself

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def seek(self, tp: Any, offset: int) -> None:
        self._seek((tp[0], int(tp[1])), int(offset))

    def seek_to_beginning(self, *partitions: Any) -> None:
        """Each of ``partitions`` (none: every assigned one) to the start of its log."""
        for tp in partitions or self._assigned:
            self._seek((tp[0], int(tp[1])), OFFSET_BEGINNING)

    def seek_to_end(self, *partitions: Any) -> None:
        """Each of ``partitions`` (none: every assigned one) to the end of its log."""
        for tp in partitions or self._assigned:
            self._seek((tp[0], int(tp[1])), OFFSET_END)

    def _seek(self, key: tuple[str, int], offset: int) -> None:
        self._targets[key] = offset
        self._next.pop(key, None)
        try:
            self._consumer.seek(RdPartition(key[0], key[1], offset))
        except KafkaException:
            # not fetching yet (just assigned): start it there instead
            if key in self._assigned:
                self._consumer.incremental_unassign([RdPartition(*key)])
                self._consumer.incremental_assign([RdPartition(key[0], key[1], offset)])
            else:
                raise

    def position(self, tp: Any) -> int:
        """The offset of the next record to read, as kafka-python tells it (see the module doc)."""
        key = (tp[0], int(tp[1]))
        if key in self._next:
            known = self._next[key]
            try:
                fetched = self._consumer.position([RdPartition(*key)])[0].offset
            except KafkaException:
                fetched = -1
            return max(known, int(fetched))  # librdkafka moves past transaction markers
        target = self._targets.get(key)
        if target is not None and target >= 0:
            return target
        low, high = self._watermarks(key)
        if target == OFFSET_END or (target is None and self.reset == "latest"):
            return high
        return low

    def pause(self, *partitions: Any) -> None:
        self._consumer.pause([RdPartition(tp[0], tp[1]) for tp in partitions])

    # ------------------------------------------------------------------ reading
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[Fetched]]:
        try:
            messages = self._consumer.consume(max_records or 500, timeout_ms / 1000)
        except KafkaException as exc:
            raise _raise(exc) from exc
        polled: dict[TopicPartition, list[Fetched]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaError(f"librdkafka: {error.str()}")
                if error.code() != RdKafkaError._PARTITION_EOF:
                    logger.debug("librdkafka: %s", error.str())
                continue
            record = _fetched(message)
            polled.setdefault(TopicPartition(record.topic, record.partition), []).append(record)
            key = (record.topic, record.partition)
            self._next[key] = record.offset + 1
            self._targets.pop(key, None)
        return polled

    def close(self, autocommit: bool = False) -> None:
        del autocommit  # never: enable.auto.commit is off
        self._consumer.close()


class Delivery:
    """A sent record's outcome, with kafka-python's future ``get``."""

    def __init__(self, producer: Producer):
        self._producer = producer
        self.done = False
        self.error: str | None = None

    def __call__(self, error: Any, _message: Any) -> None:  # librdkafka's delivery callback (inside poll/flush)
        self.error = None if error is None else str(error)
        self.done = True

    def get(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.done and time.monotonic() < deadline:
            self._producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
        if not self.done:
            raise KafkaTimeoutError(f"the broker did not acknowledge a record within {timeout:.1f}s")
        if self.error is not None:
            raise KafkaError(self.error)


class LibrdkafkaProducer:
    """A ``confluent_kafka.Producer`` behind the kafka-python producer methods the partials publisher uses."""

    def __init__(self, properties: Mapping[str, Any]):
        try:
            self._producer = Producer(dict(properties))
        except KafkaException as exc:
            raise _raise(exc) from exc
        logger.info("Kafka producer %s on librdkafka %s", properties.get("client.id"), libversion()[0])

    def partitions_for(self, topic: str) -> set[int] | None:
        try:
            listed = self._producer.list_topics(topic, timeout=QUERY_TIMEOUT_SECONDS).topics.get(topic)
        except KafkaException as exc:
            raise _raise(exc) from exc
        if listed is None or listed.error is not None:
            return None
        return set(listed.partitions)

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None, partition: int | None = None,
             headers: Sequence[tuple[str, bytes]] | None = None) -> Delivery:
        delivery = Delivery(self._producer)
        try:
            self._producer.produce(topic, value=value, key=key, partition=-1 if partition is None else partition,
                                   headers=list(headers or ()), on_delivery=delivery)
        except (KafkaException, BufferError) as exc:
            raise KafkaError(str(exc)) from exc
        return delivery

    def flush(self, timeout: float | None = None) -> None:
        self._producer.flush(-1 if timeout is None else timeout)

    def close(self, timeout: float | None = None) -> None:
        self._producer.purge()
        self._producer.flush(0 if timeout is None else timeout)
