"""The partials topic's records: a replica's sub-window states and the manifest that binds them.

A replica's publication is a set of **sub-window partials**, each on the partition of its
(model, stream) (:func:`partition_of`), followed, once every partial is acknowledged, by one
**manifest** written to every partition (the **seal**): on each partition a reader sees a stream's
partials before the seal that binds them, so a reducer that owns some partitions switches each of
their streams to a publication atomically (docs/operations.md, "Scaling out: exactly-once"):

* a sub-window partial carries one sub-window of one (model, stream) exactly as the replica's
  window holds it: the :class:`~monitor.state.stats.SufficientStats` and
  :class:`~monitor.state.reservoir.Reservoir` state dicts and the alignment sums, in the
  checkpoint container (:mod:`monitor.storage.checkpoint_format`: sha256-checked, never pickled). Larger than
  ``max_record_bytes``, it is split into chunks, each a record;
* the manifest lists every sub-window the replica holds at that epoch with the epoch of the
  publication that last sent it, the window geometry and the source offsets the state reflects.
  Only sub-windows that changed are re-sent; the manifest says which older ones still stand, and
  on which partition each stream's partials are (``partition``; a manifest without it, written by
  an older build, put everything on the partition it was read from).

Record keys are JSON arrays, stable per sub-window and chunk, so a compacted topic keeps the
newest of each; a ``null`` value (tombstone) clears a sub-window the replica no longer holds.
Headers: ``embmon-kind`` (``subwindow`` or ``manifest``), ``embmon-epoch`` and, for chunks,
``embmon-chunk`` = ``i/n``.

An epoch is a replica's capture time in nanoseconds, strictly increasing per replica across
restarts (:class:`EpochClock`); a newer epoch of a key replaces an older one, whatever order or
how many times records are read.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from monitor.scaleout.canary_rows import CanaryRows
from monitor.state.reservoir import Reservoir
from monitor.state.stats import SufficientStats
from monitor.storage import checkpoint_format as ckpt

KIND_HEADER, EPOCH_HEADER, CHUNK_HEADER = "embmon-kind", "embmon-epoch", "embmon-chunk"
SUBWINDOW, MANIFEST = "subwindow", "manifest"
FORMAT = 1

SubwindowKey = tuple[str, str, int]  # (model, stream, sub-window index)
Offsets = dict[tuple[str, int], int]  # (topic, partition) -> last offset reflected


class PartialError(ValueError):
    """A record of the partials topic that cannot be used (corrupt, another format, inconsistent)."""


class EpochClock:
    """Nanosecond capture times, strictly increasing, never below what was issued before a restart.

    >>> clock = EpochClock(now=lambda: 5.0)
    >>> clock.advance_past(5_000_000_007)
    >>> clock.next(), clock.next()
    (5000000008, 5000000009)
    """

    def __init__(self, now: Any = time.time) -> None:
        self._now = now
        self._last = 0

    def advance_past(self, epoch: int) -> None:
        self._last = max(self._last, int(epoch))

    def next(self) -> int:
        self._last = max(self._last + 1, int(self._now() * 1e9))
        return self._last


@dataclass(frozen=True)
class WindowGeometry:
    """What makes two replicas' sub-window k the same time slice with comparable samples."""

    seconds: float
    subwindows: int
    reservoir_size: int
    alignment_alpha: float

    @classmethod
    def of(cls, window_state: Mapping[str, Any]) -> WindowGeometry:
        return cls(float(window_state["window_seconds"]), int(window_state["subwindows"]),
                   int(window_state["reservoir_size"]), float(window_state["alignment_alpha"]))


@dataclass(frozen=True)
class SubwindowPartial:
    """One replica's exact state of one sub-window of one (model, stream)."""

    replica: str
    model: str
    stream: str
    index: int
    epoch: int
    stats: SufficientStats
    reservoir: Reservoir
    alignment_sum: float
    alignment_pairs: int
    canaries: CanaryRows | None = None  # the canary records among its rows (monitor/scaleout/canary_rows.py)

    @property
    def key(self) -> SubwindowKey:
        return (self.model, self.stream, self.index)

    def state_dict(self) -> dict[str, Any]:
        """The sub-window as the window's own state dict lays it out, plus who sent it when."""
        sub: dict[str, Any] = {
            "index": self.index, "stats": self.stats.state_dict(), "reservoir": self.reservoir.state_dict(),
            "alignment_sum": self.alignment_sum, "alignment_pairs": self.alignment_pairs,
        }
        if self.canaries is not None:
            sub["canaries"] = self.canaries.state_dict()
        return {"replica": self.replica, "model": self.model, "stream": self.stream, "epoch": self.epoch,
                "subwindow": sub}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> SubwindowPartial:
        sub = state["subwindow"]
        stats = SufficientStats.from_state_dict(sub["stats"])
        reservoir = Reservoir.from_state_dict(sub["reservoir"])
        if reservoir.dim != stats.dim:
            raise PartialError(f"reservoir of dim {reservoir.dim} with statistics of dim {stats.dim}")
        canaries = None if sub.get("canaries") is None else CanaryRows.from_state_dict(sub["canaries"], stats.dim)
        return cls(str(state["replica"]), str(state["model"]), str(state["stream"]), int(sub["index"]),
                   int(state["epoch"]), stats, reservoir, float(sub["alignment_sum"]), int(sub["alignment_pairs"]),
                   canaries)


@dataclass(frozen=True)
class StreamManifest:
    """One (model, stream) of a replica: its sub-windows as (index, epoch that sent it, records)."""

    model: str
    stream: str
    dim: int
    subwindows: tuple[tuple[int, int, int], ...]
    pending_pairs: int = 0
    pending_pairs_evicted: int = 0
    partition: int | None = None  # where its partials are (None: the partition the manifest was read on)

    def on(self, read_on: int) -> int:
        """The partition this stream's partials are on, given the one the manifest was read on."""
        return read_on if self.partition is None else self.partition


@dataclass(frozen=True)
class Manifest:
    """Everything a replica's state holds at one epoch, and the offsets it reflects."""

    replica: str
    epoch: int
    instance: str  # one per process start: two processes under one replica id show as two
    geometry: WindowGeometry
    offsets: Offsets
    streams: tuple[StreamManifest, ...]

    def entries(self) -> dict[SubwindowKey, int]:
        """(model, stream, index) -> the epoch of the partial that holds it."""
        return {(s.model, s.stream, index): epoch for s in self.streams for index, epoch, _ in s.subwindows}

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "replica": self.replica, "epoch": self.epoch, "instance": self.instance,
            "window": vars(self.geometry),
            "offsets": [[t, p, o] for (t, p), o in sorted(self.offsets.items())],
            "streams": [
                {"model": s.model, "stream": s.stream, "dim": s.dim, "subwindows": [list(x) for x in s.subwindows],
                 "pending_pairs": s.pending_pairs, "pending_pairs_evicted": s.pending_pairs_evicted,
                 **({} if s.partition is None else {"partition": s.partition})}
                for s in self.streams
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        if data.get("format") != FORMAT:
            raise PartialError(f"manifest format {data.get('format')!r}, this build reads {FORMAT}")
        w = data["window"]
        return cls(
            str(data["replica"]), int(data["epoch"]), str(data["instance"]),
            WindowGeometry(float(w["seconds"]), int(w["subwindows"]), int(w["reservoir_size"]),
                           float(w["alignment_alpha"])),
            {(str(t), int(p)): int(o) for t, p, o in data["offsets"]},
            tuple(
                StreamManifest(str(s["model"]), str(s["stream"]), int(s["dim"]),
                               tuple((int(i), int(e), int(n)) for i, e, n in s["subwindows"]),
                               int(s["pending_pairs"]), int(s["pending_pairs_evicted"]),
                               None if s.get("partition") is None else int(s["partition"]))
                for s in data["streams"]
            ),
        )


def partition_of(model: str, stream: str, partitions: Sequence[int]) -> int:
    """The partition of the partials topic that holds every replica's records of (model, stream).

    >>> partition_of("m", "default", [0, 1, 2]) == partition_of("m", "default", [2, 0, 1])
    True
    """
    ordered = sorted(partitions) or [0]
    return ordered[zlib.crc32(orjson.dumps([model, stream])) % len(ordered)]


# ------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class Record:
    """One Kafka record of the partials topic, as the producer sends it."""

    key: bytes
    value: bytes | None  # None: a tombstone
    headers: tuple[tuple[str, bytes], ...]
    stream: tuple[str, str] | None = None  # (model, stream) of a partial or tombstone; None: the seal


def subwindow_key(replica: str, key: SubwindowKey, chunk: int) -> bytes:
    return orjson.dumps([SUBWINDOW, replica, key[0], key[1], key[2], chunk])


def manifest_key(replica: str) -> bytes:
    return orjson.dumps([MANIFEST, replica])


def encode_subwindow(
    replica: str, model: str, stream: str, epoch: int, subwindow_state: Mapping[str, Any], max_record_bytes: int
) -> list[Record]:
    """A sub-window state (an entry of the window state dict's ``live``) as chunked records."""
    tree = {"format": FORMAT, "replica": replica, "model": model, "stream": stream, "epoch": epoch,
            "subwindow": dict(subwindow_state)}
    arrays: list[np.ndarray] = []
    data = ckpt.encode(ckpt.flatten(tree, arrays), arrays)
    chunks = [data[i : i + max_record_bytes] for i in range(0, len(data), max_record_bytes)]
    key = (model, stream, int(subwindow_state["index"]))
    return [
        Record(subwindow_key(replica, key, i), chunk,
               ((KIND_HEADER, SUBWINDOW.encode()), (EPOCH_HEADER, str(epoch).encode()),
                (CHUNK_HEADER, f"{i}/{len(chunks)}".encode())), (model, stream))
        for i, chunk in enumerate(chunks)
    ]


def tombstones(replica: str, key: SubwindowKey, chunks: int) -> list[Record]:
    """Clear a sub-window (all its chunk keys) from a compacted topic."""
    return [Record(subwindow_key(replica, key, i), None, (), (key[0], key[1])) for i in range(chunks)]


def encode_manifest(manifest: Manifest) -> Record:
    return Record(manifest_key(manifest.replica), orjson.dumps(manifest.to_json()),
                  ((KIND_HEADER, MANIFEST.encode()), (EPOCH_HEADER, str(manifest.epoch).encode())))


def decode_subwindow(data: bytes) -> SubwindowPartial:
    """Raises :class:`PartialError` on anything unusable."""
    try:
        tree = ckpt.decode(data)
    except ckpt.CheckpointError as exc:
        raise PartialError(str(exc)) from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise PartialError("not a sub-window partial of this build's format")
    try:
        return SubwindowPartial.from_state_dict(tree)
    except PartialError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PartialError(f"{type(exc).__name__}: {exc}") from None


def decode_manifest(data: bytes) -> Manifest:
    """Raises :class:`PartialError` on anything unusable."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise PartialError(f"manifest is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise PartialError("manifest is not a JSON object")
    try:
        return Manifest.from_json(parsed)
    except PartialError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise PartialError(f"bad manifest: {type(exc).__name__}: {exc}") from None


# ------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Chunk:
    """One sub-window chunk as read back: which sub-window, which epoch, which piece of how many."""

    replica: str
    key: SubwindowKey
    epoch: int
    index: int
    count: int
    data: bytes


@dataclass(frozen=True)
class Tombstone:
    replica: str
    key: SubwindowKey


def parse_record(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> Chunk | Manifest | Tombstone:
    """What a record of the partials topic is; raises :class:`PartialError`."""
    try:
        parsed = orjson.loads(key) if key else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list) or not parsed or parsed[0] not in (SUBWINDOW, MANIFEST):
        raise PartialError(f"unknown record key {key!r}")
    if parsed[0] == MANIFEST:
        if value is None:
            raise PartialError("manifest tombstone")
        return decode_manifest(value)
    try:
        _, replica, model, stream, index, _chunk = parsed
        sub_key = (str(model), str(stream), int(index))
    except (ValueError, TypeError):
        raise PartialError(f"bad sub-window key {key!r}") from None
    if value is None:
        return Tombstone(str(replica), sub_key)
    found = {name: raw.decode(errors="replace") for name, raw in headers or ()}
    try:
        piece, count = (int(x) for x in found[CHUNK_HEADER].split("/"))
        epoch = int(found[EPOCH_HEADER])
    except (KeyError, ValueError):
        raise PartialError(f"sub-window record without valid {EPOCH_HEADER}/{CHUNK_HEADER} headers") from None
    if not 0 <= piece < count:
        raise PartialError(f"chunk {piece} of {count}")
    return Chunk(str(replica), sub_key, epoch, piece, count, value)


class ChunkAssembler:
    """Joins a sub-window's chunks; keeps at most one incomplete epoch per sub-window (the newest).

    It remembers where each incomplete sub-window's first chunk sits, so a reader's checkpoint
    can stop before it (:meth:`holds`) and read the whole sub-window again after a restart.

    >>> assembler = ChunkAssembler()
    >>> assembler.add(Chunk("r", ("m", "s", 1), 7, 1, 2, b"lo"), ("t", 0, 10))
    >>> assembler.holds()
    {('t', 0): 10}
    >>> assembler.add(Chunk("r", ("m", "s", 1), 7, 0, 2, b"hel"), ("t", 0, 11))
    b'hello'
    >>> assembler.holds()
    {}
    """

    def __init__(self) -> None:
        # (replica, key) -> (epoch, chunk count, chunks so far, (topic, partition, offset) of the first)
        self._parts: dict[tuple[str, SubwindowKey], tuple[int, int, dict[int, bytes], tuple[str, int, int]]] = {}

    def add(self, chunk: Chunk, position: tuple[str, int, int]) -> bytes | None:
        """Add one chunk read at ``position``; the whole sub-window's bytes once the last one is in."""
        slot = (chunk.replica, chunk.key)
        epoch, count, parts, first = self._parts.get(slot, (chunk.epoch, chunk.count, {}, position))
        if chunk.epoch < epoch:
            return None  # an older publication's piece, already superseded
        if chunk.epoch > epoch or chunk.count != count:
            epoch, count, parts, first = chunk.epoch, chunk.count, {}, position
        parts[chunk.index] = chunk.data
        if len(parts) < count:
            self._parts[slot] = (epoch, count, parts, min(first, position))
            return None
        self._parts.pop(slot, None)
        return b"".join(parts[i] for i in range(count))

    def forget(self, replica: str, key: SubwindowKey) -> None:
        self._parts.pop((replica, key), None)

    def forget_before(self, index: int) -> None:
        """Drop incomplete sub-windows older than ``index`` (they left the window)."""
        self._parts = {slot: v for slot, v in self._parts.items() if slot[1][2] >= index}

    def forget_partitions(self, partitions: set[tuple[str, int]]) -> None:
        """Drop incomplete sub-windows read on ``partitions`` (a reducer no longer owns them)."""
        self._parts = {slot: v for slot, v in self._parts.items() if v[3][:2] not in partitions}

    def holds(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the offset of the earliest chunk of an incomplete sub-window."""
        out: dict[tuple[str, int], int] = {}
        for *_, (topic, partition, offset) in self._parts.values():
            out[(topic, partition)] = min(out.get((topic, partition), offset), offset)
        return out
