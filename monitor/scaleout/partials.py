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
``embmon-chunk`` = ``i/n``; with a key configured, ``embmon-mac`` (:mod:`monitor.scaleout.signing`).

Everything read back is checked against the reader's :class:`Bounds` (its window geometry and
``limits``) before anything is allocated: a record of a few bytes cannot claim a reservoir of 2^40
rows, a dimension beyond ``limits.max_dimension``, more chunks than the largest sub-window needs, an
epoch at or above 2^63 or a non-integer index. Whatever goes wrong while decoding one record raises
:class:`PartialError` with a bounded ``reason`` (the label of ``embmon_reducer_partials_ignored_total``).

An epoch is a replica's capture time in nanoseconds, strictly increasing per replica across
restarts (:class:`EpochClock`); a newer epoch of a key replaces an older one, whatever order or
how many times records are read.
"""

from __future__ import annotations

import math
import re
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from monitor.decoding.records import StreamKey
from monitor.scaleout.canary_rows import MAX_ARRIVALS, CanaryRows
from monitor.sources.base import Offsets, Partition
from monitor.state.reservoir import Reservoir
from monitor.state.stats import SufficientStats
from monitor.storage import checkpoint_format as ckpt

KIND_HEADER, EPOCH_HEADER, CHUNK_HEADER = "embmon-kind", "embmon-epoch", "embmon-chunk"
SUBWINDOW, MANIFEST = "subwindow", "manifest"
FORMAT = 1
MIN_RECORD_BYTES = 16_384  # the least scale_out.max_record_bytes
MAX_OFFSETS = 100_000  # (topic, partition) entries in one manifest

SubwindowKey = tuple[str, str, int]  # (model, stream, sub-window index)


MAX_EPOCH = 2**63 - 1  # epochs are int64 nanoseconds; orjson cannot write more
MAX_INDEX = 2**53  # sub-window indices (|index|): a float's exact integers
MAX_NAME_CHARS = 1024  # a replica, model or stream name in a record
MAX_PARTITION = 2**31 - 1
_DIGITS = re.compile(r"^[0-9]{1,20}\Z")  # ASCII only: int() also takes other scripts' digits


class PartialError(ValueError):
    """A record of the partials topic that cannot be used; ``reason`` says why (a bounded label value:
    ``corrupt``, ``oversize``, ``epoch_range``, ``limit``, ``unsigned``, ...)."""

    def __init__(self, message: str, reason: str = "corrupt"):
        super().__init__(message)
        self.reason = reason


def _int(value: Any, what: str, low: int, high: int, reason: str = "corrupt") -> int:
    """An int in [low, high] (an int, not a bool, float or string), else :class:`PartialError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PartialError(f"{what} must be an integer, got {type(value).__name__}")
    number = int(value)
    if not low <= number <= high:
        raise PartialError(f"{what} is {number}, outside [{low}, {high}]", reason)
    return number


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise PartialError(f"{what} must be a non-empty string of at most {MAX_NAME_CHARS} characters")
    return value


def _finite(value: Any, what: str, low: float = -math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PartialError(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < low:
        raise PartialError(f"{what} is {number}, not a finite number >= {low}")
    return number


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
        if 0 <= int(epoch) < MAX_EPOCH:  # readers refuse others; never let one stop every later publication
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
class Bounds:
    """What a record of the partials topic may hold, from the reader's settings (module docstring).

    >>> b = Bounds(WindowGeometry(600.0, 6, 600, 0.05), max_capacity=100, max_dimension=64)
    >>> b.max_chunks, b.max_subwindow_bytes
    (865, 14157376)
    """

    geometry: WindowGeometry
    max_capacity: int  # reservoir rows of one sub-window: ceil(reservoir_size / subwindows), or the drift sample
    max_dimension: int
    dims: Mapping[str, int] = field(default_factory=dict)  # declared model dimensions (models.<m>.dim)
    max_streams: int = 20 * 10  # per manifest: limits.max_models x limits.max_streams_per_model
    max_clock_skew_seconds: float = 300.0

    @classmethod
    def of(cls, settings: Any) -> Bounds:
        w, limits = settings.window, settings.limits
        share = -(-w.reservoir_size // w.subwindows)
        return cls(
            WindowGeometry(w.seconds, w.subwindows, w.reservoir_size, settings.quality.alignment_alpha),
            # a replica's min_sample is its drift.window_sample_size: the reducer's, or the default
            max(share, settings.drift.window_sample_size, type(settings.drift)().window_sample_size),
            limits.max_dimension,
            {name: m.dim for name, m in settings.models.items() if m.dim},
            limits.max_models * limits.max_streams_per_model, settings.scale_out.max_clock_skew_seconds,
        )

    @property
    def max_subwindow_bytes(self) -> int:
        """The largest sub-window partial a replica with this geometry writes: statistics (packed second
        moment and five vectors in float64), the reservoir (rows in float32, ids, at most 1 KiB each),
        the canary arrivals, and 1 MiB for the container."""
        d = self.max_dimension
        stats = (d * (d + 1) // 2 + 5 * d) * 8
        rows = (self.max_capacity + MAX_ARRIVALS) * (4 * d + MAX_NAME_CHARS + 16)
        return stats + rows + (1 << 20)

    @property
    def max_chunks(self) -> int:
        """Chunks of the largest sub-window at the smallest ``scale_out.max_record_bytes`` (16 KiB)."""
        return -(-self.max_subwindow_bytes // MIN_RECORD_BYTES)

    def epoch_refusal(self, epoch: int, now: float) -> str | None:
        """``epoch_range`` for an epoch that is negative, not below 2^63, or further than the skew
        ahead of ``now`` (unix seconds); None when it may be read."""
        if not 0 <= epoch <= MAX_EPOCH or epoch > (now + self.max_clock_skew_seconds) * 1e9:
            return "epoch_range"
        return None

    def check_dim(self, model: str, dim: int) -> None:
        if dim > self.max_dimension:
            raise PartialError(f"dimension {dim} is over limits.max_dimension ({self.max_dimension})", "oversize")
        declared = self.dims.get(model)
        if declared is not None and declared != dim:
            raise PartialError(f"model {model!r} has dimension {declared}, the record {dim}", "dim_mismatch")


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
    def from_state_dict(cls, state: Mapping[str, Any], bounds: Bounds | None = None) -> SubwindowPartial:
        """A checked partial; with ``bounds``, every size is checked against them before anything of
        the size is allocated. Raises :class:`PartialError` (or a ``ValueError``, ``KeyError``,
        ``TypeError`` on a malformed state: :func:`decode_subwindow` turns every one into a refusal)."""
        sub = state["subwindow"]
        model, stream = _name(state["model"], "model"), _name(state["stream"], "stream")
        stats_state, reservoir_state = sub["stats"], sub["reservoir"]
        dim = _int(stats_state["dim"], "stats dim", 1, bounds.max_dimension if bounds else MAX_INDEX, "oversize")
        if bounds is not None:
            bounds.check_dim(model, dim)
            _int(reservoir_state["capacity"], "reservoir capacity", 0, bounds.max_capacity, "oversize")
            if _int(reservoir_state["dim"], "reservoir dim", 1, bounds.max_dimension, "oversize") != dim:
                raise PartialError(f"reservoir of dim {reservoir_state['dim']} with statistics of dim {dim}")
            _int(reservoir_state["seen"], "reservoir seen", 0, MAX_EPOCH)
        stats = SufficientStats.from_state_dict(stats_state)
        reservoir = Reservoir.from_state_dict(reservoir_state)
        if reservoir.dim != stats.dim:
            raise PartialError(f"reservoir of dim {reservoir.dim} with statistics of dim {stats.dim}")
        canaries = None if sub.get("canaries") is None else CanaryRows.from_state_dict(sub["canaries"], stats.dim)
        return cls(_name(state["replica"], "replica"), model, stream,
                   _int(sub["index"], "sub-window index", -MAX_INDEX, MAX_INDEX),
                   _int(state["epoch"], "epoch", 0, MAX_EPOCH, "epoch_range"), stats, reservoir,
                   _finite(sub["alignment_sum"], "alignment_sum"),
                   _int(sub["alignment_pairs"], "alignment_pairs", 0, MAX_EPOCH), canaries)


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
    def from_json(cls, data: Mapping[str, Any], bounds: Bounds | None = None) -> Manifest:
        """A checked manifest (:class:`PartialError`, or a ``KeyError``/``TypeError``/``ValueError`` on
        a malformed one); with ``bounds``, its streams and sizes within them."""
        if data.get("format") != FORMAT:
            raise PartialError(f"manifest format {data.get('format')!r}, this build reads {FORMAT}")
        w = data["window"]
        streams, offsets = data["streams"], data["offsets"]
        if not isinstance(streams, list) or not isinstance(offsets, list):
            raise PartialError("a manifest's streams and offsets are lists")
        if bounds is not None and len(streams) > bounds.max_streams:
            raise PartialError(f"{len(streams)} streams, over limits.max_models x max_streams_per_model "
                               f"({bounds.max_streams})", "limit")
        most = MAX_INDEX if bounds is None else 2 * bounds.geometry.subwindows + 2  # a window, and rolling over
        if bounds is not None and len(offsets) > MAX_OFFSETS:
            raise PartialError(f"{len(offsets)} offsets, at most {MAX_OFFSETS}", "oversize")
        return cls(
            _name(data["replica"], "replica"), _int(data["epoch"], "epoch", 0, MAX_EPOCH, "epoch_range"),
            _name(data["instance"], "instance"),
            WindowGeometry(_finite(w["seconds"], "window seconds"), _int(w["subwindows"], "subwindows", 1, MAX_INDEX),
                           _int(w["reservoir_size"], "reservoir_size", 0, MAX_EPOCH),
                           _finite(w["alignment_alpha"], "alignment_alpha")),
            {(_name(t, "topic"), _int(p, "partition", 0, MAX_PARTITION)): _int(o, "offset", -1, MAX_EPOCH)
             for t, p, o in offsets},
            tuple(_stream_manifest(s, bounds, most) for s in streams),
        )


def _stream_manifest(s: Mapping[str, Any], bounds: Bounds | None, most: int) -> StreamManifest:
    model = _name(s["model"], "model")
    dim = _int(s["dim"], "dim", 1, bounds.max_dimension if bounds else MAX_INDEX, "oversize")
    if bounds is not None:
        bounds.check_dim(model, dim)
    listed = s["subwindows"]
    if not isinstance(listed, list) or len(listed) > most:
        raise PartialError(f"a stream lists {len(listed)} sub-windows, at most {most}", "oversize")
    return StreamManifest(
        model, _name(s["stream"], "stream"), dim,
        tuple((_int(i, "sub-window index", -MAX_INDEX, MAX_INDEX), _int(e, "epoch", 0, MAX_EPOCH, "epoch_range"),
               _int(n, "records", 0, MAX_EPOCH)) for i, e, n in listed),
        _int(s["pending_pairs"], "pending_pairs", 0, MAX_EPOCH),
        _int(s["pending_pairs_evicted"], "pending_pairs_evicted", 0, MAX_EPOCH),
        None if s.get("partition") is None else _int(s["partition"], "partition", 0, MAX_PARTITION),
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
    stream: StreamKey | None = None  # (model, stream) of a partial or tombstone; None: the seal


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


def decode_subwindow(data: bytes, bounds: Bounds | None = None) -> SubwindowPartial:
    """Raises :class:`PartialError` on anything unusable, whatever the bytes."""
    try:
        tree = ckpt.decode(data)
        if not isinstance(tree, dict) or tree.get("format") != FORMAT:
            raise PartialError("not a sub-window partial of this build's format")
        return SubwindowPartial.from_state_dict(tree, bounds)
    except PartialError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to decode one record refuses that record
        raise PartialError(f"{type(exc).__name__}: {exc}"[:500]) from None


def decode_manifest(data: bytes, bounds: Bounds | None = None) -> Manifest:
    """Raises :class:`PartialError` on anything unusable, whatever the bytes."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise PartialError(f"manifest is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise PartialError("manifest is not a JSON object")
    try:
        return Manifest.from_json(parsed, bounds)
    except PartialError:
        raise
    except Exception as exc:  # noqa: BLE001 - as above
        raise PartialError(f"bad manifest: {type(exc).__name__}: {exc}"[:500]) from None


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


def record_replica(key: bytes | None) -> str | None:
    """The replica a record's key names (None when it names none): checked before its value is read,
    and against the value once it is (:func:`parse_record`).

    >>> record_replica(manifest_key("r1")), record_replica(b"junk")
    ('r1', None)
    """
    try:
        parsed = orjson.loads(key) if key else None
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, list) and len(parsed) >= 2 and isinstance(parsed[1], str):
        return parsed[1]
    return None


def parse_record(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], bounds: Bounds | None = None
) -> Chunk | Manifest | Tombstone:
    """What a record of the partials topic is; raises :class:`PartialError` (whatever the bytes)."""
    try:
        return _parse_record(key, value, headers, bounds)
    except PartialError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to decode one record refuses that record
        raise PartialError(f"{type(exc).__name__}: {exc}"[:500]) from None


def _parse_record(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], bounds: Bounds | None
) -> Chunk | Manifest | Tombstone:
    try:
        parsed = orjson.loads(key) if key else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list) or not parsed or parsed[0] not in (SUBWINDOW, MANIFEST):
        raise PartialError(f"unknown record key {bytes(key or b'')[:100]!r}")
    if parsed[0] == MANIFEST:
        if value is None:
            raise PartialError("manifest tombstone")
        if len(parsed) != 2:
            raise PartialError("bad manifest key")
        manifest = decode_manifest(value, bounds)
        if manifest.replica != parsed[1]:
            raise PartialError(f"a manifest of {manifest.replica!r} under the key of {parsed[1]!r}")
        return manifest
    if len(parsed) != 6:
        raise PartialError("bad sub-window key")
    _, replica, model, stream, index, chunk = parsed
    sub_key = (_name(model, "model"), _name(stream, "stream"), _int(index, "sub-window index", -MAX_INDEX, MAX_INDEX))
    replica = _name(replica, "replica")
    if value is None:
        return Tombstone(replica, sub_key)
    found: dict[str, str] = {}
    for name, raw in headers or ():
        if name in (EPOCH_HEADER, CHUNK_HEADER):
            if name in found:
                raise PartialError(f"two {name} headers")
            found[name] = bytes(raw or b"").decode("ascii", errors="replace")
    chunk_header, epoch_header = found.get(CHUNK_HEADER, ""), found.get(EPOCH_HEADER, "")
    pieces = chunk_header.split("/")
    if len(pieces) != 2 or not all(_DIGITS.match(x) for x in (*pieces, epoch_header)):
        raise PartialError(f"sub-window record without valid {EPOCH_HEADER}/{CHUNK_HEADER} headers")
    piece, count = int(pieces[0]), int(pieces[1])
    epoch = _int(int(epoch_header), "epoch", 0, MAX_EPOCH, "epoch_range")
    if not 0 <= piece < count:
        raise PartialError(f"chunk {piece} of {count}")
    if bounds is not None and count > bounds.max_chunks:
        raise PartialError(f"{count} chunks, more than the largest sub-window needs ({bounds.max_chunks})", "oversize")
    if _int(chunk, "chunk", 0, MAX_EPOCH) != piece:
        raise PartialError(f"chunk {piece} under the key of chunk {chunk}")
    return Chunk(replica, sub_key, epoch, piece, count, value)


class ChunkAssembler:
    """Joins a sub-window's chunks; keeps at most one incomplete epoch per sub-window (the newest).

    It remembers where each incomplete sub-window's first chunk sits, so a reader's checkpoint
    can stop before it (:meth:`holds`) and read the whole sub-window again after a restart. What it
    holds is bounded: at most ``max_bytes`` per sub-window (a larger one is dropped,
    :class:`PartialError` ``oversize``) and ``max_incomplete`` incomplete sub-windows per replica (the
    one whose first chunk is oldest goes first); a reader drops those that left the window
    (:meth:`forget_before`), so none pins the checkpointed position for longer than a window.

    >>> assembler = ChunkAssembler()
    >>> assembler.add(Chunk("r", ("m", "s", 1), 7, 1, 2, b"lo"), ("t", 0, 10))
    >>> assembler.holds()
    {('t', 0): 10}
    >>> assembler.add(Chunk("r", ("m", "s", 1), 7, 0, 2, b"hel"), ("t", 0, 11))
    b'hello'
    >>> assembler.holds()
    {}
    """

    def __init__(self, max_bytes: int = 1 << 62, max_incomplete: int = 64) -> None:
        self.max_bytes = max_bytes
        self.max_incomplete = max_incomplete
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
        if sum(len(p) for p in parts.values()) > self.max_bytes:
            self._parts.pop(slot, None)
            raise PartialError(f"a sub-window of more than {self.max_bytes} bytes", "oversize")
        if len(parts) < count:
            self._parts[slot] = (epoch, count, parts, min(first, position))
            self._bound(chunk.replica)
            return None
        self._parts.pop(slot, None)
        return b"".join(parts[i] for i in range(count))

    def _bound(self, replica: str) -> None:
        mine = sorted((v[3], slot) for slot, v in self._parts.items() if slot[0] == replica)
        for _, slot in mine[: max(0, len(mine) - self.max_incomplete)]:
            del self._parts[slot]

    def forget(self, replica: str, key: SubwindowKey) -> None:
        self._parts.pop((replica, key), None)

    def forget_before(self, index: int) -> None:
        """Drop incomplete sub-windows older than ``index`` (they left the window)."""
        self._parts = {slot: v for slot, v in self._parts.items() if slot[1][2] >= index}

    def forget_partitions(self, partitions: set[Partition]) -> None:
        """Drop incomplete sub-windows read on ``partitions`` (a reducer no longer owns them)."""
        self._parts = {slot: v for slot, v in self._parts.items() if v[3][:2] not in partitions}

    def holds(self) -> Offsets:
        """Per (topic, partition), the offset of the earliest chunk of an incomplete sub-window."""
        out: Offsets = {}
        for *_, (topic, partition, offset) in self._parts.values():
            out[(topic, partition)] = min(out.get((topic, partition), offset), offset)
        return out
