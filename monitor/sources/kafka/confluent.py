"""Kafka consumer-group source on librdkafka (confluent-kafka), selected by ``kafka.client: confluent``.

The same contract as the kafka-python source (``sources/kafka/source.py``; docs/operations.md, "Which
Kafka client"): offsets are committed only for records the state reflects, once a checkpoint holds
them (the daemon decides what ``commit`` gets); the group's rebalances hand partitions over through
the daemon's :class:`~monitor.sources.base.PartitionListener`; backpressure pauses fetching while
polling goes on; lag, progress, errors and offset resets are exported under the same metric names.

How librdkafka differs (offsets, rebalances on the poll thread, reconnects and codecs, the
assignment strategy, unreadable records, settings): docs/operations.md, "How the librdkafka source differs".
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Message, TopicPartition

from monitor.decoding.records import SourcePosition
from monitor.errors import ConfigError
from monitor.sources.base import MessageKind, Partition, SourceMessage
from monitor.sources.kafka.options import LIBRDKAFKA_NAMES
from monitor.sources.kafka.policy import (
    ERROR_REASONS,
    ISOLATION_LEVELS,
    OFFSET_RESET_POLICIES,
    RESET_EXPLANATIONS,
    RESET_REASONS,
    records_behind,
    seek_position,
    start_reason,
)
from monitor.sources.kafka.reconnect import ConsumerReadings, LagReading, close_in_time
from monitor.sources.settings import KafkaSettings
from monitor.tally import Tally

logger = logging.getLogger(__name__)

QUERY_TIMEOUT_SECONDS = 5.0  # committed offsets, watermarks: a request to the broker each
# Commits are asynchronous: librdkafka's synchronous commit waits for the group coordinator with no
# bound of its own (a coordinator that accepts connections and never answers held it for good), and
# the poll thread, whose ``consume`` serves the error and statistics callbacks, would wait with it.
# One commit is under way at a time, never given up: librdkafka keeps a commit it could not send and
# sends it after a reconnect, after any newer one, which moved the group backwards when an
# unanswered commit was followed by another. The source reads as down while a commit has waited for
# its answer longer than this (kafka-python's commits are bounded at 3 s: the same bound).
COMMIT_TIMEOUT_SECONDS = 3.0
CLOSE_FLUSH_SECONDS = 1.5  # at close, the longest wait for a commit's answer before the last one is sent
COMMIT_RETRY_SECONDS = 1.0  # after a commit failed, the wait before the offsets it carried are sent again
LAG_QUERY_BUDGET_SECONDS = 1.0  # one lag refresh's listings of partition ends, all partitions together
# What one poll hands the daemon, in bytes of values, at most (about): librdkafka's consume returns
# up to max_poll_records messages from its prefetch queue whatever their size, and the daemon queues
# ~10 polls, so 2,000 binary batches of 256 x 384 floats (786 MB) would be one poll (the first poll of
# a run did that: a 0.8-1.3 GB peak). kafka-python's polls are bounded by its fetch sizes instead.
# `embedding-monitor run` after a binary d = 384 topic peaked at 319 MB with 8 MiB, 502 MB with 16 MiB.
POLL_BYTES = 8 << 20
# librdkafka errors that mean no broker can be reached (``up`` goes False until something succeeds)
_DOWN = frozenset({KafkaError._ALL_BROKERS_DOWN})
_OUT_OF_RANGE = frozenset({KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE})
# A message's headers, through a call whose result CPython checks. confluent-kafka 2.x converts a
# header key that is not UTF-8 into a (NULL, value) pair and returns the list with the decoding error
# still set; called as a method, CPython's specialised call path does not check that, and the error
# surfaces at some later call (a SystemError that lost the poll). Through ``partial`` the call is
# checked, so it raises here, inside the per-message guard, and the broken list is dropped.
message_headers: Callable[[Message], Any] = functools.partial(Message.headers)


def librdkafka_config(settings: KafkaSettings) -> dict[str, Any]:
    """The librdkafka consumer properties: ours, ``kafka.options`` translated, then ``kafka.librdkafka``.

    >>> from monitor.sources.settings import KafkaSettings
    >>> config = librdkafka_config(KafkaSettings(client="confluent", options={
    ...     "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
    ...     "sasl_plain_password": "p", "ssl_check_hostname": False}, librdkafka={"fetch.queue.backoff.ms": 10}))
    >>> {k: config[k] for k in ("security.protocol", "sasl.mechanism", "sasl.username",
    ...                          "ssl.endpoint.identification.algorithm", "fetch.queue.backoff.ms")}
    ... # doctest: +NORMALIZE_WHITESPACE
    {'security.protocol': 'SASL_SSL', 'sasl.mechanism': 'SCRAM-SHA-512', 'sasl.username': 'u',
     'ssl.endpoint.identification.algorithm': 'none', 'fetch.queue.backoff.ms': 10}
    """
    config: dict[str, Any] = {
        "bootstrap.servers": ",".join(settings.bootstrap_servers),
        "group.id": settings.group_id,
        "client.id": settings.client_id,
        "isolation.level": "read_committed",
        "reconnect.backoff.max.ms": 10_000,
        "statistics.interval.ms": 1_000,  # broker connection states, for ``up``
        # librdkafka prefetches up to queued.max.messages.kbytes (64 MiB) and, once that is full, waits
        # fetch.queue.backoff.ms (1 s) before fetching again: a consumer faster than the fetches idles
        # (bench/ingest.py, docs/benchmarks.md)
        "fetch.queue.backoff.ms": 10,
    }
    for key, value in settings.options.items():
        if key == "auto_offset_reset":
            continue  # applied by the source (see the module doc)
        if key == "ssl_check_hostname":
            value = "https" if value else "none"
        elif key == "api_version" and isinstance(value, (tuple, list)):
            value = ".".join(str(v) for v in value)
        config[LIBRDKAFKA_NAMES[key]] = value
    config.update(settings.librdkafka)
    config.update({"enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": "error"})
    return config


class ConfluentSource(ConsumerReadings):
    name = "kafka"

    def __init__(self, settings: KafkaSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.policy = str(settings.options.get("auto_offset_reset", settings.auto_offset_reset))
        if self.policy not in OFFSET_RESET_POLICIES:
            raise ConfigError(f"kafka.options.auto_offset_reset: {self.policy!r} is not earliest or latest "
                              "(the daemon resets positions itself; set kafka.auto_offset_reset)")
        isolation = settings.librdkafka.get("isolation.level", settings.options.get("isolation_level",
                                                                                    "read_committed"))
        if isolation not in ISOLATION_LEVELS:
            raise ConfigError(f"kafka isolation level {isolation!r} is not read_committed or read_uncommitted")
        if "cooperative" in str(settings.librdkafka.get("partition.assignment.strategy", "")):
            raise ConfigError("kafka.librdkafka.partition.assignment.strategy: cooperative strategies are not "
                              "supported with client: confluent (use range or roundrobin)")
        self._consumer: Consumer | None = None
        self._kinds: dict[str, MessageKind] = {settings.embeddings_topic: "embeddings"}
        if settings.interactions_topic:
            self._kinds[settings.interactions_topic] = "interactions"
        self._up = False
        self._lag = LagReading(clock)
        self._paused = False
        self._assigned: set[Partition] = set()
        self._pending_commit: dict[Partition, int] = {}
        self._unverified: dict[Partition, int] = {}  # start positions not yet verified against the log
        self._held_commits: dict[Partition, int] = {}  # assignment commits waiting for verification
        self._stale_high: dict[Partition, int] = {}  # the cached high watermarks at assignment (not evidence)
        self._committed_lock = threading.Lock()
        self._committed: dict[Partition, int] = {}
        # the commit under way: per partition the offset sent and the last offset it commits
        self._in_flight: dict[Partition, tuple[int, int]] = {}
        self._in_flight_since: float | None = None  # when it was sent (monotonic)
        self._unanswered_since: float | None = None  # the first commit since the last answer (monotonic)
        self._wanted: dict[Partition, int] = {}  # offsets asked for and not confirmed yet: sent until they are
        self._retry_at = 0.0  # no commit is sent before (monotonic): a failed one waits COMMIT_RETRY_SECONDS
        self._errors: Tally[str] = Tally()
        self._resets: Tally[str] = Tally()
        self._topic_ids: dict[str, str] = {}
        self._polled: dict[Partition, tuple[int, int]] = {}  # first and last offset polled since assignment
        self._progress: dict[str, float] = {}
        self._applied_seen: dict[Partition, int] = {}
        self._started_at: float | None = None
        # messages per consume, cut to about POLL_BYTES by the sizes seen (a few until a size is seen)
        self._batch = min(16, settings.max_poll_records)
        self._lag_turn = 0  # the partition whose end the next lag refresh lists first
        # where each assigned partition started: an offset, or the policy until the log is listed; the lag
        # counts from it while nothing was consumed there (librdkafka's position is -1001 until then)
        self._starts: dict[Partition, int | str] = {}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Make the consumer and subscribe (librdkafka connects in its own threads: never blocks).
        A property librdkafka refuses is a configuration error."""
        self._started_at = time.time()
        config = librdkafka_config(self.settings)
        config["error_cb"] = self._on_error
        config["stats_cb"] = self._on_stats
        config["on_commit"] = self._on_commit
        try:
            consumer = Consumer(config)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"kafka.librdkafka: librdkafka refuses the consumer settings: {exc}") from None
        consumer.subscribe(sorted(self._kinds), on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_lost)
        self._consumer = consumer
        logger.info("consuming %s as group %s (librdkafka %s)", sorted(self._kinds), self.settings.group_id,
                    self._libversion())

    @staticmethod
    def _libversion() -> str:
        from confluent_kafka import libversion

        return str(libversion()[0])

    def close(self) -> None:
        """Send the offsets still wanted, leave the group and close, within ``CLOSE_TIMEOUT_SECONDS``
        (abandoned past it, logged)."""
        consumer, self._consumer, self._up = self._consumer, None, False
        if consumer is not None:
            close_in_time(lambda: self._close(consumer))

    def _close(self, consumer: Consumer) -> None:
        self._send_last(consumer, time.monotonic() + CLOSE_FLUSH_SECONDS)
        try:
            consumer.close()  # waits for the commits under way
        except (KafkaException, RuntimeError) as exc:
            logger.warning("error closing the Kafka consumer: %s", exc)

    def _send_last(self, consumer: Consumer, deadline: float) -> None:
        """Send the offsets still wanted before the close, after the answer to the commit under way,
        and not past ``deadline``. Only a poll serves that answer: fetching is paused first, so the
        poll returns no record (one returned and dropped would move the position a commit reads)."""
        try:
            paused = False
            while time.monotonic() < deadline:
                wanted = self._unconfirmed(self._wanted)
                if not wanted:
                    return
                self._retry_at = 0.0
                self._send_wanted(consumer)
                if self._in_flight_since is not None and all(
                        self._in_flight.get(key, (0, None))[1] == offset for key, offset in wanted.items()):
                    return  # under way: the close waits for its answer
                if not paused:
                    consumer.pause(consumer.assignment())
                    paused = True
                for message in consumer.consume(1, 0.05):
                    if message.error() is None:  # paused: none expected; never applied, never committed past
                        logger.warning("a record polled while closing was dropped: %s", message.offset())
        except (KafkaException, RuntimeError) as exc:
            logger.warning("could not send the last offsets before closing: %s", exc)

    def _on_stats(self, stats: str) -> None:
        """librdkafka's statistics (served inside ``consume``): up while any broker connection is."""
        try:
            brokers = json.loads(stats).get("brokers", {})
        except ValueError:
            return
        self._up = any(b.get("state") == "UP" for b in brokers.values())

    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's error callback (served inside ``consume``): connection trouble turns ``up`` off."""
        if error.code() in _DOWN:
            if self._up:
                logger.warning("Kafka unreachable at %s: %s", ",".join(self.settings.bootstrap_servers), error.str())
            self._up = False
        elif error.fatal():
            self._errors.add("poll")
            logger.error("librdkafka fatal error: %s", error.str())
        else:
            logger.debug("librdkafka: %s", error.str())

    # ------------------------------------------------------------------ rebalances (inside consume)
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = sorted((tp.topic, tp.partition) for tp in partitions)
        logger.info("assigned partitions: %s", keys)
        if not keys:
            consumer.assign(partitions)
            return
        known = self.listener.resume_offsets()
        group: dict[Partition, int] = {}
        try:
            for tp in consumer.committed(partitions, timeout=QUERY_TIMEOUT_SECONDS * 2):
                if tp.error is None and tp.offset >= 0:
                    group[(tp.topic, tp.partition)] = tp.offset
        except KafkaException as exc:
            logger.warning("cannot read committed offsets (%s); resuming from the checkpoint where there is one", exc)
        positions: dict[Partition, int] = {}
        starts: list[TopicPartition] = []
        for key in keys:
            committed = group.get(key)
            position = seek_position(known.get(key), committed)
            if position is None:
                position = committed
            if position is None:
                logger.info("partition %s: %s", key, start_reason(None, self.policy))
                self._starts[key] = self.policy
                starts.append(TopicPartition(*key, OFFSET_BEGINNING if self.policy == "earliest" else OFFSET_END))
                continue
            self._unverified[key] = position
            if key in known:
                positions[key] = position
                logger.info("partition %s: starting at offset %d, after what the restored checkpoint reflects "
                            "(up to %d; group committed %s)", key, position, known[key], committed)
            else:
                logger.info("partition %s: %s", key, start_reason(committed, self.policy))
            if committed is None or position > committed:
                self._held_commits[key] = position - 1  # for visibility (the group's lag), once verified
            self._starts[key] = position
            starts.append(TopicPartition(*key, position))
        self._list_latest_starts(consumer, keys)
        self._assigned = set(keys)
        for key in keys:
            self._polled.pop(key, None)
        if self._paused:
            consumer.assign(starts)
            consumer.pause(starts)
        else:
            consumer.assign(starts)
        self._stale_high = {key: self._cached_high(consumer, key) for key in self._unverified}
        self.listener.on_assigned(positions)

    def _list_latest_starts(self, consumer: Consumer, keys: list[Partition]) -> None:
        """The end of each partition started at the policy ``latest``, listed at its assignment as
        librdkafka lists it to start there, within LAG_QUERY_BUDGET_SECONDS for all of them: the lag
        counts from it while nothing there is consumed. One not listed in time takes the first end a
        lag refresh sees (records that arrived in between are then not counted)."""
        deadline = time.monotonic() + LAG_QUERY_BUDGET_SECONDS
        for key in keys:
            remaining = deadline - time.monotonic()
            if self._starts.get(key) != "latest" or remaining <= 0:
                continue
            try:
                self._starts[key] = int(consumer.get_watermark_offsets(TopicPartition(*key), timeout=remaining,
                                                                       cached=False)[1])
            except KafkaException as exc:
                logger.debug("partition %s: end not listed at assignment (%s)", key, exc)
                return

    def _verify(self, consumer: Consumer, fetched: set[Partition]) -> None:
        """After a poll: unverified start positions that returned records, or lie within the log by
        a fresh listing of its offsets or the high watermark of a fetch made since the assignment,
        are verified; one past that end (as a fetch since the assignment shows it) is reset.

        librdkafka keeps a partition's last high watermark across assignments: after a broker came
        back with an emptied log, the cached one still described the old log, and a position past the
        new log's end passed as within it (400 of 700 new records counted). A cached
        watermark that has not changed since the assignment is not taken as evidence."""
        for key, position in list(self._unverified.items()):
            if key in fetched:
                del self._unverified[key]
                continue
            tp = TopicPartition(*key)
            try:
                cached = consumer.get_watermark_offsets(tp, cached=True)[1]
                high = cached if cached != self._stale_high.get(key, -1) else -1  # from a fetch since assignment
                if 0 <= position <= high:
                    del self._unverified[key]
                    continue
                low, listed = consumer.get_watermark_offsets(tp, timeout=QUERY_TIMEOUT_SECONDS, cached=False)
            except KafkaException as exc:
                logger.warning("cannot list the offsets of %s (%s); checking again on the next poll", key, exc)
                continue
            if position <= listed:
                del self._unverified[key]
                continue
            if high < 0:
                continue  # no fetch answered since the assignment, and some brokers (tansu) list less than one shows
            self._move(consumer, key, self._reset(key, "past_end", position, low, max(high, listed)))
        for key in [k for k in self._held_commits if k not in self._unverified]:
            self._pending_commit[key] = self._held_commits.pop(key)

    @staticmethod
    def _cached_high(consumer: Consumer, key: Partition) -> int:
        """The last high watermark librdkafka holds for ``key`` (-1 when none, or not known)."""
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(*key), cached=True)[1])
        except KafkaException:
            return -1

    def _reset(self, key: Partition, reason: str, offset: int | None, low: int, high: int) -> int:
        target = low if self.policy == "earliest" else high
        self._resets.add(reason)
        logger.error(
            "partition %s: cannot resume at offset %s: %s (the log's first offset is %d, its end %d). Resuming at "
            "offset %d (auto_offset_reset=%s); the offsets kept for the partition (checkpoint, group) are replaced; "
            "embmon_source_offset_resets_total{reason=\"%s\"} counts it",
            key, "?" if offset is None else offset, RESET_EXPLANATIONS[reason], low, high, target, self.policy, reason,
        )
        return target

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._handoff(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group already gave these away: no commit, but the state is made consistent first.
        self._handoff(consumer, partitions, commit=False)

    def _handoff(self, consumer: Consumer, partitions: list[TopicPartition], commit: bool) -> None:
        keys = sorted((tp.topic, tp.partition) for tp in partitions)
        if keys:
            logger.info("partitions %s: %s", "revoked" if commit else "lost", keys)
            try:
                offsets = self.listener.on_revoked(keys)
            except Exception:  # reported, never raised into librdkafka's callback
                logger.exception("partition hand-off failed")
                offsets = {}
            if commit and offsets:
                self._commit_now(consumer, offsets, log="commit on revocation failed (%s); the next owner resumes "
                                                        "from the last commit")
            for key in keys:
                for kept in (self._polled, self._pending_commit, self._unverified, self._held_commits,
                             self._wanted, self._in_flight, self._starts):
                    kept.pop(key, None)
            if not self._in_flight:
                self._in_flight_since = None  # an answer for the partitions gone is not waited for
        self._assigned -= set(keys)  # confluent-kafka unassigns when the callback returns

    # ------------------------------------------------------------------ polling
    def poll(self, timeout: float) -> list[SourceMessage]:
        consumer = self._consumer
        if consumer is None:
            time.sleep(timeout)
            return []
        try:
            batch: list[Any] = consumer.consume(self._batch, timeout)
        except (KafkaException, RuntimeError) as exc:
            self._errors.add("poll")
            logger.warning("Kafka poll failed: %s", exc)
            time.sleep(min(timeout, 1.0))
            return []
        messages: list[SourceMessage] = []
        append = messages.append
        kinds = self._kinds
        polled = self._polled
        for message in batch:
            error = message.error()
            if error is not None:
                self._poll_error(consumer, message, error)
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            key = (topic, partition)
            span = polled.get(key)
            polled[key] = (offset if span is None else span[0], offset)
            try:
                headers = tuple(message_headers(message) or ())
            except Exception:  # noqa: BLE001 - a header key that is not UTF-8: this record alone
                append(SourceMessage(None, (), kinds.get(topic, "embeddings"), SourcePosition(topic, partition, offset),
                                     unreadable="bad_header"))
                continue
            append(SourceMessage(message.value(), headers, kinds.get(topic, "embeddings"),
                                 SourcePosition(topic, partition, offset)))
        if messages:
            self._up = True
            size = sum(len(m.value) for m in messages if m.value is not None) / len(messages)
            self._batch = max(1, min(self.settings.max_poll_records, int(POLL_BYTES // max(size, 1.0))))
        if self._unverified:
            self._verify(consumer, {(m.position.topic, m.position.partition) for m in messages if m.position})
        if self._pending_commit:
            pending, self._pending_commit = self._pending_commit, {}
            self.commit(pending)
        if self._wanted:
            self._send_wanted(consumer)
        self._maybe_refresh_lag(consumer)
        return messages

    def _poll_error(self, consumer: Consumer, message: Any, error: KafkaError) -> None:
        code = error.code()
        if code in _OUT_OF_RANGE and message.topic() is not None:
            key = (message.topic(), message.partition())
            self._reset_out_of_range(consumer, key, message.offset())
        elif code in _DOWN:
            self._on_error(error)
        else:
            self._errors.add("poll")
            logger.warning("Kafka poll failed: %s", error.str())

    def _reset_out_of_range(self, consumer: Consumer, key: Partition, offset: int | None) -> None:
        """The broker answered a fetch at ``offset`` as out of range: move by the policy (poll thread)."""
        tp = TopicPartition(*key)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=QUERY_TIMEOUT_SECONDS, cached=False)
            if offset is None or offset < 0:
                offset = consumer.position([tp])[0].offset
        except KafkaException as exc:
            logger.warning("cannot list the offsets of %s (%s); checking again on the next poll", key, exc)
            return
        reason = "before_start" if offset is not None and 0 <= offset < low else "past_end"
        self._move(consumer, key, self._reset(key, reason, offset, low, high))

    def _move(self, consumer: Consumer, key: Partition, target: int) -> None:
        """Seek a reset partition to ``target``; what the daemon kept for it is replaced, and committed."""
        consumer.seek(TopicPartition(*key, target))
        self._unverified.pop(key, None)
        self._held_commits.pop(key, None)
        self._polled.pop(key, None)
        self._starts[key] = target
        self.listener.on_reset({key: target})
        self._forget_committed({key: target})
        self._pending_commit[key] = target - 1

    def _forget_committed(self, keys: Iterable[Partition]) -> None:
        with self._committed_lock:
            for key in keys:
                self._committed.pop(key, None)

    # ------------------------------------------------------------------ commits
    def commit(self, offsets: Mapping[Partition, int]) -> bool:
        """Commit "state reflects up to and including" ``offsets`` for partitions assigned to us
        (others are skipped: committing them could move the group backwards under their new owner).

        True once the broker has confirmed every one of them that is assigned here and verified (the
        others are skipped). Otherwise False: they are sent (at once, or after the commit under way),
        answered inside a later ``poll``, and sent again after a failure until confirmed or replaced
        by later offsets; ``close`` sends what is still wanted. A caller that needs the confirmation
        asks again, as the replica's publish-then-commit protocol does."""
        consumer = self._consumer
        if consumer is None:
            return not offsets
        todo = self._unconfirmed(offsets)
        if not todo:
            return True
        self._wanted.update(todo)
        self._send_wanted(consumer)
        return False

    def _unconfirmed(self, offsets: Mapping[Partition, int]) -> dict[Partition, int]:
        with self._committed_lock:
            return {k: o for k, o in offsets.items()
                    if k in self._assigned and k not in self._unverified and self._committed.get(k) != o}

    def _send_wanted(self, consumer: Consumer) -> None:
        """Send an asynchronous commit of what is wanted, unless one is under way or a failure's retry wait runs."""
        now = time.monotonic()
        if self._in_flight_since is not None or now < self._retry_at:
            return  # one at a time (its answer comes inside a later poll), or a failure's wait runs
        self._wanted = self._unconfirmed(self._wanted)
        if not self._wanted:
            return
        sent = {(t, p): (self._next_offset(consumer, t, p, o), o) for (t, p), o in self._wanted.items()}
        try:
            consumer.commit(offsets=[TopicPartition(t, p, n) for (t, p), (n, _) in sent.items()], asynchronous=True)
        except KafkaException as exc:
            # Not fatal: sent again after the retry wait; a restart resumes from the checkpoint.
            logger.warning("offset commit failed (%s); retrying in %.0fs", exc, COMMIT_RETRY_SECONDS)
            self._retry_at = now + COMMIT_RETRY_SECONDS
            return
        self._in_flight, self._in_flight_since = sent, now
        if self._unanswered_since is None:
            self._unanswered_since = now

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit (served inside ``consume``, or ``close``); a synchronous
        commit's answer comes here too, later, and matches nothing under way."""
        self._unanswered_since = None  # the coordinator answered, whatever it said
        confirmed: dict[Partition, int] = {}
        stale: list[Partition] = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            sent = self._in_flight.get(key)
            if sent is not None and sent[0] == tp.offset:
                del self._in_flight[key]
                if error is None and tp.error is None:
                    confirmed[key] = sent[1]
            elif error is None and tp.error is None:
                stale.append(key)  # another commit's (the revocation's): the broker holds its offset now
        if not self._in_flight:
            self._in_flight_since = None
        if error is not None or any(tp.error is not None for tp in partitions):
            # Not fatal: sent again after the retry wait; a restart resumes from the checkpoint.
            reason = error or next((tp.error for tp in partitions if tp.error is not None), None)
            logger.warning("offset commit failed (%s); retrying in %.0fs", reason, COMMIT_RETRY_SECONDS)
            self._retry_at = time.monotonic() + COMMIT_RETRY_SECONDS
        if stale:
            self._forget_committed(stale)  # asked for again, the offsets wanted are sent again
        if confirmed:
            self._up = True
            with self._committed_lock:
                self._committed.update(confirmed)
            for key, offset in confirmed.items():
                if self._wanted.get(key) == offset:
                    del self._wanted[key]

    def _commit_now(self, consumer: Consumer, offsets: Mapping[Partition, int], log: str) -> bool:
        """A synchronous commit, on revocation only: the partitions' next owner must find it. Read as down
        while it waits past COMMIT_TIMEOUT_SECONDS (the poll thread waits with it)."""
        payload = [TopicPartition(t, p, self._next_offset(consumer, t, p, o)) for (t, p), o in offsets.items()]
        started = time.monotonic()
        if self._unanswered_since is None:
            self._unanswered_since = started
        try:
            consumer.commit(offsets=payload, asynchronous=False)
        except KafkaException as exc:
            # Not fatal: the next owner resumes from the last commit; a restart from the checkpoint.
            logger.warning(log, exc)
            return False
        finally:
            self._unanswered_since = None  # answered, whatever it said
            if time.monotonic() - started > COMMIT_TIMEOUT_SECONDS:
                logger.warning("an offset commit on revocation held the poll thread for %.1fs",
                               time.monotonic() - started)
        self._up = True
        with self._committed_lock:
            self._committed.update(offsets)
        return True

    def _next_offset(self, consumer: Consumer, topic: str, partition: int, last: int) -> int:
        """The offset to commit after ``last``: past the transaction markers that follow it, when
        nothing was polled after it (librdkafka's position has moved over them)."""
        polled = self._polled.get((topic, partition))
        if polled is None or polled[1] != last:
            return last + 1
        try:
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
        except KafkaException:
            return last + 1
        return max(last + 1, position)

    # ------------------------------------------------------------------ backpressure
    def pause(self) -> None:
        """Stop fetching (backpressure) while polling on, so the group keeps this member."""
        if self._consumer is not None and not self._paused:
            self._consumer.pause(self._consumer.assignment())
        self._paused = True

    def resume(self) -> None:
        if self._consumer is not None and self._paused:
            self._consumer.resume(self._consumer.assignment())
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused

    # ------------------------------------------------------------------ lag, progress, counters
    def _maybe_refresh_lag(self, consumer: Consumer) -> None:
        """Records behind each topic's end, every LAG_REFRESH_SECONDS, on the poll thread: the ends are
        listed within LAG_QUERY_BUDGET_SECONDS for all partitions together, starting with another
        partition each time, and taken from what the fetches saw for the rest, or while the broker
        is not answering (a listing waited 5 s a partition, and the poll thread with it)."""
        if not self._assigned or not self._lag.due():
            return
        keys = sorted(self._assigned)
        try:
            held = consumer.position([TopicPartition(*key) for key in keys])
            positions = {(tp.topic, tp.partition): tp.offset for tp in held}
        except KafkaException:
            return
        start = self._lag_turn % len(keys)
        self._lag_turn += 1
        deadline = time.monotonic() + LAG_QUERY_BUDGET_SECONDS
        listing, answered = self.up, False
        ends: dict[Partition, int] = {}
        lows: dict[Partition, int] = {}
        for key in keys[start:] + keys[:start]:
            tp = TopicPartition(*key)
            listed = (-1, -1)
            remaining = deadline - time.monotonic()
            if listing and remaining > 0:
                try:
                    listed = consumer.get_watermark_offsets(tp, timeout=remaining, cached=False)
                    answered = True
                except KafkaException:
                    listing = False  # not answered in time: the rest from what the fetches saw
            try:
                seen = consumer.get_watermark_offsets(tp, cached=True)  # tansu lists less than it fetches
            except KafkaException:
                seen = (-1, -1)
            if max(listed[1], seen[1]) >= 0:
                ends[key] = int(max(listed[1], seen[1]))
            low = listed[0] if listed[0] >= 0 else seen[0]
            if low is not None and low >= 0:
                lows[key] = int(low)
        if answered:
            self._up = True  # the broker answered
        applied = self.listener.applied_offsets()
        lag: dict[str, int] = {}
        unknown: set[str] = set()
        for key in keys:
            position, end = positions[key], ends.get(key)
            if position < 0:  # nothing consumed since the assignment
                counted_from = self._unconsumed_position(key, applied.get(key), lows.get(key), end)
                if counted_from is None:
                    unknown.add(key[0])
                    continue
                position = counted_from
            if end is None:
                unknown.add(key[0])
                continue
            lag[key[0]] = lag.get(key[0], 0) + records_behind(end, position, self._polled.get(key), applied.get(key))
        previous = self._lag.lag or {}
        for topic in unknown:  # a topic with a partition of unknown end keeps its last reading
            lag.pop(topic, None)
            if topic in previous:
                lag[topic] = previous[topic]
        self._lag.record(lag)
        self._note_progress(lag, applied)

    def _unconsumed_position(self, key: Partition, applied: int | None, low: int | None,
                             end: int | None) -> int | None:
        """Where the lag of a partition counts from while librdkafka reports no position (nothing consumed
        there since the assignment, though it may be fetched): after the last record polled or applied,
        else where the assignment started it: its offset, the log's first offset (earliest) or the end
        listed at the assignment (latest; else the first end seen since). None while that is not known yet.

        Skipping such a partition read 74 records behind instead of 1,124 just after a start."""
        polled = self._polled.get(key)
        if polled is not None:
            return polled[1] + 1
        if applied is not None and applied >= 0:
            return applied + 1
        start = self._starts.get(key)
        if isinstance(start, int):
            return start
        if start == "earliest":
            return low
        if start == "latest" and end is not None:
            self._starts[key] = end  # not listed at the assignment: the first end seen since
            return end
        return None

    def error_counts(self) -> dict[str, int]:
        return {**dict.fromkeys(ERROR_REASONS, 0), **self._errors.snapshot()}

    def offset_reset_counts(self) -> dict[str, int]:
        return {**dict.fromkeys(RESET_REASONS, 0), **self._resets.snapshot()}

    def topic_ids(self) -> dict[str, str]:
        return dict(self._topic_ids)  # kept as restored: librdkafka's metadata here carries no ids

    def remember_topic_ids(self, ids: Mapping[str, str]) -> None:
        self._topic_ids.update(ids)

    @property
    def up(self) -> bool:
        """Connected, and no commit has waited for an answer longer than COMMIT_TIMEOUT_SECONDS."""
        since = self._unanswered_since
        return self._up and (since is None or time.monotonic() - since <= COMMIT_TIMEOUT_SECONDS)
