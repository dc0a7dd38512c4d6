"""Kafka consumer policy that does not depend on the client: where a partition resumes, why a
position is reset, how far behind a partition is, and the label values of the source's counters.

Both Kafka sources, kafka-python's (:mod:`monitor.sources.kafka.source`) and librdkafka's
(:mod:`monitor.sources.kafka.confluent`), decide by these; neither client is imported here.
"""

from __future__ import annotations

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
OFFSET_RESET_POLICIES = ("earliest", "latest")
# embmon_source_errors_total{reason}: a fetched partition whose codec's library is missing; any
# other error the client raised from (or parked in) a poll
ERROR_REASONS = ("unsupported_codec", "poll")
# embmon_source_offset_resets_total{reason}, and what each means, for the log
RESET_REASONS = ("past_end", "before_start", "topic_recreated", "truncated")
RESET_EXPLANATIONS = {
    "past_end": "it is past the log's end (the topic was deleted and recreated or truncated since the offset was "
                "stored, or the stored offset is wrong)",
    "before_start": "it is before the log's start (retention deleted records this consumer had not read)",
    "topic_recreated": "the topic was deleted and created again, and the offsets kept for it belong to the old one",
    "truncated": "the log diverges before it (an unclean leader election)",
}


def seek_position(checkpoint_offset: int | None, committed: int | None) -> int | None:
    """Where to resume a partition: after what the checkpoint reflects, unless the group moved on.

    ``checkpoint_offset`` is the last offset the restored state reflects; ``committed`` the
    group's committed position (the next offset to read). The checkpoint is ahead after a crash
    between a checkpoint and its commit; the group is ahead when another replica consumed the
    partition after this state was saved (its records are in that replica's state, not ours).

    >>> seek_position(99, 80), seek_position(99, 250), seek_position(99, None), seek_position(None, 7)
    (100, 250, 100, None)
    """
    if checkpoint_offset is None:
        return None
    return max(checkpoint_offset + 1, committed if committed is not None and committed >= 0 else 0)


def start_reason(committed: int | None, auto_offset_reset: str) -> str:
    """Where a partition without checkpoint state starts, and why, for the start-up log.

    >>> start_reason(120, "latest")
    "starting at offset 120, the group's committed offset"
    >>> start_reason(None, "earliest")
    'no committed offset for this group: starting at the beginning (auto_offset_reset=earliest)'
    """
    if committed is not None:
        return f"starting at offset {committed}, the group's committed offset"
    where = "the beginning" if auto_offset_reset == "earliest" else "the end, skipping what is already there"
    return f"no committed offset for this group: starting at {where} (auto_offset_reset={auto_offset_reset})"


def records_behind(end: int, position: int, polled: tuple[int, int] | None, applied: int | None) -> int:
    """Records of one partition not yet reflected in the state: those after the consumer's
    position up to the log's ``end`` (the last stable offset under read_committed), plus those
    polled (first and last offset since assignment) but not yet applied.

    The position, not the last applied offset, is the start: kafka-python moves it past the
    marker a committed or aborted transaction leaves (one offset, no record), so a consumer that
    read everything is 0 behind, not 1.

    >>> records_behind(13, 13, (0, 11), 11)  # 12 is a transaction marker
    0
    >>> records_behind(13, 13, (0, 11), 4), records_behind(20, 13, None, None), records_behind(10, 40, None, None)
    (7, 7, 0)
    """
    queued = 0
    if polled is not None:
        first, last = polled
        queued = max(0, last - max(applied if applied is not None else -1, first - 1))
    return max(0, end - position) + queued
