"""The reducer's consumer: the partials topic (every partition, or its group's share), and the interactions topic.

A single reducer (``scale_out.reducer_group`` unset) reads every partition of both topics by
assignment. Several reducers form a consumer group on the partials topic (only it), each owning the
streams whose partials are on its partitions; each also reads every partition of the interactions
topic by assignment (a second consumer), as the probes of a model need all its events. Either way
the positions live in the reducer's own checkpoint together with the state they produced (the
merge table, the probes' buffers), never in the group: a restart resumes right after what the
checkpoint reflects, exactly once. A partials partition without such a position (no checkpoint,
or one gained from another reducer in a rebalance) is read from ``window.seconds + 2 x
scale_out.full_publish_seconds`` back (far enough for every replica's newest full publication
whose sub-windows can still be live, and what followed it; the merge table ignores anything older
or repeated), which rebuilds its streams exactly. In a group a partition's streams are exported only
once it is read up to where its end was when it was assigned, and a refresh started after that
(the exported windows are the last refresh's): never a partial count of a rebuild, nor the older
counts of a checkpoint (a restarted reducer given its partition back, which another reducer
exported meanwhile). A
partition lost in a rebalance takes its streams out of the table (and so out of /metrics) at once.
The interactions topic starts where ``kafka.auto_offset_reset`` says.

Interactions are decoded as in a replica (:class:`~monitor.decoding.decoder.Decoder`) and handed to the
components (the retrieval probes' buffers); nothing here reads embeddings.

One thread polls and applies; :meth:`PartialsReader.at_batch_boundary` runs checkpoint captures
between two polls, so state and positions agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from monitor.component import Component
from monitor.daemon.counters import InternalErrors
from monitor.daemon.ingest import OVERFLOW_STREAM
from monitor.daemon.offsets import OffsetTracker
from monitor.decoding.decoder import Decoder, DecodeResult, RawMessage
from monitor.logs import RateLimitedLog
from monitor.scaleout.partials import PartialError
from monitor.scaleout.table import MergeTable
from monitor.sources.base import Partition
from monitor.sources.kafka.reconnect import Backoff, LagReading
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.sources.kafka.clients import Consumer

logger = logging.getLogger(__name__)

T = TypeVar("T")
PARTITION_REFRESH_SECONDS = 30.0
# kafka-python consumer settings a reader by assignment must not take from kafka.options
_GROUP_ONLY = {"max_poll_interval_ms", "session_timeout_ms", "heartbeat_interval_ms", "partition_assignment_strategy"}


def consumer_config(settings: Settings, group: str | None = None) -> dict[str, Any]:
    """kafka-python settings: the brokers and pass-through options, large enough fetches, no topic
    auto-creation, no group (or ``group``, with cooperative assignment: a reducer keeps the
    partitions it still owns)."""
    from monitor.sources.kafka.clients import CONSUMER_DEFAULTS, CooperativeStickyAssignor
    from monitor.sources.kafka.internals import read_unreadable_records

    # a partials record kafka-python cannot parse (a header key that is not UTF-8) reaches
    # the reader as a record with no key, value or headers, refused like any malformed one, instead of
    # failing every poll at it for good
    read_unreadable_records()
    config = {k: v for k, v in settings.kafka.options.items()
              if k in CONSUMER_DEFAULTS and (group is not None or k not in _GROUP_ONLY)}
    record = settings.scale_out.max_record_bytes + 64 * 1024
    config.update(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        client_id=f"{settings.kafka.client_id}-reducer",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # a checkpointed position past the end (topic recreated): read it all
        max_partition_fetch_bytes=max(int(config.get("max_partition_fetch_bytes", 0)), 2 * record),
        fetch_max_bytes=max(int(config.get("fetch_max_bytes", 0)), 8 * record),
        reconnect_backoff_max_ms=10_000,
        # a reader never creates the topic it reads (librdkafka's consumers never do): kafka-python's
        # metadata requests otherwise recreate a partials topic an operator just deleted, with the
        # broker's default partitions, before its publisher makes it again
        allow_auto_create_topics=False,
    )
    if group is not None:
        config.update(group_id=group, partition_assignment_strategy=(CooperativeStickyAssignor,))
    return config


@dataclass(frozen=True)
class Unreadable:
    """A record kafka-python could not parse (a header key that is not UTF-8, a failed CRC): it
    stands in the poll's result for that offset, with nothing in it, so that it is counted and the
    positions move past it."""

    offset: int
    error: str
    key: None = None
    value: None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def poll_past_unreadable(
    consumer: Consumer, timeout_ms: int, max_records: int | None = None
) -> dict[Any, list[Any]]:
    """``consumer.poll``, moving past exactly the record kafka-python cannot parse.

    Such a record makes every later poll fail (or spin: ``take_fetch_failure`` in
    monitor/sources/kafka/internals.py) without moving the partition: the reducer and every
    replica reading the manifests would stop there for good. It is returned as an
    :class:`Unreadable` at its offset, and the partition seeks past it. Any other poll error is raised.
    """
    from monitor.sources.kafka.clients import CorruptRecordError, KafkaError
    from monitor.sources.kafka.internals import take_fetch_failure

    raised: KafkaError | None = None
    try:
        polled = dict(consumer.poll(timeout_ms=timeout_ms, max_records=max_records))
    except KafkaError as exc:
        polled, raised = {}, exc
    failure = take_fetch_failure(consumer, raised) if hasattr(consumer, "_fetcher") else None  # kafka-python's
    if failure is not None and isinstance(failure.error, CorruptRecordError):
        consumer.seek(failure.partition, failure.offset + 1)
        polled.setdefault(failure.partition, []).append(Unreadable(failure.offset, str(failure.error)))
        return polled
    if raised is not None:
        raise raised
    return polled


class PartialsReader:
    """Polls the partials (and interactions) topics and applies them to the merge table and components."""

    name = "partials"

    def __init__(
        self,
        settings: Settings,
        table: MergeTable,
        decoder: Decoder,
        components: Sequence[Component],
        errors: InternalErrors,
        clock: Callable[[], float] = time.time,
        consumer_factory: Callable[[], Consumer] | None = None,
    ):
        self.settings = settings
        self.table = table
        self.decoder = decoder
        self.components = components
        self.errors = errors
        self.clock = clock
        self.partials_topic = settings.scale_out.partials_topic
        self.interactions_topic = settings.kafka.interactions_topic
        self.group = settings.scale_out.reducer_group
        # any replica's newest full publication whose sub-windows may still be live, and what followed
        full = settings.scale_out.full_publish_seconds or settings.window.seconds
        self.lookback_seconds = settings.window.seconds + 2 * full
        self.offsets = OffsetTracker(durable_commits=True)
        self.invalid: Tally[tuple[str, str]] = Tally()  # (stream, reason)
        self.interactions: Tally[str] = Tally()  # model
        self._consumer_factory = consumer_factory
        self._consumer: Consumer | None = None  # the partials topic (and, without a group, the interactions topic)
        self._side: Consumer | None = None  # in a group: the interactions topic, by assignment
        self._assigned: set[Partition] = set()  # by assignment
        self._owned: set[int] | None = None  # in a group: the partials partitions whose streams the table holds
        self._rebuilding: dict[int, int] = {}  # gained partitions read back, not exported until read up to this end
        self._caught_up: dict[int, float] = {}  # when such a one was read up to its end (clock)
        self.refreshed_at: Callable[[], float | None] | None = None  # the reducer's last refresh (clock), if any
        self.rebalances = 0
        self._partitions_checked = -PARTITION_REFRESH_SECONDS
        self._backoff = Backoff()
        self._up = False
        self._lag = LagReading()
        self._apply_lock = threading.Lock()  # held while one poll is applied, and by captures
        self._stop = threading.Event()
        # taken to hand consumers to the intake or to take them away: a consumer the loop built after
        # ``stop`` gave up waiting for it (a slow join) is closed, not left to the collector
        self._clients_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="embmon-reducer-intake", daemon=True)
        self._log = RateLimitedLog(logger)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
        self.close()
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        with self._clients_lock:
            consumers, self._consumer, self._side = (self._consumer, self._side), None, None
            self._up = False
        _close_all(consumers)

    def _loop(self) -> None:
        try:
            self._polling()
        finally:  # whatever the last poll built, even after ``stop`` stopped waiting for this thread
            self.close()

    def _polling(self) -> None:
        timeout = self.settings.kafka.poll_timeout_seconds
        while not self._stop.is_set():
            try:
                self.poll_once(timeout)
            except Exception:  # never let one bad poll end intake
                self.errors.count("poll")
                logger.exception("reducer poll failed")
                self._up = False
                self._drop_consumer()
                self._stop.wait(min(timeout, 1.0))

    # ------------------------------------------------------------------ polling
    def poll_once(self, timeout: float) -> int:
        """One poll: connect and (re)assign when needed, read, apply; returns records read."""
        consumer = self._connected()
        if consumer is None:
            self._stop.wait(min(timeout, max(0.05, self._backoff.remaining())))
            return 0
        side = self._side if self.group is not None else consumer
        if side is not None:
            self._maybe_assign(side)
        if self.group is None and not self._assigned:
            self._stop.wait(min(timeout, 1.0))
            return 0
        most = self.settings.kafka.max_poll_records
        polled = poll_past_unreadable(consumer, int(timeout * 1000), most)
        if self.group is not None:
            fresh = self._follow_group(consumer)
            polled = {tp: records for tp, records in polled.items() if tp.partition not in fresh}
            if self._side is not None and self._assigned:
                polled.update(poll_past_unreadable(self._side, 0, most))
        count = sum(len(records) for records in polled.values())
        if polled:
            with self._apply_lock:
                self.apply(polled)
        if self._rebuilding:
            self._check_rebuilt(consumer)
        with self._apply_lock:
            self.table.forget_expired()
        self._maybe_refresh_lag(consumer, side)
        return count

    def _follow_group(self, consumer: Consumer) -> set[int]:
        """After a poll in the group: take lost partitions' streams out, read gained ones from where
        their state is (the checkpoint's position, or far enough back to rebuild it). Returns the
        partitions gained (what this poll read of them is dropped: they were just sought)."""
        now = {tp.partition for tp in consumer.assignment() if tp.topic == self.partials_topic}
        if self._owned is None and not now:
            return set()  # not in the group yet: the restored checkpoint's partitions wait for the first assignment
        if self._owned is None:  # the first assignment: what the restored checkpoint holds counts as ours
            restored = {p for (t, p) in self.offsets.applied() if t == self.partials_topic}
            self._release(restored - now)
            # sought (its end read, so it counts as rebuilding) before it is owned: a scrape in between
            # would otherwise export the checkpoint's older counts of a partition another reducer moved on
            self._seek(consumer, restored & now)
            self._owned = restored & now
        if now == self._owned:
            return set()
        lost, gained = self._owned - now, now - self._owned
        self._release(lost)
        self._seek(consumer, gained)
        self._owned = now
        self.rebalances += 1
        logger.info("reducer group %s: merging partitions %s of %s (lost %s, gained %s)", self.group, sorted(now),
                    self.partials_topic, sorted(lost), sorted(gained))
        return gained

    def _check_rebuilt(self, consumer: Consumer) -> None:
        """A gained partition read back up to where its end was when it was gained holds every
        replica's newest publication of its streams: from then on they are exported."""
        from monitor.sources.kafka.clients import TopicPartition

        for partition, end in sorted(self._rebuilding.items()):
            if consumer.position(TopicPartition(self.partials_topic, partition)) >= end:
                del self._rebuilding[partition]
                # rebuilt or restored, the windows exported are the last refresh's: wait for one after this
                self._caught_up[partition] = self.clock()
                logger.info("reducer group %s: partition %d of %s read up to its end; exporting its streams",
                            self.group, partition, self.partials_topic)

    def _release(self, partitions: set[int]) -> None:
        for partition in partitions:
            self._rebuilding.pop(partition, None)
            self._caught_up.pop(partition, None)
        if partitions:
            with self._apply_lock:
                self.table.release(partitions)
                self.table.assembler.forget_partitions({(self.partials_topic, p) for p in partitions})
                self.offsets.forget({(self.partials_topic, p) for p in partitions})

    def _seek(self, consumer: Consumer, partitions: set[int]) -> None:
        from monitor.sources.kafka.clients import TopicPartition

        known = self.offsets.applied()
        back = []
        for partition in sorted(partitions):
            tp = TopicPartition(self.partials_topic, partition)
            if (self.partials_topic, partition) in known:
                consumer.seek(tp, known[(self.partials_topic, partition)] + 1)
            else:
                back.append(tp)
        if back:
            self._seek_back(consumer, back)
        if self.group is not None and partitions:
            # not exported until read up to the end and refreshed since: never a partial count (rebuilt),
            # nor the older one of a checkpoint (restored: another reducer exported newer meanwhile)
            try:
                ends = consumer.end_offsets([TopicPartition(self.partials_topic, p) for p in sorted(partitions)])
            except Exception:  # noqa: BLE001 - exported at once then, counts growing while it catches up
                logger.warning("cannot read the end of %s: its gained streams are exported while rebuilt",
                               self.partials_topic)
                ends = {}
            self._rebuilding.update({tp.partition: int(end) for tp, end in ends.items() if end is not None})

    def read_partitions(self) -> set[int]:
        """The partials partitions this reducer reads (its group's share, or every one)."""
        if self.group is not None:
            return set(self._owned or ())
        return {p for t, p in self._assigned if t == self.partials_topic}

    def owned_partitions(self) -> set[int] | None:
        """The partials partitions whose streams this reducer merges and exports (None: every one)."""
        if self.group is None:
            return None
        owned = self._owned
        if owned is None:
            return set()
        return set(owned) - set(self._rebuilding) - self._not_refreshed()

    def _not_refreshed(self) -> set[int]:
        """Restored partitions read up to their end after the last refresh: the windows it published of
        their streams hold the checkpoint's older counts."""
        caught_up = dict(self._caught_up)
        if self.refreshed_at is None or not caught_up:
            return set()
        at = self.refreshed_at()
        return {p for p, when in caught_up.items() if at is None or at < when}

    def apply(self, polled: dict[Any, list[Any]]) -> None:
        """Apply one poll's records (apply lock held), in partition order."""
        from monitor.sources.kafka.internals import unreadable_reason  # kafka-python, as the consumer is

        interactions: list[RawMessage] = []
        positions: dict[Partition, int] = {}
        for tp, records in polled.items():
            for record in records:
                if isinstance(record, Unreadable):
                    self._unreadable(tp, record.offset, "corrupt_record", record.error)
                elif (reason := unreadable_reason(record.headers)) is not None:  # read_unreadable_records' placeholder
                    self._unreadable(tp, record.offset, reason, reason)
                elif tp.topic == self.partials_topic:
                    self._apply_partial(record.key, record.value, record.headers or (),
                                        (tp.topic, tp.partition, record.offset))
                else:
                    interactions.append((record.value, tuple(record.headers or ())))
                positions[(tp.topic, tp.partition)] = record.offset
        if interactions:
            self._apply_interactions(self.decoder.decode_interactions(interactions))
        # A sub-window still missing chunks is not applied yet: its first chunk is read again after
        # a restart (applying partials twice changes nothing, so the rest may be read twice too).
        for partition, first in self.table.assembler.holds().items():
            if partition in positions:
                positions[partition] = min(positions[partition], first - 1)
        self.offsets.mark_applied(positions)

    def _unreadable(self, tp: Any, offset: int, reason: str, error: str) -> None:
        """A record the Kafka client could not read (a header key that is not UTF-8, a broken batch):
        counted ``corrupt`` on the partials topic, by its reason on the interactions topic, and skipped."""
        if tp.topic == self.partials_topic:
            self.table.ignored.add("corrupt")
        else:
            self.invalid.add((OVERFLOW_STREAM, reason))
        self._log.warning("unreadable", "skipping the record at offset %d of %s/%d: the Kafka client cannot read "
                          "it (%s)", offset, tp.topic, tp.partition, error)

    def _apply_partial(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], at: tuple[str, int, int]
    ) -> None:
        try:
            manifest = self.table.offer_record(key, value, headers, at)
        except PartialError as exc:  # counted by the table; any other exception is one too (offer_record)
            self._log.warning(f"refused:{exc.reason}", "skipping a record of %s at %s (%s): %s", self.partials_topic,
                              at, exc.reason, exc)
            return
        if manifest is not None:  # interaction query vectors are checked against the models' dimensions
            for stream in manifest.streams:  # only an applied manifest's, at the dimension the table merges
                if self.table.dim_of((stream.model, stream.stream)) in (None, stream.dim):
                    self.decoder.dims.setdefault(stream.model, stream.dim)

    def _apply_interactions(self, result: DecodeResult) -> None:
        now = self.clock()
        for event in result.interactions:
            self.interactions.add(event.model)
            for component in self.components:
                with self.errors.guard(f"on_interaction:{component.name}"):
                    component.on_interaction(event, now)
        if result.rejected:
            bounded: Counter[tuple[str, str]] = Counter()
            for (_stream, reason), count in result.rejected.items():
                bounded[(OVERFLOW_STREAM, reason)] += count  # as a replica counts interaction rejects
            self.invalid.update(bounded)
            for reason, detail in result.examples.items():
                self._log.warning(f"invalid:{reason}", "skipping invalid interaction (%s): %s", reason, detail)

    # ------------------------------------------------------------------ the checkpointer's view
    def at_batch_boundary(self, work: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``work`` between two polls (captures see a table and positions that agree)."""
        if not self._apply_lock.acquire(timeout=timeout):
            raise TimeoutError("the reducer's intake did not release its state in time")
        try:
            return work()
        finally:
            self._apply_lock.release()

    def commit_soon(self) -> None:
        """Nothing to commit: the reducer's positions live in its checkpoint."""

    # ------------------------------------------------------------------ Kafka
    def _connected(self) -> Consumer | None:
        if self._consumer is not None:
            return self._consumer
        if not self._backoff.ready():
            return None
        try:
            consumer = self._consumer_factory() if self._consumer_factory else self._new_consumer(self.group)
        except Exception as exc:  # noqa: BLE001 - unreachable broker: retry with backoff
            logger.warning("cannot reach Kafka at %s (%s); retrying in %.1fs",
                           ",".join(self.settings.kafka.bootstrap_servers), type(exc).__name__, self._backoff.failed())
            return None
        if self.group is not None:
            try:
                side = self._new_consumer(None) if self.interactions_topic else None
            except Exception as exc:  # noqa: BLE001 - as above
                _close_all((consumer,))
                logger.warning("cannot reach Kafka at %s (%s); retrying in %.1fs",
                               ",".join(self.settings.kafka.bootstrap_servers), type(exc).__name__,
                               self._backoff.failed())
                return None
            try:
                consumer.subscribe([self.partials_topic])
            except Exception:
                _close_all((consumer, side))
                raise
        with self._clients_lock:
            if self._stop.is_set():  # stopped while this was built: nothing else will close them
                _close_all((consumer, side) if self.group is not None else (consumer,))
                return None
            if self.group is not None:
                self._side = side
            self._consumer, self._up = consumer, True
        self._backoff.succeeded()
        self._assigned = set()
        self._partitions_checked = -PARTITION_REFRESH_SECONDS
        return consumer

    def _new_consumer(self, group: str | None) -> Consumer:
        from monitor.sources.kafka.clients import new_consumer

        return new_consumer(consumer_config(self.settings, group), self.settings.kafka)

    def _drop_consumer(self) -> None:
        self.close()

    def _maybe_assign(self, consumer: Consumer) -> None:
        """Assign every partition of both topics, or in a group of the interactions topic (re-checked
        every 30 s: topics appear, grow)."""
        if time.monotonic() - self._partitions_checked < PARTITION_REFRESH_SECONDS:
            return
        self._partitions_checked = time.monotonic()
        from monitor.sources.kafka.clients import TopicPartition

        wanted: set[Partition] = set()
        topics = (self.partials_topic, self.interactions_topic) if self.group is None else (self.interactions_topic,)
        for topic in filter(None, topics):
            for partition in consumer.partitions_for_topic(topic) or ():
                wanted.add((topic, int(partition)))
        if wanted == self._assigned:
            return
        known = self.offsets.applied()
        consumer.assign([TopicPartition(t, p) for t, p in sorted(wanted)])
        fresh_partials = []
        for topic, partition in sorted(wanted):
            tp = TopicPartition(topic, partition)
            if (topic, partition) in known:
                consumer.seek(tp, known[(topic, partition)] + 1)
            elif topic == self.partials_topic:
                fresh_partials.append(tp)
            elif self.settings.kafka.auto_offset_reset == "earliest":
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek_to_end(tp)
        if fresh_partials:
            self._seek_back(consumer, fresh_partials)
        logger.info("reducer reads %s", sorted(wanted))
        self._assigned = wanted

    def _seek_back(self, consumer: Consumer, partitions: list[Any]) -> None:
        """No checkpoint position: start ``lookback_seconds`` back (every replica republished all since)."""
        since_ms = int((self.clock() - self.lookback_seconds) * 1000)
        try:
            found = consumer.offsets_for_times({tp: since_ms for tp in partitions})
        except Exception:  # noqa: BLE001 - a broker without timestamp lookups: read it all
            logger.warning("cannot look offsets up by time; reading %s from the beginning", self.partials_topic)
            found = {}
        for tp in partitions:
            hit = found.get(tp)
            if tp not in found:
                consumer.seek_to_beginning(tp)
            elif hit is None or hit.offset < 0 or hit.timestamp < 0:  # nothing that recent (tansu: ts -1)
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, hit.offset)

    def _maybe_refresh_lag(self, consumer: Consumer, side: Consumer | None) -> None:
        if not self._lag.due():
            return
        from monitor.sources.kafka.clients import TopicPartition

        lag: dict[str, int] = {}
        reading = [(side, sorted(self._assigned))]
        if self.group is not None:
            reading.append((consumer, [(self.partials_topic, p) for p in sorted(self._owned or ())]))
        for reader, partitions in reading:
            if reader is None or not partitions:
                continue
            try:
                ends = reader.end_offsets([TopicPartition(t, p) for t, p in partitions])
                for tp, end in ends.items():
                    if end is not None:  # every record is applied as soon as it is polled: position = applied + 1
                        lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - reader.position(tp))
            except Exception:  # noqa: BLE001 - lag is diagnostics
                return
        if lag:
            self._lag.record(lag)

    # ------------------------------------------------------------------ status (DaemonStatus reads these)
    @property
    def up(self) -> bool:
        return self._up

    def lag(self) -> dict[str, int] | None:
        return self._lag.lag

    @property
    def lag_updated(self) -> float | None:
        return self._lag.updated

    def queue_depth(self) -> int:
        return 0

    @property
    def paused(self) -> bool:
        return False

    def backpressure_seconds(self) -> float:
        return 0.0


def _close_all(consumers: Iterable[Consumer | None]) -> None:
    from monitor.sources.kafka.clients import close_consumer

    for consumer in consumers:
        if consumer is not None:
            try:  # kafka-python's network client too, even when leaving the group raised
                close_consumer(consumer)
            except Exception:  # closing at shutdown, or a consumer that never fully connected
                logger.debug("closing the reducer's consumer", exc_info=True)
