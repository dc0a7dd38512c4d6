"""The published marker: which of a replica's checkpoints the group's committed offsets match.

``<state_dir>/partials-published.json`` records the newest epoch whose publication was sent *and*
whose offsets were committed; on restart a checkpoint newer than it is not restored (its records
are read again by whoever owns the partition). Writing the marker and committing the offsets are
two durable steps with no transaction between them, so the marker also records the **commit
intent** before each commit: the epoch, the offsets about to be committed and what this replica
had committed before on those partitions. A replica killed between the commit and the marker
finds the intent on restart and asks the broker which of the two offsets the group holds
(:func:`commit_happened`): restoring the older checkpoint after the commit went through would
lose the records in between once another replica resumes from the committed offsets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from monitor.sources.base import Partition
from monitor.storage.durable_files import atomic_write

logger = logging.getLogger(__name__)

MARKER = "partials-published.json"


@dataclass(frozen=True)
class CommitIntent:
    """A commit that was about to be sent: ``offsets`` (last offset reflected) and this replica's
    previous commit on each of those partitions (``None``: unknown, e.g. first commit after a start)."""

    epoch: int
    offsets: Mapping[Partition, int]
    before: Mapping[Partition, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class MarkerState:
    replica: str
    epoch: int
    committing: CommitIntent | None = None


class PublishedMarker:
    """The marker file, written atomically (write, fsync, rename)."""

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / MARKER

    def read(self) -> MarkerState | None:
        try:
            data = json.loads(self.path.read_text())
            intent = data.get("committing")
            return MarkerState(str(data["replica"]), int(data["epoch"]), _intent(intent) if intent else None)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error("unreadable %s (%s): treating it as missing", self.path, exc)
            return None

    def write(self, replica: str, epoch: int, committing: CommitIntent | None = None) -> None:
        data: dict[str, object] = {"replica": replica, "epoch": int(epoch)}
        if committing is not None:
            data["committing"] = {
                "epoch": committing.epoch,
                "offsets": [[t, p, o] for (t, p), o in sorted(committing.offsets.items())],
                "before": [[t, p, o] for (t, p), o in sorted(committing.before.items())],
            }
        body = json.dumps(data).encode()
        atomic_write(self.path, lambda handle: handle.write(body))


def _intent(data: Mapping[str, object]) -> CommitIntent:
    offsets = {(str(t), int(p)): int(o) for t, p, o in data["offsets"]}  # type: ignore[attr-defined]
    before = {(str(t), int(p)): (None if o is None else int(o)) for t, p, o in data.get("before", [])}  # type: ignore[attr-defined]
    return CommitIntent(int(data["epoch"]), offsets, before)  # type: ignore[call-overload]


def commit_happened(intent: CommitIntent, committed: Mapping[Partition, int | None]) -> bool | None:
    """Did the intended commit reach the group? ``committed``: the group's committed position (next
    offset to read) per partition, as the broker reports it now. ``None`` when it cannot tell.

    A partition decides when exactly one of the two positions matches: ``offset + 1`` (it went
    through) or ``before + 1`` / no commit at all (it did not). A partition another replica has
    committed past since, or whose offset did not change, says nothing.

    >>> intent = CommitIntent(7, {("t", 0): 99, ("t", 1): 50}, {("t", 0): 80, ("t", 1): 50})
    >>> commit_happened(intent, {("t", 0): 100, ("t", 1): 51}), commit_happened(intent, {("t", 0): 81})
    (True, False)
    >>> commit_happened(intent, {("t", 0): 250}) is None  # moved on by another replica: unknown
    True
    """
    verdicts = set()
    for key, offset in intent.offsets.items():
        before = intent.before.get(key)
        if before == offset:
            continue
        position = committed.get(key)
        if position == offset + 1:
            verdicts.add(True)
        elif position is None or (before is not None and position == before + 1):
            verdicts.add(False)
    if len(verdicts) == 1:
        return verdicts.pop()
    if not intent.offsets or all(intent.before.get(k) == o for k, o in intent.offsets.items()):
        return True  # nothing changed: the older checkpoint and the newer hold the same records
    return None
