"""The reducer's merge table: per replica, the newest complete publication; merged, one window per stream.

Per replica the table keeps what its newest manifest names (**pieces**: one sub-window partial
per (model, stream, index)) and partials received after it (**pending**, by epoch). A manifest
(a publication's seal, written to every partition of the partials topic after its partials) read
on partition p switches the replica's streams whose partials are on p at once: each listed
sub-window of those streams is taken, at the epoch the manifest names, from pending or from the
pieces already held; anything it does not list is dropped. So a replica's contribution to a
stream is always one consistent publication, whatever was re-delivered, compacted away or read
twice, and a replica can never be merged twice. A reducer that reads only some partitions (one of
a group, ``scale_out.reducer_group``) holds only their streams (:meth:`MergeTable.release` drops
a partition that moved to another reducer); every manifest lists every stream of the replica with
its partition, so the table also knows where the streams it does not hold are
(:meth:`MergeTable.stream_partitions`).

The merged window of (model, stream) at ``now`` sums, for every live sub-window index, every
replica's piece: exact statistics add (:meth:`SufficientStats.merge`), alignment sums add, and
the sample is drawn from all reservoir pieces with equal inclusion probability
(:func:`~monitor.state.reservoir.uniform_sample`), at most ``window.reservoir_size`` rows as in one
daemon. Sub-window indices follow the replicas' geometry
(``window.seconds / window.subwindows``, which must match the reducer's) and the reducer's clock.

Replicas whose newest publication is older than ``scale_out.stale_after_seconds`` are reported
stale but stay merged: their pieces are still exact, and leave with the window like any other.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.decoding.records import StreamKey
from monitor.logs import RateLimitedLog
from monitor.scaleout.canary_rows import CanaryRows
from monitor.scaleout.partials import (
    Chunk,
    ChunkAssembler,
    Manifest,
    PartialError,
    StreamManifest,
    SubwindowKey,
    SubwindowPartial,
    Tombstone,
    WindowGeometry,
    decode_subwindow,
    parse_record,
)
from monitor.state.reservoir import uniform_sample
from monitor.state.stats import SufficientStats
from monitor.state.window import WindowSnapshot
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings

logger = logging.getLogger(__name__)

PENDING_EPOCHS = 2  # per sub-window: a publication in flight and the one after it
# The `reason` label of embmon_reducer_partials_ignored_total.
IGNORED_REASONS = ("superseded", "duplicate", "missing", "expired", "clock_skew", "replica_limit",
                   "window_mismatch", "dim_mismatch", "corrupt")
_INDEX_MASK = (1 << 62) - 1


@dataclass
class _ReplicaView:
    replica: str
    sealed: dict[int, Manifest] = field(default_factory=dict)  # partition -> newest manifest applied there
    streams: dict[StreamKey, tuple[int, StreamManifest]] = field(default_factory=dict)  # held: (partition, entry)
    pieces: dict[SubwindowKey, SubwindowPartial] = field(default_factory=dict)
    pending: dict[SubwindowKey, dict[int, SubwindowPartial]] = field(default_factory=dict)

    @property
    def epoch(self) -> int:
        """The newest publication applied on any partition (-1: none)."""
        return max((m.epoch for m in self.sealed.values()), default=-1)

    def epoch_of(self, key: StreamKey) -> int:
        """The publication this stream's pieces come from (-1: none applied)."""
        held = self.streams.get(key)
        found = self.sealed.get(held[0]) if held is not None else None
        return found.epoch if found is not None else -1


@dataclass(frozen=True)
class ReplicaStatus:
    replica: str
    age_seconds: float
    stale: bool
    window_records: int


@dataclass(frozen=True)
class TableStatus:
    replicas: tuple[ReplicaStatus, ...]
    applied: dict[str, int]
    ignored: dict[str, int]


class MergedStream:
    """One (model, stream) of the merged windows, shaped like the registry's stream state
    (``model``, ``stream``, ``lock``, ``window.snapshot(now)``) for components that read those."""

    def __init__(self, table: MergeTable, model: str, stream: str):
        self.model, self.stream = model, stream
        self.lock = threading.Lock()  # the table locks itself; this one only satisfies readers
        self.window = self
        self._table = table

    def snapshot(self, now: float) -> WindowSnapshot:
        snapshot = self._table.snapshot_windows(now, only=(self.model, self.stream)).get((self.model, self.stream))
        if snapshot is None:
            raise ValueError(f"{self.model}/{self.stream} has no merged window")
        return snapshot


class MergeTable:
    """Every replica's newest publication, merged per sub-window on demand."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time):
        w = settings.window
        self.geometry = WindowGeometry(w.seconds, w.subwindows, w.reservoir_size, settings.quality.alignment_alpha)
        self.width = w.seconds / w.subwindows
        self.subwindows = w.subwindows
        self.seed = settings.seed
        # as one daemon's window (state/window.py, sample_limit): the drift tests' sample is full
        self.sample_size = max(w.reservoir_size, settings.drift.window_sample_size if settings.drift.enabled else 0)
        self.max_replicas = settings.scale_out.max_replicas
        self.stale_after = settings.scale_out.stale_after_seconds
        self.clock = clock
        self.applied: Tally[str] = Tally()
        self.ignored: Tally[str] = Tally()
        self.assembler = ChunkAssembler()
        self._replicas: dict[str, _ReplicaView] = {}
        self._dims: dict[StreamKey, int] = {}  # the first dimension a replica published for a stream
        self._partitions: dict[StreamKey, int] = {}  # where each stream's partials are, as manifests say
        self._lock = threading.Lock()
        self._log = RateLimitedLog(logger)

    # ------------------------------------------------------------------ geometry
    def _oldest_live(self, now: float) -> int:
        return math.floor(now / self.width) - self.subwindows + 1

    def _index_ok(self, index: int, now: float) -> str | None:
        """Why a sub-window index cannot be held now (None when it can)."""
        head = math.floor(now / self.width)
        if index < head - self.subwindows + 1:
            return "expired"
        if index > head + self.subwindows:  # far ahead of our clock: a replica's clock is wrong
            return "clock_skew"
        return None

    # ------------------------------------------------------------------ applying records
    def _view(self, replica: str) -> _ReplicaView | None:
        view = self._replicas.get(replica)
        if view is None:
            if len(self._replicas) >= self.max_replicas:
                self.ignored.add("replica_limit")
                self._log.warning("replica_limit", "replica %r is beyond scale_out.max_replicas (%d): not merged",
                                  replica, self.max_replicas)
                return None
            view = self._replicas[replica] = _ReplicaView(replica)
        return view

    def offer_record(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], at: tuple[str, int, int]
    ) -> Manifest | None:
        """One record of the partials topic, read at ``at`` = (topic, partition, offset).

        Returns the manifest when it was one; raises :class:`~monitor.scaleout.partials.PartialError`
        (and counts it) when the record cannot be used.
        """
        try:
            parsed = parse_record(key, value, headers)
            if isinstance(parsed, Tombstone):
                self.assembler.forget(parsed.replica, parsed.key)
            elif isinstance(parsed, Chunk):
                data = self.assembler.add(parsed, at)
                if data is not None:
                    self.offer_subwindow(decode_subwindow(data))
            else:
                self.offer_manifest(parsed, at[1])
                return parsed
        except PartialError:
            self.ignored.add("corrupt")
            raise
        return None

    def offer_subwindow(self, partial: SubwindowPartial) -> None:
        """A sub-window partial arrived: hold it until the manifest that names it."""
        with self._lock:
            view = self._view(partial.replica)
            if view is None:
                return
            why = self._index_ok(partial.index, self.clock())
            if why is not None:
                self.ignored.add(why)
                return
            if partial.epoch <= view.epoch_of(partial.key[:2]):
                held = view.pieces.get(partial.key)
                self.ignored.add("duplicate" if held is not None and held.epoch == partial.epoch else "superseded")
                return
            by_epoch = view.pending.setdefault(partial.key, {})
            if partial.epoch in by_epoch:
                self.ignored.add("duplicate")
                return
            by_epoch[partial.epoch] = partial
            for old in sorted(by_epoch)[:-PENDING_EPOCHS]:
                del by_epoch[old]
                self.ignored.add("superseded")
            self.applied.add("subwindow")

    def offer_manifest(self, manifest: Manifest, partition: int = 0) -> None:
        """A manifest read on ``partition``: the replica's streams there become exactly what it names."""
        with self._lock:
            for s in manifest.streams:
                self._partitions[(s.model, s.stream)] = s.on(partition)
            view = self._view(manifest.replica)
            if view is None:
                return
            before = view.sealed.get(partition)
            if before is not None and manifest.epoch <= before.epoch:
                self.ignored.add("duplicate" if manifest.epoch == before.epoch else "superseded")
                return
            if manifest.geometry != self.geometry:
                self.ignored.add("window_mismatch")
                self._log.warning("window_mismatch", "replica %r uses window %s, the reducer %s: not merged",
                                  manifest.replica, manifest.geometry, self.geometry)
                return
            oldest = self._oldest_live(self.clock())
            here = {(s.model, s.stream): s for s in manifest.streams if s.on(partition) == partition}
            refused = set()
            for stream_key, s in here.items():
                if self._dims.setdefault(stream_key, s.dim) != s.dim:
                    refused.add(stream_key)
                    self.ignored.add("dim_mismatch")
                    self._log.warning("dim_mismatch", "%s/%s: replica %r publishes dimension %d, others %d",
                                      s.model, s.stream, manifest.replica, s.dim, self._dims[stream_key])
            # the streams this partition's seal decides: those it lists here, and those held from here before
            decided = set(here) | {key for key, (p, _) in view.streams.items() if p == partition}
            pieces = {k: p for k, p in view.pieces.items() if k[:2] not in decided}
            for key, epoch in manifest.entries().items():
                if key[:2] not in here or key[2] < oldest or key[:2] in refused:
                    continue  # another partition's stream, left the window meanwhile, or not mergeable
                found = view.pending.get(key, {}).get(epoch)
                held = view.pieces.get(key)
                if found is None and held is not None and held.epoch == epoch:
                    found = held
                if found is None:
                    self.ignored.add("missing")
                    continue
                pieces[key] = found
            view.pieces = pieces
            view.pending = {
                key: newer for key, by_epoch in view.pending.items()
                if (newer := {e: p for e, p in by_epoch.items() if key[:2] not in decided or e > manifest.epoch})
            }
            view.streams = {k: v for k, v in view.streams.items() if k not in decided}
            view.streams.update({k: (partition, s) for k, s in here.items()})
            view.sealed[partition] = manifest
            self.applied.add("manifest")

    def release(self, partitions: set[int]) -> None:
        """Forget the streams whose partials are on ``partitions`` (another reducer owns them now)."""
        with self._lock:
            gone = {key for key, p in self._partitions.items() if p in partitions}
            for view in self._replicas.values():
                gone |= {key for key, (p, _) in view.streams.items() if p in partitions}
            for view in self._replicas.values():
                view.pieces = {k: p for k, p in view.pieces.items() if k[:2] not in gone}
                view.pending = {k: d for k, d in view.pending.items() if k[:2] not in gone}
                view.streams = {k: v for k, v in view.streams.items() if k not in gone}
                view.sealed = {p: m for p, m in view.sealed.items() if p not in partitions}
            self._replicas = {r: v for r, v in self._replicas.items() if v.sealed or v.pending}
            for key in gone:
                self._dims.pop(key, None)

    def stream_partitions(self) -> dict[StreamKey, int]:
        """Every (model, stream) a manifest read here listed, with the partition of its partials."""
        with self._lock:
            return dict(self._partitions)

    def forget_expired(self) -> None:
        """Drop what left the window (memory stays bounded by replicas x streams x sub-windows)."""
        with self._lock:
            oldest = self._oldest_live(self.clock())
            for view in self._replicas.values():
                view.pieces = {k: p for k, p in view.pieces.items() if k[2] >= oldest}
                view.pending = {k: d for k, d in view.pending.items() if k[2] >= oldest}
            self.assembler.forget_before(oldest)

    # ------------------------------------------------------------------ reading
    def snapshot_windows(self, now: float, only: StreamKey | None = None) -> dict[StreamKey, WindowSnapshot]:
        """The merged window of every (model, stream) (or of ``only``) at ``now``."""
        head = math.floor(now / self.width)
        oldest = head - self.subwindows + 1
        gathered: dict[StreamKey, list[SubwindowPartial]] = {}
        pending_pairs: dict[StreamKey, list[int]] = {}
        with self._lock:
            for view in self._replicas.values():
                for (model, stream, index), piece in view.pieces.items():
                    if oldest <= index <= head + 1 and (only is None or (model, stream) == only):
                        gathered.setdefault((model, stream), []).append(piece)
                for _partition, s in view.streams.values():
                    totals = pending_pairs.setdefault((s.model, s.stream), [0, 0])
                    totals[0] += s.pending_pairs
                    totals[1] += s.pending_pairs_evicted
            # merged statistics are fresh objects; reservoir pieces are never written after decoding
            merged = {key: self._merge(key, pieces) for key, pieces in gathered.items()}
        out: dict[StreamKey, WindowSnapshot] = {}
        for key, (stats, pieces) in merged.items():
            if stats is None:
                continue
            rng = np.random.default_rng([self.seed, 2, stats.count, head & _INDEX_MASK])
            sample, ids = uniform_sample([p.reservoir for p in pieces], stats.dim, rng)
            # every replica holds a full reservoir share: keep the single daemon's sample size (the
            # sample is in random order, so its prefix is a uniform sample too)
            sample, ids = sample[: self.sample_size], ids[: self.sample_size]
            pairs = pending_pairs.get(key, [0, 0])
            out[key] = WindowSnapshot(
                stats=stats, sample=sample, sample_ids=ids,
                alignment_sum=float(sum(p.alignment_sum for p in pieces)),
                alignment_pairs=int(sum(p.alignment_pairs for p in pieces)),
                start=oldest * self.width, end=max(float(now), head * self.width), records=stats.count,
                dim=stats.dim, alignment_alpha=self.geometry.alignment_alpha,
                live_subwindows=len({p.index for p in pieces}), pending_pairs=pairs[0], pending_pairs_evicted=pairs[1],
            )
        return out

    def _merge(
        self, key: StreamKey, pieces: list[SubwindowPartial]
    ) -> tuple[SufficientStats | None, list[SubwindowPartial]]:
        """Fresh merged statistics (in a fixed order: by index, then replica) and the pieces merged."""
        dim = self._dims.get(key, pieces[0].stats.dim)
        kept = sorted((p for p in pieces if p.stats.dim == dim), key=lambda p: (p.index, p.replica))
        stats = SufficientStats(dim)
        for piece in kept:
            stats.merge(piece.stats)
        return (stats if stats.count else None), kept

    def status(self, now: float) -> TableStatus:
        oldest = self._oldest_live(now)
        replicas = []
        with self._lock:
            for view in sorted(self._replicas.values(), key=lambda v: v.replica):
                # the capture time of its newest applied publication (+Inf until one is applied)
                age = max(0.0, now - view.epoch / 1e9) if view.sealed else math.inf
                records = sum(p.stats.count for k, p in view.pieces.items() if k[2] >= oldest)
                replicas.append(ReplicaStatus(view.replica, age, age > self.stale_after, records))
        return TableStatus(tuple(replicas), self.applied.snapshot(), self.ignored.snapshot())

    def canary_arrivals(self) -> list[tuple[str, str, str, CanaryRows]]:
        """(replica, model, stream, rows) of every canary arrival the replicas' current publications
        hold (monitor/scaleout/canaries.py compares them with the pins)."""
        with self._lock:
            return [(view.replica, model, stream, piece.canaries)
                    for view in self._replicas.values()
                    for (model, stream, _), piece in sorted(view.pieces.items())
                    if piece.canaries is not None and len(piece.canaries)]

    def complete_before(self, now: float) -> int:
        """The first sub-window index that may still be incomplete at ``now``: the reducer's head,
        or, if earlier, the sub-window a live replica's newest publication was captured in (a stale
        replica does not hold the others back). Below it, every piece of a sub-window is in."""
        complete = math.floor(now / self.width)
        with self._lock:
            for view in self._replicas.values():
                if view.sealed and now - view.epoch / 1e9 <= self.stale_after:
                    # the oldest publication this table holds of it (its partitions' seals may differ)
                    held = min((m.epoch for p, m in view.sealed.items() if p >= 0), default=view.epoch)
                    complete = min(complete, math.floor(held / 1e9 / self.width))
        return complete

    def subwindow_sums(
        self, model: str, stream: str, first: int, before: int
    ) -> list[tuple[int, int, np.ndarray, float]]:
        """(index, records, Σ x/‖x‖, Σ ‖x‖) of each sub-window of (model, stream) from ``first`` (or the
        oldest live one) up to ``before``, summed over the replicas' pieces (0 records where none)."""
        out = []
        with self._lock:
            dim = self._dims.get((model, stream))
            if dim is None:
                return []
            for index in range(max(first, self._oldest_live(self.clock())), before):
                count, units, norms = 0, np.zeros(dim), 0.0
                for view in sorted(self._replicas.values(), key=lambda v: v.replica):
                    piece = view.pieces.get((model, stream, index))
                    if piece is not None and piece.stats.dim == dim:
                        count += piece.stats.count
                        units = units + piece.stats.unit_sum
                        norms += piece.stats.norm_sum
                out.append((index, count, units, norms))
        return out

    def streams(self) -> list[StreamKey]:
        with self._lock:
            return sorted({(k[0], k[1]) for v in self._replicas.values() for k in v.pieces})

    def __iter__(self) -> Iterator[MergedStream]:
        return iter([MergedStream(self, model, stream) for model, stream in self.streams()])

    def __len__(self) -> int:
        return len(self.streams())

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Every replica's manifests (by partition read on), pieces and pending partials (the registry's
        checkpoint shape: ``streams`` holds the replicas, ``labels`` is unused)."""
        with self._lock:
            replicas = [
                {
                    "replica": view.replica,
                    "sealed": [[p, m.to_json()] for p, m in sorted(view.sealed.items())],
                    "pieces": [p.state_dict() for p in view.pieces.values()],
                    "pending": [p.state_dict() for d in view.pending.values() for p in d.values()],
                }
                for view in self._replicas.values()
            ]
        return {"streams": replicas, "labels": {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Install a checkpoint's table (raises ``ValueError`` and changes nothing if it does not fit).

        A checkpoint written before manifests were sealed per partition holds one ``manifest`` per
        replica, read on the replica's one partition: it stands for every stream it lists."""
        views: dict[str, _ReplicaView] = {}
        partitions: dict[StreamKey, int] = {}
        for entry in state["streams"]:
            sealed = [(int(p), Manifest.from_json(m)) for p, m in entry.get("sealed", ())]
            if entry.get("manifest") is not None:
                sealed.append((-1, Manifest.from_json(entry["manifest"])))
            view = _ReplicaView(str(entry["replica"]))
            for partition, manifest in sealed:
                if manifest.geometry != self.geometry:
                    raise ValueError(f"the checkpoint's window {manifest.geometry} is not the configured "
                                     f"{self.geometry}")
                view.sealed[partition] = manifest
                for s in manifest.streams:
                    partitions[(s.model, s.stream)] = s.on(partition)
                    if s.on(partition) == partition:
                        view.streams[(s.model, s.stream)] = (partition, s)
            for raw in entry["pieces"]:
                piece = SubwindowPartial.from_state_dict(raw)
                view.pieces[piece.key] = piece
            for raw in entry["pending"]:
                piece = SubwindowPartial.from_state_dict(raw)
                view.pending.setdefault(piece.key, {})[piece.epoch] = piece
            views[view.replica] = view
        dims = {key: s.dim for v in views.values() for key, (_, s) in v.streams.items()}
        with self._lock:
            self._replicas = views
            self._dims = dims
            self._partitions = partitions
