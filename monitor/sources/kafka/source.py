"""Kafka consumer-group source (kafka-python) with manual offset commits.

Offsets are committed only for records the state already reflects, and, with checkpointing on,
only once a checkpoint holding that state is on disk (the daemon decides what ``commit`` gets).
A broker that is unreachable at start-up or goes away later is not fatal: ``poll`` keeps
retrying with bounded backoff and ``up`` reports the connection state for ``/readyz`` and
``embmon_source_up``. kafka-python's bootstrap (the consumer's constructor, up to 30 s when no
broker answers) and its close run in threads of their own (:class:`BlockingCall`), so neither
start-up nor a stop request waits for a broker: a bootstrap still running at shutdown is
abandoned, a close that takes over ``CLOSE_TIMEOUT_SECONDS`` too (both logged).

Transactions, positions checked against the log, progress, rebalances (kafka-python runs the
listener on its IO thread, so it is asynchronous), undecodable and unreadable records (a record
kafka-python cannot parse becomes a placeholder counted ``bad_header`` or ``corrupt_record`` and
skipped): docs/operations.md, "Transactions", "Offsets out of range", "Stalls", "Rebalances",
"Compression codecs", "Which Kafka client".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import AsyncConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import KafkaConfigurationError, KafkaError, UnsupportedCodecError
from kafka.structs import OffsetAndMetadata

from monitor.blocking import BlockingCall
from monitor.decoding.records import SourcePosition
from monitor.errors import ConfigError
from monitor.sources.base import MessageKind, Partition, SourceMessage
from monitor.sources.kafka.clients import new_consumer
from monitor.sources.kafka.internals import (
    any_broker_connected,
    close_consumer,
    close_failed_connect_sockets,
    current_position,
    fetch_committed,
    read_unreadable_records,
    take_fetch_failure,
    unreadable_reason,
    yield_to_loop,
)
from monitor.sources.kafka.policy import (
    ERROR_REASONS,
    ISOLATION_LEVELS,
    OFFSET_RESET_POLICIES,
    RESET_REASONS,
    records_behind,
    seek_position,
    start_reason,
)
from monitor.sources.kafka.positions import PositionGuard, Reset, key_of
from monitor.sources.kafka.reconnect import (
    CLOSE_TIMEOUT_SECONDS,
    MAX_BACKOFF_SECONDS,
    Backoff,
    ConsumerReadings,
    LagReading,
    close_in_time,
)
from monitor.sources.settings import KafkaSettings
from monitor.tally import Tally

logger = logging.getLogger(__name__)

HANDOFF_TIMEOUT_SECONDS = 60.0
COMMIT_TIMEOUT_MS = 3_000  # a synchronous commit with no coordinator would otherwise retry for ever
# The PyPI package behind each codec kafka-python 3.0 decodes with a library (kafka/codec.py);
# gzip is the standard library's.
CODEC_PACKAGES = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


def codec_of(error: BaseException) -> str:
    """The codec an ``UnsupportedCodecError`` names ("unknown" for a compression type it does not know).

    >>> codec_of(UnsupportedCodecError("Libraries for lz4 compression codec not found"))
    'lz4'
    >>> codec_of(UnsupportedCodecError("Unrecognized compression type: 7"))
    'unknown'
    """
    match = re.search(r"Libraries for (\w+) compression codec", str(error))
    return match.group(1) if match else "unknown"


def codec_remedy(codec: str) -> str:
    """What to do about records compressed with ``codec``, for the log.

    >>> print(codec_remedy("zstd"))  # doctest: +NORMALIZE_WHITESPACE
    zstd-compressed records need the Python package zstandard: pip install zstandard in the
    daemon's environment, then restart
    """
    package = CODEC_PACKAGES.get(codec)
    if package is None:
        return "kafka-python knows no such compression type: check what the producers write"
    return f"{codec}-compressed records need the Python package {package}: pip install {package} in the daemon's " \
        "environment, then restart"


@dataclass
class _Stall:
    """A partition paused because its records could not be decompressed, retried with backoff."""

    codec: str
    offset: int
    backoff: Backoff
    held: bool = True  # paused until the backoff's next attempt; False while a retry fetches


class _Rebalance(AsyncConsumerRebalanceListener):
    def __init__(self, source: KafkaSource):
        self._source = source

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self._handoff(revoked, commit=True)

    async def on_partitions_lost(self, lost: Any) -> None:
        # The group already gave these away: a commit would fail, but the state must still be
        # made consistent (the queued records applied and checkpointed) before new ones arrive.
        await self._handoff(lost, commit=False)

    async def _handoff(self, partitions: Any, commit: bool) -> None:
        source = self._source
        consumer = source._consumer
        keys = sorted((tp.topic, tp.partition) for tp in partitions)
        if not keys or consumer is None:
            return
        logger.info("partitions %s: %s", "revoked" if commit else "lost", keys)
        source._guard.revoked(partitions)
        for key in keys:
            source._polled.pop(key, None)
        offsets = await self._in_worker(consumer, lambda: source.listener.on_revoked(keys))
        if commit and offsets:
            payload = {TopicPartition(t, p): OffsetAndMetadata(o + 1, "", -1) for (t, p), o in offsets.items()}
            try:
                await consumer.commit_async(payload)
                source._note_committed(offsets)
            except KafkaError as exc:
                logger.warning("commit on revocation failed (%s); the next owner resumes from the last commit", exc)

    async def _in_worker(
        self, consumer: KafkaConsumer, work: Callable[[], dict[Partition, int]]
    ) -> dict[Partition, int]:
        """Run blocking ``work`` in a thread while yielding to kafka-python's IO loop."""
        call = BlockingCall("embmon-handoff", work)
        deadline = time.monotonic() + HANDOFF_TIMEOUT_SECONDS
        while not call.done and time.monotonic() < deadline:
            await yield_to_loop(consumer, 0.02)
        if not call.done:
            logger.error("partition hand-off took over %.0fs; continuing without it", HANDOFF_TIMEOUT_SECONDS)
        elif call.error is not None:  # reported, never raised into kafka-python's loop
            logger.error("partition hand-off failed", exc_info=call.error)
        return dict(call.result or {})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        source = self._source
        consumer = source._consumer
        keys = sorted((tp.topic, tp.partition) for tp in assigned)
        logger.info("assigned partitions: %s", keys)
        if consumer is None or not keys:
            return
        known = source.listener.resume_offsets()
        committed: dict[Any, Any] = {}
        try:
            committed = await fetch_committed(consumer, sorted(assigned), 10_000)
        except KafkaError as exc:
            logger.warning("cannot read committed offsets (%s); resuming from the checkpoint where there is one", exc)
        guard = source._guard
        positions: dict[Partition, int] = {}
        for tp in sorted(assigned):
            key = (tp.topic, tp.partition)
            meta = committed.get(tp)
            group = meta.offset if meta is not None and meta.offset is not None and meta.offset >= 0 else None
            position = seek_position(known.get(key), group)
            commit = position - 1 if position is not None and (group is None or position > group) else None
            recreated = guard.assigned(consumer, tp, commit)
            if recreated is not None and (position is not None or group is not None):
                # what the checkpoint and the group hold are offsets of the old topic
                guard.reset_later(consumer, Reset(tp, "topic_recreated", position or group, recreated))
                continue
            if position is None:
                logger.info("partition %s: %s", key, start_reason(group, source.policy))
                if group is None:
                    guard.start_by_policy(consumer, tp)
                continue
            consumer.seek(tp, position)
            positions[key] = position
            logger.info(
                "partition %s: starting at offset %d, after what the restored checkpoint reflects (up to %d; "
                "group committed %s)", key, position, known[key], group,
            )
        guard.assignment_done({tp.topic for tp in assigned})
        source.listener.on_assigned(positions)


class KafkaSource(ConsumerReadings):
    name = "kafka"

    def __init__(self, settings: KafkaSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self.policy = str(settings.options.get("auto_offset_reset", settings.auto_offset_reset))
        if self.policy not in OFFSET_RESET_POLICIES:
            raise ConfigError(f"kafka.options.auto_offset_reset: {self.policy!r} is not earliest or latest "
                              "(the daemon resets positions itself; set kafka.auto_offset_reset)")
        isolation = settings.options.get("isolation_level", "read_committed")
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(f"kafka.options.isolation_level: {isolation!r} is not read_committed or read_uncommitted")
        self._consumer: KafkaConsumer | None = None
        self._connecting: BlockingCall[KafkaConsumer] | None = None
        self._closed = False
        self._reported_config_error = False
        self._kinds: dict[str, MessageKind] = {settings.embeddings_topic: "embeddings"}
        if settings.interactions_topic:
            self._kinds[settings.interactions_topic] = "interactions"
        self._backoff = Backoff(clock)
        self._up = False
        self._lag = LagReading(clock)
        self._paused = False
        self._pending_commit: dict[Partition, int] = {}
        self._committed_lock = threading.Lock()
        self._committed: dict[Partition, int] = {}
        self._errors: Tally[str] = Tally()
        self._stalls: dict[TopicPartition, _Stall] = {}
        self._reported_codecs: set[str] = set()
        self._guard = PositionGuard(self.policy)
        self._polled: dict[Partition, tuple[int, int]] = {}  # first and last offset polled since assignment
        self._progress: dict[str, float] = {}  # topic -> unix time it was last caught up or applied records
        self._applied_seen: dict[Partition, int] = {}
        self._started_at: float | None = None

    def consumer_config(self) -> dict[str, Any]:
        """The kafka-python configuration: ours, then the pass-through options on top."""
        s = self.settings
        config: dict[str, Any] = {
            "bootstrap_servers": s.bootstrap_servers,
            "group_id": s.group_id,
            "client_id": s.client_id,
            "enable_auto_commit": False,
            "isolation_level": "read_committed",
            "max_poll_records": s.max_poll_records,
            "reconnect_backoff_max_ms": 10_000,
        }
        config.update(s.options)
        config["enable_auto_commit"] = False
        # kafka.auto_offset_reset is applied here, not by kafka-python, so that every reset is seen
        # (logged, counted, its offsets replaced): kafka-python only reports the partitions needing one
        config["auto_offset_reset"] = "none"
        return config

    def start(self) -> None:
        """Begin connecting in the background; never blocks (``poll`` picks the consumer up)."""
        close_failed_connect_sockets()
        read_unreadable_records()
        self._started_at = time.time()
        self._begin_connect()

    def _begin_connect(self) -> None:
        config = self.consumer_config()

        def bootstrap() -> KafkaConsumer | None:
            consumer = new_consumer(config)
            if self._closed:  # the source closed while this waited for a broker: nobody will use it
                close_consumer(consumer, timeout_ms=0)
                return None
            return consumer

        self._connecting = BlockingCall("embmon-kafka-bootstrap", bootstrap)

    def _connect(self, timeout: float) -> bool:
        """Pick up the consumer the background bootstrap made, waiting up to ``timeout`` for it;
        start another bootstrap once the backoff allows. True when a consumer is ready."""
        if self._connecting is None:
            if self._backoff.ready():
                self._begin_connect()
            else:
                time.sleep(min(timeout, self._backoff.remaining()))
                return False
        call = self._connecting
        assert call is not None
        if not call.wait(timeout):
            return False
        self._connecting = None
        if call.error is not None or call.result is None:
            self._up = False
            wait = self._backoff.failed()
            if isinstance(call.error, KafkaConfigurationError):
                if not self._reported_config_error:
                    self._reported_config_error = True
                    logger.error("kafka-python refuses the consumer settings (kafka.options): %s", call.error)
            else:
                logger.warning("cannot reach Kafka at %s (%s); retrying in %.1fs",
                               ",".join(self.settings.bootstrap_servers), type(call.error).__name__, wait)
            return False
        consumer = call.result
        self._consumer = consumer
        consumer.subscribe(topics=sorted(self._kinds), listener=_Rebalance(self))
        self._backoff.succeeded()
        self._up = True
        logger.info("consuming %s as group %s", sorted(self._kinds), self.settings.group_id)
        return True

    def poll(self, timeout: float) -> list[SourceMessage]:
        if self._consumer is None and not self._connect(timeout):
            return []
        consumer = self._consumer
        assert consumer is not None
        raised: KafkaError | None = None
        try:
            self._reset_positions(consumer)
            if self._paused:  # backpressure: keep the group membership alive, fetch nothing
                consumer.pause(*consumer.assignment())
            else:
                self._retry_stalls(consumer)
            polled = consumer.poll(timeout_ms=int(timeout * 1000), max_records=self.settings.max_poll_records)
        except KafkaError as exc:
            polled, raised = {}, exc
        for tp in polled:  # a stalled partition that returns records reads again
            if self._stalls.pop(tp, None) is not None:
                logger.info("partition %s: its records decode again; reading on", (tp.topic, tp.partition))
        failure = take_fetch_failure(consumer, raised)
        error = failure.error if failure is not None else raised
        if failure is not None and isinstance(error, UnsupportedCodecError):
            self._stall(consumer, failure.partition, failure.offset, error)
        elif self._guard.take_error(consumer, error):
            pass  # a position outside its log: reset below
        elif error is not None:
            self._errors.add("poll")
            logger.warning("Kafka poll failed: %s", error)
            if not polled:  # nothing read: wait a little before the next try
                self._up = False
                time.sleep(min(timeout, 1.0))
                return []
        self._up = self._connected() and not self._stalls
        self._guard.check(consumer, polled, self._kinds)
        self._reset_positions(consumer)
        messages: list[SourceMessage] = []
        for tp, records in polled.items():
            kind = self._kinds.get(tp.topic, "embeddings")
            if records:
                key = key_of(tp)
                first = self._polled.get(key, (records[0].offset, 0))[0]
                self._polled[key] = (first, records[-1].offset)
            for record in records:
                messages.append(
                    SourceMessage(
                        value=record.value,
                        headers=tuple(record.headers or ()),
                        kind=kind,
                        position=SourcePosition(tp.topic, tp.partition, record.offset),
                        unreadable=unreadable_reason(record.headers),
                    )
                )
        self._pending_commit.update(self._guard.take_verified_commits())
        if self._pending_commit:
            pending, self._pending_commit = self._pending_commit, {}
            self.commit(pending)
        self._maybe_refresh_lag()
        return messages

    def _reset_positions(self, consumer: KafkaConsumer) -> None:
        """Carry out the resets that are due (poll thread): the daemon's offsets for each partition
        are replaced by its new position, which is committed next."""
        reset = self._guard.carry_out(consumer)
        if not reset:
            return
        self.listener.on_reset(reset)
        with self._committed_lock:
            for key in reset:
                self._committed.pop(key, None)
        for key, position in reset.items():
            self._polled.pop(key, None)
            self._pending_commit[key] = position - 1

    def _stall(self, consumer: KafkaConsumer, tp: TopicPartition, offset: int, error: BaseException) -> None:
        """Pause ``tp``, whose records from ``offset`` kafka-python cannot decompress, until its next retry."""
        self._errors.add("unsupported_codec")
        stall = self._stalls.get(tp)
        if stall is None:
            stall = self._stalls[tp] = _Stall(codec_of(error), offset, Backoff(self._clock))
        stall.offset, stall.held = offset, True
        wait = stall.backoff.failed()
        consumer.pause(tp)
        if stall.codec not in self._reported_codecs:
            self._reported_codecs.add(stall.codec)
            logger.error(
                "cannot read %s partition %d from offset %d: %s. %s. Until then the partition is paused and "
                "retried with backoff (next in %.1fs, then up to every %.0fs), "
                "embmon_source_errors_total{reason=\"unsupported_codec\"} counts each try and embmon_source_up is 0; "
                "other partitions are read (logged once per codec)",
                tp.topic, tp.partition, offset, error, codec_remedy(stall.codec), wait, MAX_BACKOFF_SECONDS,
            )
        else:
            logger.debug("partition %s still cannot be decompressed (%s); next try in %.1fs", tp, error, wait)

    def _retry_stalls(self, consumer: KafkaConsumer) -> None:
        """Forget stalls of partitions no longer assigned; resume those whose next try is due."""
        if not self._stalls:
            return
        assigned = consumer.assignment()
        for tp in [tp for tp in self._stalls if tp not in assigned]:
            del self._stalls[tp]  # revoked: whoever owns it now finds out for itself
        for tp, stall in self._stalls.items():
            if stall.held and stall.backoff.ready():
                stall.held = False
                consumer.resume(tp)

    def error_counts(self) -> dict[str, int]:
        return {**dict.fromkeys(ERROR_REASONS, 0), **self._errors.snapshot()}

    def offset_reset_counts(self) -> dict[str, int]:
        return {**dict.fromkeys(RESET_REASONS, 0), **self._guard.counts.snapshot()}

    def _connected(self) -> bool:
        return self._consumer is None or any_broker_connected(self._consumer, default=self._up)

    def pause(self) -> None:
        """Stop fetching (backpressure) while polling on, so the group keeps this member."""
        if self._consumer is not None and not self._paused:
            self._consumer.pause(*self._consumer.assignment())
        self._paused = True

    def resume(self) -> None:
        if self._consumer is not None and self._paused:
            held = {tp for tp, stall in self._stalls.items() if stall.held} | self._guard.resetting
            self._consumer.resume(*(self._consumer.paused() - held))
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    def commit(self, offsets: Mapping[Partition, int]) -> bool:
        """Commit "state reflects up to and including" ``offsets`` for partitions assigned to us.

        Partitions not assigned (any more) are skipped: committing them could move the group
        backwards under the replica that owns them now; so are partitions whose position is not
        yet verified against the log (monitor/sources/kafka/positions.py). When ``offsets`` holds
        the last record polled from a partition and the consumer's position is further on, the
        offsets between are transaction markers (or aborted records) kafka-python skipped: the
        position is committed, so the group's lag reads 0 too.
        """
        if self._consumer is None:
            return not offsets
        if not offsets:
            return True
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        with self._committed_lock:
            todo = {k: o for k, o in offsets.items()
                    if k in assigned and self._committed.get(k) != o and self._guard.committable(k)}
        if not todo:
            return True
        payload = {TopicPartition(t, p): OffsetAndMetadata(self._next_offset(t, p, o), "", -1)
                   for (t, p), o in todo.items()}
        try:
            self._consumer.commit(offsets=payload, timeout_ms=COMMIT_TIMEOUT_MS)
        except KafkaError as exc:
            # Not fatal: the next commit carries later offsets; a restart resumes from the checkpoint.
            logger.warning("offset commit failed (%s); will retry with the next commit", exc)
            return False
        self._note_committed(todo)
        return True

    def _next_offset(self, topic: str, partition: int, last: int) -> int:
        """The offset to commit after ``last``: past the markers that follow it, when nothing was polled after it."""
        polled = self._polled.get((topic, partition))
        if self._consumer is None or polled is None or polled[1] != last:
            return last + 1
        position = current_position(self._consumer, TopicPartition(topic, partition))
        return max(last + 1, position or 0)

    def _note_committed(self, offsets: Mapping[Partition, int]) -> None:
        with self._committed_lock:
            self._committed.update(offsets)

    def _maybe_refresh_lag(self) -> None:
        if self._consumer is None or not self._lag.due():
            return
        assigned = self._consumer.assignment()
        if not assigned:
            return
        try:
            ends = self._consumer.end_offsets(list(assigned), timeout_ms=5_000)
        except KafkaError:
            return
        applied = self.listener.applied_offsets()
        lag: dict[str, int] = {}
        for tp, end in ends.items():
            if end is None:
                continue
            position = current_position(self._consumer, tp)
            if position is None:
                continue
            lag[tp.topic] = lag.get(tp.topic, 0) + records_behind(end, position, self._polled.get(key_of(tp)),
                                                                  applied.get(key_of(tp)))
        self._lag.record(lag)
        self._note_progress(lag, applied)

    def topic_ids(self) -> dict[str, str]:
        return self._guard.known_topic_ids()

    def remember_topic_ids(self, ids: Mapping[str, str]) -> None:
        self._guard.remember_topic_ids(ids)

    @property
    def up(self) -> bool:
        return self._up

    def close(self) -> None:
        """Close the consumer within ``CLOSE_TIMEOUT_SECONDS``; a bootstrap still waiting for a
        broker is abandoned (it closes what it makes, if it ever does)."""
        self._closed = True
        connecting, self._connecting = self._connecting, None
        if connecting is not None and not connecting.done:
            logger.warning("closing while the Kafka bootstrap still waits for %s: abandoning it",
                           ",".join(self.settings.bootstrap_servers))
        elif connecting is not None and connecting.result is not None:
            self._consumer = connecting.result  # made, never picked up: close it below
        consumer, self._consumer = self._consumer, None
        self._up = False
        if consumer is None:
            return

        def close() -> None:
            try:
                close_consumer(consumer, timeout_ms=int(CLOSE_TIMEOUT_SECONDS * 1000))
            except KafkaError as exc:
                logger.warning("error closing the Kafka consumer: %s", exc)

        close_in_time(close)
