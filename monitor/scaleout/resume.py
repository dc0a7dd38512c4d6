"""Where a replica resumes: the partials topic is the source of truth.

A replica publishes a checkpoint's state, then commits its offsets. Killed in between, its
publication is in the partials topic (the reducer merges it) while the group's committed offsets
are older: whoever owns the partition next would read those records again and the reducer would
count them twice, for good if the replica never returns. So a partition's new owner resumes at
``max(group commit, newest published offset + 1)``, where the newest published offset is the
largest offset any replica's newest manifest reflects for that partition, and a restarting
replica restores the checkpoint its newest manifest in the topic names, even if its marker is
older (the publication is what the reducer holds and what the other replicas resume after).

The manifests are read from the beginning of the partials topic, then incrementally, up to its
end at the time of each call (only manifest records are decoded): a replica that died long ago
still counts, as long as the topic keeps its newest manifest (it is compacted by key).

Only a manifest that passes every check may move a position: signed under an accepted key (with
``scale_out.partials_key_file``), of a replica in ``scale_out.replicas`` (when set), with an epoch
below 2^63 and not further ahead of this replica's clock than ``scale_out.max_clock_skew_seconds``,
and within the reader's bounds. Refused ones are counted by reason
(``embmon_partials_manifests_refused_total``), and a published offset is never taken beyond the
partition's end as the broker lists it (``beyond_end``): a position past the log would skip every
record written until the log reaches it.

A publication's manifest (its seal) goes to every partition once its partials are acknowledged;
a reducer switches the streams of a partition to it when it reads it there. A replica killed
while writing the seals leaves it on some partitions only: the newest manifest on any partition
is the one whose offsets count (it may already be merged), so :meth:`ManifestReader.incomplete`
names the partitions still missing it and the replica that resumes writes it there
(:meth:`monitor.scaleout.replica.ReplicaRole.complete_seals`; the partials it binds are on the
topic already, so every reducer then holds that publication whole).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from monitor.logs import RateLimitedLog
from monitor.scaleout import signing
from monitor.scaleout.partials import (
    KIND_HEADER,
    MANIFEST,
    Bounds,
    Manifest,
    PartialError,
    Record,
    parse_record,
    record_replica,
)
from monitor.sources.base import Partition
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.sources.kafka.clients import Consumer

logger = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 20.0
# The `reason` label of embmon_partials_manifests_refused_total.
REFUSED_REASONS = ("unsigned", "bad_signature", "unknown_replica", "epoch_range", "oversize", "limit",
                   "dim_mismatch", "corrupt", "beyond_end")


class ManifestReader:
    """Each replica's newest manifest in the partials topic (by epoch), kept up to date incrementally.

    The first call reads the topic from its beginning (at start-up, before any assignment); later
    calls (on each assignment, on kafka-python's rebalance path) read only what was published
    since, up to the topic's end at the time of the call, so they cost what the replicas
    published meanwhile rather than the whole topic. A partition whose end moved back (the topic
    deleted and recreated) is read again from its beginning, and what was known is dropped.
    """

    def __init__(self, settings: Settings, timeout: float = READ_TIMEOUT_SECONDS, clock: Any = time.time,
                 refused: Tally[str] | None = None):
        self.settings = settings
        self.timeout = timeout
        self.clock = clock
        self.bounds = Bounds.of(settings)
        self.keys = settings.scale_out.partials_keys()
        self.trusted = frozenset(settings.scale_out.replicas)
        self.refused: Tally[str] = Tally() if refused is None else refused  # by reason
        self._log = RateLimitedLog(logger)
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._newest: dict[str, Manifest] = {}
        self._raw: dict[str, Any] = {}  # replica -> the record of its newest manifest
        self._sealed: dict[str, dict[int, int]] = {}  # replica -> partition -> newest epoch read there
        self._partitions: list[int] = []

    def newest(self) -> dict[str, Manifest] | None:
        """The newest manifest per replica, or ``None`` when the topic cannot be read to its end in time."""
        from monitor.sources.kafka.clients import KafkaError

        with self._lock:
            try:
                return self._catch_up()
            except KafkaError as exc:
                logger.warning("cannot read the published manifests (%s)", exc)
                self.close_locked()
                return None

    def _catch_up(self) -> dict[str, Manifest] | None:
        from monitor.scaleout.intake import consumer_config, poll_past_unreadable
        from monitor.sources.kafka.clients import TopicPartition, new_consumer

        topic = self.settings.scale_out.partials_topic
        deadline = time.monotonic() + self.timeout
        if self._consumer is None:
            config = consumer_config(self.settings)
            config["client_id"] = f"{self.settings.kafka.client_id}-resume-{self.settings.scale_out.replica_id}"
            self._consumer = new_consumer(config, self.settings.kafka)
            self._newest = {}
        consumer = self._consumer
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return {}
        self._partitions = [tp.partition for tp in partitions]
        if set(partitions) != consumer.assignment():
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            self._forget()
        ends = consumer.end_offsets(partitions)
        if any(consumer.position(tp) > ends[tp] for tp in partitions):  # recreated: its old records are gone
            consumer.seek_to_beginning(*partitions)
            self._forget()
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                logger.warning("the published manifests were not read to the end of %s within %.0fs", topic,
                               self.timeout)
                return None
            for tp, records in poll_past_unreadable(consumer, 500).items():  # one unreadable record stops nothing
                for record in records:
                    manifest = self._manifest(record)
                    if manifest is None:
                        continue
                    sealed = self._sealed.setdefault(manifest.replica, {})
                    sealed[tp.partition] = max(sealed.get(tp.partition, -1), manifest.epoch)
                    if manifest.epoch > getattr(self._newest.get(manifest.replica), "epoch", -1):
                        self._newest[manifest.replica] = manifest
                        self._raw[manifest.replica] = record
        return dict(self._newest)

    def _forget(self) -> None:
        self._newest, self._raw, self._sealed = {}, {}, {}

    def incomplete(self) -> list[tuple[Record, list[int]]]:
        """Each replica's newest manifest (as read, at the last :meth:`newest`) that is not on every
        partition yet, with the partitions it is missing from. Only sealed manifests (every stream
        names its partition): an older build's manifest was written to one partition on purpose."""
        with self._lock:
            out = []
            for replica, manifest in sorted(self._newest.items()):
                if any(s.partition is None for s in manifest.streams):
                    continue
                sealed = self._sealed.get(replica, {})
                missing = [p for p in self._partitions if sealed.get(p, -1) < manifest.epoch]
                raw = self._raw[replica]
                if missing:
                    out.append((Record(raw.key, raw.value, tuple(raw.headers or ())), missing))
            return out

    def _manifest(self, record: object) -> Manifest | None:
        """The manifest in ``record``, if it is one that may move a position (module docstring)."""
        headers = getattr(record, "headers", None) or ()
        value = getattr(record, "value", None)
        if (MANIFEST.encode(),) != tuple(raw for name, raw in headers if name == KIND_HEADER) or value is None:
            return None
        try:
            why = signing.refusal(self.keys, getattr(record, "key", None), value, headers)
            if why is not None:
                raise PartialError("a manifest without a valid signature", why)
            named = record_replica(getattr(record, "key", None))
            if self.trusted and named not in self.trusted:
                raise PartialError(f"replica {named!r} is not in scale_out.replicas", "unknown_replica")
            manifest = parse_record(getattr(record, "key", None), value, headers, self.bounds)
            if not isinstance(manifest, Manifest):  # its replica is the key's (parse_record checks)
                raise PartialError("a manifest's kind on another record")
            why = self.bounds.epoch_refusal(manifest.epoch, self.clock())
            if why is not None:
                raise PartialError(f"epoch {manifest.epoch} is beyond this clock + max_clock_skew_seconds", why)
        except PartialError as exc:  # parse_record turns any other exception into one
            self.refused.add(exc.reason if exc.reason in REFUSED_REASONS else "corrupt")
            self._log.warning(f"refused:{exc.reason}", "a manifest on %s cannot move a position (%s): %s",
                              self.settings.scale_out.partials_topic, exc.reason, exc)
            return None
        return manifest

    def capped(self, published: Mapping[Partition, int]) -> dict[Partition, int]:
        """``published`` with every offset at most the last one its partition's log holds: past the end
        the broker lists (and not found by reading there), capped at that end and counted
        ``beyond_end``; the embeddings topic's partitions only. Left out where the end cannot be
        read: a position no log confirms moves nothing."""
        from monitor.sources.kafka.clients import KafkaError, TopicPartition

        topic = self.settings.kafka.embeddings_topic
        mine = {key: offset for key, offset in published.items() if key[0] == topic}
        if not mine:
            return {}
        with self._lock:
            try:
                consumer = self._consumer
                ends = consumer.end_offsets([TopicPartition(t, p) for t, p in sorted(mine)]) if consumer else {}
            except KafkaError as exc:
                ends = {}
                logger.error("cannot read the end offsets of %s (%s): resuming from the group's commits (records "
                             "published but not committed by a replica that died may count twice)", topic, exc)
        beyond = {(t, p): offset for (t, p), offset in mine.items()
                  if (end := ends.get(TopicPartition(t, p))) is not None and offset > int(end) - 1}
        held = self._in_log(beyond) if beyond else set()
        out = {}
        for (t, p), offset in mine.items():
            end = ends.get(TopicPartition(t, p))
            if end is None:
                continue
            if (t, p) in beyond and (t, p) not in held:
                self.refused.add("beyond_end")
                self._log.warning("beyond_end", "a manifest reflects offset %d of %s/%d, whose log ends at %d: "
                                  "capped", offset, t, p, int(end))
                offset = int(end) - 1
            out[(t, p)] = offset
        return out

    def _in_log(self, offsets: Mapping[Partition, int]) -> set[Partition]:
        """The partitions whose log holds a record at ``offsets`` (read there): a broker may list an end
        below what it holds (tansu lists the base offset of the last batch, plus one)."""
        from monitor.scaleout.intake import consumer_config, poll_past_unreadable
        from monitor.sources.kafka.clients import TopicPartition, close_consumer, new_consumer

        config = consumer_config(self.settings)
        config["client_id"] = f"{self.settings.kafka.client_id}-resume-check-{self.settings.scale_out.replica_id}"
        found: set[Partition] = set()
        consumer = None
        try:
            consumer = new_consumer(config, self.settings.kafka)
            consumer.assign([TopicPartition(t, p) for t, p in sorted(offsets)])
            for (t, p), offset in offsets.items():
                consumer.seek(TopicPartition(t, p), offset)
            deadline = time.monotonic() + min(self.timeout, 5.0)
            while set(offsets) - found and time.monotonic() < deadline:
                for tp, records in poll_past_unreadable(consumer, 200).items():
                    if any(r.offset == offsets.get((tp.topic, tp.partition)) for r in records):
                        found.add((tp.topic, tp.partition))
                        consumer.pause(tp)
        except Exception as exc:  # noqa: BLE001 - unconfirmed: capped
            logger.warning("cannot read %s at the published offsets (%s)", sorted(offsets), exc)
        finally:
            if consumer is not None:
                close_consumer(consumer)
        return found

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def close_locked(self) -> None:
        from monitor.sources.kafka.clients import close_consumer

        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            close_consumer(consumer)


def published_offsets(manifests: Mapping[str, Manifest]) -> dict[Partition, int]:
    """Per partition, the largest offset a replica's newest publication reflects.

    >>> from monitor.scaleout.partials import WindowGeometry
    >>> g = WindowGeometry(60.0, 4, 100, 0.05)
    >>> a = Manifest("a", 5, "i", g, {("t", 0): 99, ("t", 1): 10}, ())
    >>> b = Manifest("b", 7, "j", g, {("t", 0): 40}, ())
    >>> published_offsets({"a": a, "b": b})
    {('t', 0): 99, ('t', 1): 10}
    """
    offsets: dict[Partition, int] = {}
    for manifest in manifests.values():
        for key, offset in manifest.offsets.items():
            offsets[key] = max(offset, offsets.get(key, -1))
    return offsets


def resume_after(own: Mapping[Partition, int], published: Mapping[Partition, int]) -> dict[Partition, int]:
    """The last offset to skip per partition: what this replica's state reflects, or what any
    replica published, whichever is further (the Kafka source seeks to it + 1, or to the group
    commit if that is further still).

    >>> resume_after({("t", 0): 50}, {("t", 0): 80, ("t", 1): 7})
    {('t', 0): 80, ('t', 1): 7}
    """
    merged = dict(own)
    for key, offset in published.items():
        if offset > merged.get(key, -1):
            merged[key] = offset
    return merged
