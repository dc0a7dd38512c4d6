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
from monitor.scaleout import signing
from monitor.scaleout.canary_rows import CanaryRows
from monitor.scaleout.partials import (
    Bounds,
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
    record_replica,
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
                   "window_mismatch", "dim_mismatch", "corrupt", "unsigned", "bad_signature", "unknown_replica",
                   "epoch_range", "oversize", "limit")
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
        self.bounds = Bounds.of(settings)
        self.keys = settings.scale_out.partials_keys()  # none: records are not authenticated
        self.trusted = frozenset(settings.scale_out.replicas)  # empty: any replica id
        self.max_models, self.max_streams_per_model = settings.limits.max_models, settings.limits.max_streams_per_model
        self.assembler = ChunkAssembler(self.bounds.max_subwindow_bytes)
        self._replicas: dict[str, _ReplicaView] = {}
        self._dims: dict[StreamKey, int] = {}  # the first dimension a replica published for a stream
        # where each stream's partials are, as the manifests held say (rebuilt from them: refused ones add nothing)
        self._partitions: dict[StreamKey, int] = {}
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
    # Every check runs before any state is created: a refused record adds no replica view, no
    # dimension, no partition entry and no pending piece.
    def _has_room(self, replica: str) -> bool:
        if replica in self._replicas or len(self._replicas) < self.max_replicas:
            return True
        self.ignored.add("replica_limit")
        self._log.warning("replica_limit", "replica %r is beyond scale_out.max_replicas (%d): not merged",
                          replica, self.max_replicas)
        return False

    def _view(self, replica: str) -> _ReplicaView:
        view = self._replicas.get(replica)
        if view is None:
            view = self._replicas[replica] = _ReplicaView(replica)
        return view

    def _check_source(self, replica: str, epoch: int | None) -> None:
        """Raises :class:`PartialError` for a replica outside ``scale_out.replicas`` or an epoch out of range."""
        if self.trusted and replica not in self.trusted:
            raise PartialError(f"replica {replica!r} is not in scale_out.replicas", "unknown_replica")
        if epoch is not None and (why := self.bounds.epoch_refusal(epoch, self.clock())) is not None:
            raise PartialError(f"epoch {epoch} of replica {replica!r} is beyond the reducer's clock "
                               f"+ scale_out.max_clock_skew_seconds", why)

    def _within_limits(self, streams: set[StreamKey]) -> bool:
        """Whether holding ``streams`` too keeps the table within ``limits.max_models`` and
        ``limits.max_streams_per_model`` (counted, ``limit``, when not)."""
        held = {k for v in self._replicas.values() for k in (*v.streams, *(k[:2] for k in v.pending))}
        new = streams - held
        if not new:
            return True
        every = held | new
        models = {m for m, _ in every}
        per_model: dict[str, int] = {}
        for model, _ in every:
            per_model[model] = per_model.get(model, 0) + 1
        if len(models) <= self.max_models and all(per_model[m] <= self.max_streams_per_model for m, _ in new):
            return True
        self.ignored.add("limit")
        self._log.warning("limit", "streams %s would exceed limits.max_models (%d) or max_streams_per_model (%d): "
                          "not merged", sorted(new)[:5], self.max_models, self.max_streams_per_model)
        return False

    def offer_record(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], at: tuple[str, int, int]
    ) -> Manifest | None:
        """One record of the partials topic, read at ``at`` = (topic, partition, offset).

        Returns the manifest when it was one and was applied; raises
        :class:`~monitor.scaleout.partials.PartialError` (counted by its ``reason``) when the record
        cannot be used, whatever went wrong while decoding it: the caller moves past it.
        """
        try:
            return self._offer_record(key, value, headers, at)
        except PartialError as exc:
            self.ignored.add(exc.reason if exc.reason in IGNORED_REASONS else "corrupt")
            raise
        except Exception as exc:  # noqa: BLE001 - one record never halts a partition
            self.ignored.add("corrupt")
            raise PartialError(f"{type(exc).__name__}: {exc}"[:500]) from None

    def _offer_record(
        self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]], at: tuple[str, int, int]
    ) -> Manifest | None:
        why = signing.refusal(self.keys, key, value, headers)
        if why is not None:
            raise PartialError("a record without a valid signature (scale_out.partials_key_file)", why)
        named = record_replica(key)
        if self.trusted and named is not None:
            self._check_source(named, None)  # before its value is read: the value must name the same replica
        parsed = parse_record(key, value, headers, self.bounds)
        if isinstance(parsed, Tombstone):
            self._check_source(parsed.replica, None)
            self.assembler.forget(parsed.replica, parsed.key)
        elif isinstance(parsed, Chunk):
            self._check_source(parsed.replica, parsed.epoch)
            why = self._index_ok(parsed.key[2], self.clock())
            if why is not None:  # checked before it is held: a far-future chunk never pins a position
                self.ignored.add(why)
                return None
            with self._lock:
                if not self._has_room(parsed.replica):
                    return None
            data = self.assembler.add(parsed, at)
            if data is not None:
                partial = decode_subwindow(data, self.bounds)
                if (partial.replica, partial.key, partial.epoch) != (parsed.replica, parsed.key, parsed.epoch):
                    raise PartialError(f"a partial of {partial.replica!r} {partial.key} epoch {partial.epoch} under "
                                       f"the key of {parsed.replica!r} {parsed.key} epoch {parsed.epoch}")
                self.offer_subwindow(partial)
        else:
            self._check_source(parsed.replica, parsed.epoch)
            if self.offer_manifest(parsed, at[1]):
                return parsed
        return None

    def offer_subwindow(self, partial: SubwindowPartial) -> None:
        """A sub-window partial arrived: hold it until the manifest that names it."""
        with self._lock:
            why = self._index_ok(partial.index, self.clock())
            if why is not None:
                self.ignored.add(why)
                return
            view = self._replicas.get(partial.replica)
            if view is not None and partial.epoch <= view.epoch_of(partial.key[:2]):
                held = view.pieces.get(partial.key)
                self.ignored.add("duplicate" if held is not None and held.epoch == partial.epoch else "superseded")
                return
            if view is not None and partial.epoch in view.pending.get(partial.key, {}):
                self.ignored.add("duplicate")
                return
            if not self._has_room(partial.replica) or not self._within_limits({partial.key[:2]}):
                return
            view = self._view(partial.replica)
            by_epoch = view.pending.setdefault(partial.key, {})
            by_epoch[partial.epoch] = partial
            for old in sorted(by_epoch)[:-PENDING_EPOCHS]:
                del by_epoch[old]
                self.ignored.add("superseded")
            self.applied.add("subwindow")

    def offer_manifest(self, manifest: Manifest, partition: int = 0) -> bool:
        """A manifest read on ``partition``: the replica's streams there become exactly what it names.
        True when it was applied."""
        with self._lock:
            existing = self._replicas.get(manifest.replica)
            before = existing.sealed.get(partition) if existing is not None else None
            if before is not None and manifest.epoch <= before.epoch:
                self.ignored.add("duplicate" if manifest.epoch == before.epoch else "superseded")
                return False
            if manifest.geometry != self.geometry:
                self.ignored.add("window_mismatch")
                self._log.warning("window_mismatch", "replica %r uses window %s, the reducer %s: not merged",
                                  manifest.replica, manifest.geometry, self.geometry)
                return False
            if not self._has_room(manifest.replica):
                return False
            if not self._within_limits({(s.model, s.stream) for s in manifest.streams}):
                return False
            oldest = self._oldest_live(self.clock())
            here = {(s.model, s.stream): s for s in manifest.streams if s.on(partition) == partition}
            refused = set()
            for stream_key, s in here.items():
                known = self._dims.get(stream_key, self.bounds.dims.get(s.model))
                if known is not None and known != s.dim:
                    refused.add(stream_key)
                    self.ignored.add("dim_mismatch")
                    self._log.warning("dim_mismatch", "%s/%s: replica %r publishes dimension %d, others %d",
                                      s.model, s.stream, manifest.replica, s.dim, known)
            view = self._view(manifest.replica)
            for stream_key, s in here.items():
                if stream_key not in refused:
                    self._dims.setdefault(stream_key, s.dim)
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
            self._rebuild_locked()
            self.applied.add("manifest")
            return True

    def _rebuild_locked(self) -> None:
        """Where each stream's partials are, from the manifests held (newest last); the dimensions of
        streams no replica holds any more are forgotten."""
        partitions: dict[StreamKey, int] = {}
        sealed = sorted(((m.epoch, p, m) for v in self._replicas.values() for p, m in v.sealed.items()),
                        key=lambda x: x[:2])
        for _epoch, partition, manifest in sealed:
            for s in manifest.streams:
                partitions[(s.model, s.stream)] = s.on(partition)
        self._partitions = partitions
        held = {k for v in self._replicas.values() for k in v.streams}
        self._dims = {k: d for k, d in self._dims.items() if k in held}

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
            self._rebuild_locked()

    def dim_of(self, key: StreamKey) -> int | None:
        """The dimension the table merges (model, stream) at (None: not held here)."""
        with self._lock:
            return self._dims.get(key)

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
            # a replica that only ever sent partials that left the window holds no slot
            self._replicas = {r: v for r, v in self._replicas.items() if v.sealed or v.pending or v.pieces}
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
            for index, dim, pieces in self._subwindow_pieces(model, stream, first, before):
                count, units, norms = 0, np.zeros(dim), 0.0
                for piece in pieces:
                    if piece.stats.dim == dim:
                        count += piece.stats.count
                        units = units + piece.stats.unit_sum
                        norms += piece.stats.norm_sum
                out.append((index, count, units, norms))
        return out

    def subwindow_rows(self, model: str, stream: str, first: int, before: int) -> list[tuple[int, np.ndarray]]:
        """(index, rows) of each sub-window of (model, stream) from ``first`` (or the oldest live one) up
        to ``before``: the replicas' sub-window samples (uniform, chosen without looking at the
        values) one after the other, by replica name; (0, d) where none."""
        out = []
        with self._lock:
            for index, dim, pieces in self._subwindow_pieces(model, stream, first, before):
                rows = [p.reservoir.vectors for p in pieces if p.reservoir.dim == dim]
                out.append((index, np.concatenate(rows) if rows else np.zeros((0, dim), dtype=np.float32)))
        return out

    def _subwindow_pieces(self, model: str, stream: str, first: int, before: int) -> list[tuple[int, int, list[Any]]]:
        """(index, dim, the replicas' pieces by replica name) of each live sub-window from ``first`` up to
        ``before``; none when the stream's dimension is unknown. The caller holds the lock while it reads them."""
        dim = self._dims.get((model, stream))
        if dim is None:
            return []
        views = sorted(self._replicas.values(), key=lambda v: v.replica)
        return [(index, dim, [p for v in views if (p := v.pieces.get((model, stream, index))) is not None])
                for index in range(max(first, self._oldest_live(self.clock())), before)]

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
