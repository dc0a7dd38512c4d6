"""Where each partition resumes, checked against its log before anything is committed from it.

A resume position (after what the checkpoint reflects, or the group's committed offset) is only
as good as the log it was taken from. The log may have been deleted and recreated (a new topic
under the old name: its offsets start again at 0), truncated, or trimmed by retention while the
daemon was away; a crafted or damaged checkpoint may hold any offset. Without these checks a daemon resumed
past a recreated topic's end, committed that position and never read the new records, with lag 0
and nothing logged.

The rule (docs/operations.md, "Offsets out of range"): a partition's position is *verified* once
a fetch at it returned records, or the broker's answer to a fetch there (its high watermark) shows
the position within the log. Until then nothing is committed from it. A position found outside
the log, or a topic whose id changed (a recreated topic, seen in the cluster metadata), is *reset*:
logged at ERROR with the position and the log's range, counted in
``embmon_source_offset_resets_total{reason}``, and moved by ``kafka.auto_offset_reset`` (earliest:
the log's first offset; latest: its end). The offsets the daemon kept for the partition
(applied, checkpointed, committed) are replaced by the new position, which is committed.

How each case is seen:

* ``before_start``, ``past_end`` (real Kafka): the broker answers a fetch out of the log's range
  with OFFSET_OUT_OF_RANGE. kafka-python's own reset would move the position silently (one INFO
  line), so the consumer runs with ``auto_offset_reset="none"``: the error reaches the poll thread
  and the reset happens here. Partitions with no position (no checkpoint, no committed offset) are
  started by the policy here too;
* ``past_end`` (brokers that answer a fetch past the end with no records, as tansu does): the
  high watermark of that answer is below the position; confirmed against the listed end;
* ``topic_recreated``: the topic id (KIP-516, in the metadata of Kafka 2.8+ brokers and tansu)
  differs from the one seen before, at assignment or at any poll. Checkpoints keep the ids, so a
  topic recreated while the daemon was stopped is told even when its new log already reaches
  past the old position (with a broker that sends no ids, only the range checks remain);
* ``truncated``: kafka-python's leader-epoch validation (KIP-320) found the log diverging before
  the position (an unclean leader election); the position moves back to where the logs agree.

The rebalance listener runs on kafka-python's IO thread, where nothing may block: it only notes
and pauses; resets (which list the log's offsets) are carried out on the poll thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, LogTruncationError, NoOffsetForPartitionError, OffsetOutOfRangeError

from monitor.sources.base import Partition
from monitor.sources.kafka.internals import current_position, forget_highwater, topic_id
from monitor.sources.kafka.policy import RESET_EXPLANATIONS
from monitor.tally import Tally

logger = logging.getLogger(__name__)

LIST_OFFSETS_TIMEOUT_MS = 5_000
_OUT_OF_RANGE = "out_of_range"  # the broker said so; before_start or past_end once the range is known



@dataclass(frozen=True)
class Reset:
    """A partition whose ``offset`` was found unusable for ``reason``; ``target``: where the log
    continues, when the reason itself says (a truncation), else the policy decides."""

    partition: TopicPartition
    reason: str
    offset: int | None
    detail: str = ""
    target: int | None = None


def key_of(tp: TopicPartition) -> Partition:
    return (tp.topic, tp.partition)


class PositionGuard:
    """The verification and reset state of the partitions one consumer holds (see the module doc)."""

    def __init__(self, policy: str):
        self.policy = policy  # kafka.auto_offset_reset: earliest or latest
        self.counts: Tally[str] = Tally()
        self._topic_ids: dict[str, Any] = {}
        self._recreated: dict[str, str] = {}  # topic -> what changed, until its partitions are next assigned
        self._unverified: set[TopicPartition] = set()
        self._held_commits: dict[Partition, int] = {}  # assignment commits waiting for verification
        self._due: dict[TopicPartition, Reset] = {}
        self.resetting: set[TopicPartition] = set()  # paused here until their reset is carried out

    def known_topic_ids(self) -> dict[str, str]:
        return dict(self._topic_ids)

    def remember_topic_ids(self, ids: Mapping[str, str]) -> None:
        """Ids from a restored checkpoint: the topics as they were when its offsets were taken."""
        self._topic_ids.update(ids)

    # ------------------------------------------------------------------ any thread holding the consumer
    def topic_changed(self, consumer: KafkaConsumer, topic: str) -> str | None:
        """What changed when ``topic``'s id differs from the one seen last (a recreated topic), else None."""
        found = topic_id(consumer, topic)
        if found is None:
            return None
        new = str(found)
        old, self._topic_ids[topic] = self._topic_ids.get(topic), new
        if old is None or old == new:
            return None
        return f"topic id {old} is now {new}"

    def start_by_policy(self, consumer: KafkaConsumer, tp: TopicPartition) -> None:
        """Start a partition that has no position at the log's beginning or end (non-blocking)."""
        if self.policy == "earliest":
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek_to_end(tp)
        forget_highwater(consumer, tp)

    # ------------------------------------------------------------------ the IO thread (assignment)
    def assigned(self, consumer: KafkaConsumer, tp: TopicPartition, commit: int | None) -> str | None:
        """``tp`` was assigned; ``commit``: the offset to commit once its position is verified.
        Returns what changed if its topic was recreated (then the caller resets it, not resumes)."""
        forget_highwater(consumer, tp)
        self._unverified.add(tp)
        self._due.pop(tp, None)
        key = key_of(tp)
        self._held_commits.pop(key, None)
        if commit is not None:
            self._held_commits[key] = commit
        changed = self.topic_changed(consumer, tp.topic)
        return changed or self._recreated.get(tp.topic)

    def assignment_done(self, topics: Iterable[str]) -> None:
        for topic in topics:
            self._recreated.pop(topic, None)

    def reset_later(self, consumer: KafkaConsumer, reset: Reset) -> None:
        """Pause the partition (so nothing is fetched from the unusable position) until the poll
        thread carries the reset out."""
        consumer.pause(reset.partition)
        self.resetting.add(reset.partition)
        self._due[reset.partition] = reset

    def revoked(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._unverified.discard(tp)
            self._due.pop(tp, None)
            self.resetting.discard(tp)
            self._held_commits.pop(key_of(tp), None)

    # ------------------------------------------------------------------ the poll thread
    def take_error(self, consumer: KafkaConsumer, error: BaseException | None) -> bool:
        """Note an error from ``poll`` that is about positions; True when it was one (it is handled)."""
        if isinstance(error, OffsetOutOfRangeError):
            offsets = error.args[0] if error.args and isinstance(error.args[0], Mapping) else {}
            for tp, offset in offsets.items():
                self._due.setdefault(tp, Reset(tp, _OUT_OF_RANGE, int(offset)))
            return True
        if isinstance(error, LogTruncationError):
            for tp, divergent in dict(getattr(error, "divergent_offsets", {}) or {}).items():
                agreed: Any = getattr(divergent, "offset", divergent)
                target = int(agreed)
                self._due[tp] = Reset(tp, "truncated", current_position(consumer, tp),
                                      f"the logs agree up to offset {target}", target)
            return True
        if isinstance(error, NoOffsetForPartitionError):
            partitions = error.args[0] if error.args and isinstance(error.args[0], Iterable) else ()
            for tp in partitions:
                logger.info("partition %s has no committed offset: starting at its %s (auto_offset_reset=%s)",
                            key_of(tp), "beginning" if self.policy == "earliest" else "end", self.policy)
                self.start_by_policy(consumer, tp)
            return True
        return False

    def check(self, consumer: KafkaConsumer, polled: Mapping[TopicPartition, Any], topics: Iterable[str]) -> None:
        """After a poll: partitions that returned records are verified; a position above the high
        watermark of a fetch made at it is past the end; a changed topic id is a recreated topic."""
        assignment = consumer.assignment()
        for tp in polled:
            self._unverified.discard(tp)
        for tp in assignment:
            if tp in polled or tp in self.resetting or tp in self._due:
                continue
            highwater, position = consumer.highwater(tp), current_position(consumer, tp)
            if highwater is None or position is None:
                continue
            if position <= highwater:
                self._unverified.discard(tp)
            else:
                self._due[tp] = Reset(tp, "past_end", position, f"a fetch there found the log ending at {highwater}")
        for topic in topics:
            changed = self.topic_changed(consumer, topic)
            if changed is None:
                continue
            mine = [tp for tp in assignment if tp.topic == topic]
            if not mine:
                self._recreated[topic] = changed  # its offsets are stale wherever it is assigned next
            for tp in mine:
                self._due[tp] = Reset(tp, "topic_recreated", current_position(consumer, tp), changed)

    def carry_out(self, consumer: KafkaConsumer) -> dict[Partition, int]:
        """Carry out the resets that are due; returns each reset partition's new position."""
        if not self._due:
            return {}
        due = [r for tp, r in self._due.items() if tp in consumer.assignment()]
        self._due = {}
        try:
            begins = consumer.beginning_offsets([r.partition for r in due], timeout_ms=LIST_OFFSETS_TIMEOUT_MS)
            ends = consumer.end_offsets([r.partition for r in due], timeout_ms=LIST_OFFSETS_TIMEOUT_MS)
        except KafkaError as exc:
            logger.warning("cannot list the offsets of %s (%s); checking again on the next poll",
                           sorted(key_of(r.partition) for r in due), exc)
            self._due.update({r.partition: r for r in due})
            return {}
        done: dict[Partition, int] = {}
        for reset in due:
            tp = reset.partition
            begin, end = int(begins.get(tp) or 0), int(ends.get(tp) or 0)
            end = max(end, consumer.highwater(tp) or 0)  # some brokers list less than a fetch shows
            reason = reset.reason
            if reason in (_OUT_OF_RANGE, "past_end") and reset.offset is not None:
                if begin <= reset.offset <= end:  # not confirmed: it lies within the log after all
                    self._resume(consumer, tp)
                    self._unverified.discard(tp)
                    continue
                reason = "before_start" if reset.offset < begin else "past_end"
            position = reset.target if reset.target is not None else begin if self.policy == "earliest" else end
            consumer.seek(tp, position)
            forget_highwater(consumer, tp)
            self._resume(consumer, tp)
            self._unverified.discard(tp)
            self.counts.add(reason)
            where = "offset ?" if reset.offset is None else f"offset {reset.offset}"
            logger.error(
                "partition %s: cannot resume at %s: %s (the log's first offset is %d, its end %d%s). Resuming at "
                "offset %d (%s); the offsets kept for the partition (checkpoint, group) are replaced; "
                "embmon_source_offset_resets_total{reason=\"%s\"} counts it",
                key_of(tp), where, RESET_EXPLANATIONS[reason], begin, end,
                f"; {reset.detail}" if reset.detail else "", position,
                "where the logs agree" if reset.target is not None else f"auto_offset_reset={self.policy}", reason,
            )
            done[key_of(tp)] = position
        return done

    def _resume(self, consumer: KafkaConsumer, tp: TopicPartition) -> None:
        if tp in self.resetting:
            self.resetting.discard(tp)
            consumer.resume(tp)

    def committable(self, key: Partition) -> bool:
        """Whether offsets of ``key`` may be committed (its position was verified and it is not being reset)."""
        return not any(key_of(tp) == key for tp in (*self._unverified, *self.resetting, *self._due))

    def take_verified_commits(self) -> dict[Partition, int]:
        """Assignment commits whose partitions are verified by now (each handed out once)."""
        ready = {key: offset for key, offset in self._held_commits.items() if self.committable(key)}
        for key in ready:
            del self._held_commits[key]
        return ready
