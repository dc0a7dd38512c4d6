"""Kafka consumer-group source (kafka-python) with manual offset commits.

Offsets are committed only for records the state already reflects (the daemon calls ``commit``
after applying a poll), so a crash replays rather than loses. A broker that is unreachable at
start-up or goes away later is not fatal: ``poll`` keeps retrying with bounded backoff and ``up``
reports the connection state for ``/readyz`` and ``embmon_source_up``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from monitor.config import KafkaSettings
from monitor.records import SourcePosition
from monitor.sources import MessageKind, Source, SourceMessage

logger = logging.getLogger(__name__)

LAG_REFRESH_SECONDS = 15.0
MAX_BACKOFF_SECONDS = 30.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, source: KafkaSource):
        self._source = source

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if self._source.on_revoked is not None and revoked:
            self._source.on_revoked([(tp.topic, tp.partition) for tp in revoked])

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        logger.info("assigned partitions: %s", sorted((tp.topic, tp.partition) for tp in assigned))
        if self._source.on_assigned is not None and assigned:
            self._source.on_assigned([(tp.topic, tp.partition) for tp in assigned])


class KafkaSource(Source):
    name = "kafka"

    def __init__(self, settings: KafkaSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._consumer: KafkaConsumer | None = None
        self._kinds: dict[str, MessageKind] = {settings.embeddings_topic: "embeddings"}
        if settings.interactions_topic:
            self._kinds[settings.interactions_topic] = "interactions"
        self._next_attempt = 0.0
        self._backoff = 0.5
        self._up = False
        self._lag: dict[str, int] | None = None
        self._lag_at = -LAG_REFRESH_SECONDS
        # Set by the daemon: called on the polling thread during a rebalance.
        self.on_revoked: Callable[[list[tuple[str, int]]], None] | None = None
        self.on_assigned: Callable[[list[tuple[str, int]]], None] | None = None

    def consumer_config(self) -> dict[str, Any]:
        """The kafka-python configuration: ours, then the pass-through options on top."""
        s = self.settings
        config: dict[str, Any] = {
            "bootstrap_servers": s.bootstrap_servers,
            "group_id": s.group_id,
            "client_id": s.client_id,
            "enable_auto_commit": False,
            "auto_offset_reset": s.auto_offset_reset,
            "max_poll_records": s.max_poll_records,
            "reconnect_backoff_max_ms": 10_000,
        }
        config.update(s.options)
        config["enable_auto_commit"] = False
        return config

    def start(self) -> None:
        self._connect()

    def _connect(self) -> bool:
        now = self._clock()
        if now < self._next_attempt:
            return False
        try:
            consumer = KafkaConsumer(**self.consumer_config())
            consumer.subscribe(topics=sorted(self._kinds), listener=_Rebalance(self))
        except KafkaError as exc:
            self._next_attempt = now + self._backoff
            logger.warning(
                "cannot reach Kafka at %s (%s); retrying in %.1fs",
                ",".join(self.settings.bootstrap_servers),
                type(exc).__name__,
                self._backoff,
            )
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)
            self._up = False
            return False
        self._consumer = consumer
        self._backoff = 0.5
        self._up = True
        logger.info("consuming %s as group %s", sorted(self._kinds), self.settings.group_id)
        return True

    def poll(self, timeout: float) -> list[SourceMessage]:
        if self._consumer is None and not self._connect():
            time.sleep(min(timeout, max(0.0, self._next_attempt - self._clock())))
            return []
        assert self._consumer is not None
        try:
            polled = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=self.settings.max_poll_records)
        except KafkaError as exc:
            self._up = False
            logger.warning("Kafka poll failed: %s", exc)
            time.sleep(min(timeout, 1.0))
            return []
        self._up = self._connected()
        messages: list[SourceMessage] = []
        for tp, records in polled.items():
            kind = self._kinds.get(tp.topic, "embeddings")
            for record in records:
                messages.append(
                    SourceMessage(
                        value=record.value,
                        headers=tuple(record.headers or ()),
                        kind=kind,
                        position=SourcePosition(tp.topic, tp.partition, record.offset),
                    )
                )
        self._maybe_refresh_lag()
        return messages

    def _connected(self) -> bool:
        client = getattr(self._consumer, "_client", None)
        if client is None:
            return True
        try:
            brokers = client.cluster.brokers()
            return any(client.is_ready(b.nodeId) or client.connected(b.nodeId) for b in brokers)
        except Exception:  # noqa: BLE001 - a diagnostics probe must never break polling
            return True

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        if self._consumer is None or not offsets:
            return
        payload = {TopicPartition(t, p): OffsetAndMetadata(o + 1, "", -1) for (t, p), o in offsets.items()}
        try:
            self._consumer.commit(offsets=payload)
        except KafkaError as exc:
            # Not fatal: the next commit carries later offsets; at worst a restart replays a little.
            logger.warning("offset commit failed (%s); will retry with the next commit", exc)

    def _maybe_refresh_lag(self) -> None:
        now = self._clock()
        if now - self._lag_at < LAG_REFRESH_SECONDS or self._consumer is None:
            return
        self._lag_at = now
        assigned = self._consumer.assignment()
        if not assigned:
            return
        try:
            ends = self._consumer.end_offsets(list(assigned))
        except KafkaError:
            return
        lag: dict[str, int] = {}
        for tp, end in ends.items():
            try:
                position = self._consumer.position(tp, timeout_ms=1000)
            except KafkaError:
                continue
            if position is not None and end is not None:
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - position)
        self._lag = lag

    def lag(self) -> dict[str, int] | None:
        return self._lag

    @property
    def up(self) -> bool:
        return self._up

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False)
            except KafkaError as exc:
                logger.warning("error closing the Kafka consumer: %s", exc)
            self._consumer = None
        self._up = False
