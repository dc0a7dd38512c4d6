"""The reducer's consumer: every partition of the partials topic, and of the interactions topic.

The reducer is a single instance, so it reads by assignment, not in a consumer group, and keeps
its positions in its own checkpoint together with the state they produced (the merge table, the
probes' buffers): a restart resumes right after what the checkpoint reflects, exactly once. Without
a checkpoint it starts ``window.seconds + 2 x scale_out.full_publish_seconds`` back in the partials
topic (far enough for every replica's newest full publication whose sub-windows can still be live,
and what followed it; the merge table ignores anything older or repeated) and where
``kafka.auto_offset_reset`` says in the interactions topic.

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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from monitor.component import Component
from monitor.config import Settings
from monitor.daemon.counters import InternalErrors, Tally
from monitor.daemon.ingest import OVERFLOW_STREAM
from monitor.daemon.offsets import OffsetTracker, Partition
from monitor.decoding.decoder import Decoder, DecodeResult, RawMessage
from monitor.logs import RateLimitedLog
from monitor.scaleout.partials import PartialError
from monitor.scaleout.table import MergeTable
from monitor.sources.reconnect import Backoff, LagReading

logger = logging.getLogger(__name__)

T = TypeVar("T")
PARTITION_REFRESH_SECONDS = 30.0
# kafka-python consumer settings a reader by assignment must not take from kafka.options
_GROUP_ONLY = {"max_poll_interval_ms", "session_timeout_ms", "heartbeat_interval_ms", "partition_assignment_strategy"}


def consumer_config(settings: Settings) -> dict[str, Any]:
    """kafka-python settings: the brokers and pass-through options, no group, large enough fetches."""
    from kafka import KafkaConsumer

    config = {k: v for k, v in settings.kafka.options.items()
              if k in KafkaConsumer.DEFAULT_CONFIG and k not in _GROUP_ONLY}
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
    )
    return config


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
        consumer_factory: Callable[[], Any] | None = None,
    ):
        self.settings = settings
        self.table = table
        self.decoder = decoder
        self.components = components
        self.errors = errors
        self.clock = clock
        self.partials_topic = settings.scale_out.partials_topic
        self.interactions_topic = settings.kafka.interactions_topic
        # any replica's newest full publication whose sub-windows may still be live, and what followed
        full = settings.scale_out.full_publish_seconds or settings.window.seconds
        self.lookback_seconds = settings.window.seconds + 2 * full
        self.offsets = OffsetTracker(durable_commits=True)
        self.invalid: Tally[tuple[str, str]] = Tally()  # (stream, reason)
        self.interactions: Tally[str] = Tally()  # model
        self._consumer_factory = consumer_factory
        self._consumer: Any = None
        self._assigned: set[Partition] = set()
        self._partitions_checked = -PARTITION_REFRESH_SECONDS
        self._backoff = Backoff()
        self._up = False
        self._lag = LagReading()
        self._apply_lock = threading.Lock()  # held while one poll is applied, and by captures
        self._stop = threading.Event()
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
        consumer, self._consumer = self._consumer, None
        self._up = False
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # closing at shutdown
                logger.debug("closing the reducer's consumer", exc_info=True)

    def _loop(self) -> None:
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
        self._maybe_assign(consumer)
        if not self._assigned:
            self._stop.wait(min(timeout, 1.0))
            return 0
        polled = consumer.poll(timeout_ms=int(timeout * 1000), max_records=self.settings.kafka.max_poll_records)
        count = sum(len(records) for records in polled.values())
        if polled:
            with self._apply_lock:
                self.apply(polled)
        with self._apply_lock:
            self.table.forget_expired()
        self._maybe_refresh_lag(consumer)
        return count

    def apply(self, polled: dict[Any, list[Any]]) -> None:
        """Apply one poll's records (apply lock held), in partition order."""
        interactions: list[RawMessage] = []
        positions: dict[Partition, int] = {}
        for tp, records in polled.items():
            for record in records:
                if tp.topic == self.partials_topic:
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

    def _apply_partial(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], at: tuple[str, int, int]
    ) -> None:
        try:
            manifest = self.table.offer_record(key, value, headers, at)
        except PartialError as exc:
            self._log.warning("corrupt", "skipping an unusable record of %s: %s", self.partials_topic, exc)
            return
        if manifest is not None:  # interaction query vectors are checked against the models' dimensions
            for stream in manifest.streams:
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
    def _connected(self) -> Any:
        if self._consumer is not None:
            return self._consumer
        if not self._backoff.ready():
            return None
        try:
            consumer = self._consumer_factory() if self._consumer_factory else self._new_consumer()
        except Exception as exc:  # noqa: BLE001 - unreachable broker: retry with backoff
            logger.warning("cannot reach Kafka at %s (%s); retrying in %.1fs",
                           ",".join(self.settings.kafka.bootstrap_servers), type(exc).__name__, self._backoff.failed())
            return None
        self._backoff.succeeded()
        self._consumer, self._up = consumer, True
        self._assigned = set()
        self._partitions_checked = -PARTITION_REFRESH_SECONDS
        return consumer

    def _new_consumer(self) -> Any:
        from kafka import KafkaConsumer

        return KafkaConsumer(**consumer_config(self.settings))

    def _drop_consumer(self) -> None:
        self.close()

    def _maybe_assign(self, consumer: Any) -> None:
        """Assign every partition of both topics (re-checked every 30 s: topics appear, grow)."""
        if time.monotonic() - self._partitions_checked < PARTITION_REFRESH_SECONDS:
            return
        self._partitions_checked = time.monotonic()
        from kafka import TopicPartition

        wanted: set[Partition] = set()
        for topic in filter(None, (self.partials_topic, self.interactions_topic)):
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

    def _seek_back(self, consumer: Any, partitions: list[Any]) -> None:
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

    def _maybe_refresh_lag(self, consumer: Any) -> None:
        if not self._assigned or not self._lag.due():
            return
        from kafka import TopicPartition

        try:
            ends = consumer.end_offsets([TopicPartition(t, p) for t, p in sorted(self._assigned)])
        except Exception:  # noqa: BLE001 - lag is diagnostics
            return
        lag: dict[str, int] = {}
        for tp, end in ends.items():
            if end is not None:  # every record is applied as soon as it is polled: position = applied + 1
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, end - consumer.position(tp))
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
