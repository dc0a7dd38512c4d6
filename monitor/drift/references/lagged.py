"""Lagged references: a bounded on-disk ring of window samples, to compare now with ``lag`` ago.

Files: ``<state_dir>/drift-lagged/<model>/<stream>/<milliseconds>.npz`` (``ReferenceProfile``
archives named by when they were taken); they survive restarts. :func:`list_snapshots` is the one
reader of that layout (the ring at start, ``embedding-monitor baseline show``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from monitor.decoding.records import StreamKey
from monitor.drift.references.profile import ReferenceProfile
from monitor.storage.durable_files import atomic_savez, safe_name, unsafe_name

logger = logging.getLogger(__name__)

LAGGED_DIR = "drift-lagged"
LAGGED_SLOTS = 48  # snapshots per lag: a 24 h lag keeps one every 30 minutes


@dataclass(frozen=True)
class LaggedSnapshot:
    """One stored window sample: when it was taken (unix seconds, millisecond precision) and its file."""

    taken_at: float
    path: Path

    @classmethod
    def at(cls, directory: Path, now: float) -> LaggedSnapshot:
        """The snapshot a stream's ``directory`` gets for a sample taken at ``now``."""
        millis = round(now * 1000)
        return cls(millis / 1000.0, directory / f"{millis:015d}.npz")


def list_snapshots(root: Path) -> tuple[dict[StreamKey, list[LaggedSnapshot]], list[Path]]:
    """The snapshots under ``root`` (``<state_dir>/drift-lagged``) by (model, stream), oldest first,
    and the leftovers of interrupted writes (hidden files) found on the way, for the caller to remove."""
    snapshots: dict[StreamKey, list[LaggedSnapshot]] = {}
    leftovers: list[Path] = []
    if not root.is_dir():
        return snapshots, leftovers
    for stream_dir in sorted(root.glob("*/*")):
        if not stream_dir.is_dir():
            continue
        key = (unsafe_name(stream_dir.parent.name), unsafe_name(stream_dir.name))
        found = []
        for path in stream_dir.iterdir():
            if path.name.startswith("."):
                leftovers.append(path)
            elif path.suffix == ".npz" and path.stem.isdigit():
                found.append(LaggedSnapshot(int(path.stem) / 1000.0, path))
        snapshots[key] = sorted(found, key=lambda s: s.taken_at)
    return snapshots, leftovers


class LaggedRing:
    """A bounded on-disk ring of window-sample snapshots per (model, stream), for a lagged reference.

    A snapshot (a ``ReferenceProfile`` of the window: its sample, its exact centroid and record
    count, ``captured_at`` = the window's end) is taken at a drift cycle when the newest one is at
    least ``spacing = max(interval, lag / LAGGED_SLOTS)`` old. :meth:`pick` returns the snapshot
    closest to ``now - lag``, if one lies within ``tolerance = (spacing + interval) / 2`` of it
    (snapshots are ``spacing`` to ``spacing + interval`` apart, so a ring without gaps always has
    one; none does during the first ``lag`` seconds). Snapshots older than ``now - lag - tolerance`` are
    deleted, and at most ``capacity = ceil(lag / spacing) + 2`` are kept per (model, stream): disk
    use is at most ``capacity × rows × d × 4`` bytes per (model, stream), ``rows`` being the
    snapshots' sample size (the component's ``drift.reference_sample_size``).
    """

    def __init__(self, state_dir: Path, lag_seconds: float, interval_seconds: float):
        self.root = Path(state_dir) / LAGGED_DIR
        self.lag = float(lag_seconds)
        self.spacing = max(float(interval_seconds), self.lag / LAGGED_SLOTS)
        self.tolerance = (self.spacing + float(interval_seconds)) / 2
        self.capacity = math.ceil(self.lag / self.spacing) + 2
        self._cache: dict[StreamKey, tuple[Path, ReferenceProfile]] = {}
        self._index, leftovers = list_snapshots(self.root)
        for path in leftovers:
            path.unlink(missing_ok=True)  # an interrupted write

    def _dir(self, key: StreamKey) -> Path:
        return self.root / safe_name(key[0]) / safe_name(key[1])

    def due(self, key: StreamKey, now: float) -> bool:
        snaps = self._index.get(key)
        return not snaps or now - snaps[-1].taken_at >= self.spacing

    def add(self, key: StreamKey, profile: ReferenceProfile, now: float) -> Path:
        """Store a snapshot taken at ``now`` and prune the ring."""
        new = LaggedSnapshot.at(self._dir(key), now)
        atomic_savez(new.path, profile.to_arrays())
        snaps = [s for s in self._index.get(key, []) if s.path != new.path] + [new]
        snaps.sort(key=lambda s: s.taken_at)
        keep = [s for s in snaps if s.taken_at >= now - self.lag - self.tolerance][-self.capacity :]
        for gone in set(snaps) - set(keep):
            gone.path.unlink(missing_ok=True)
        self._index[key] = keep
        return new.path

    def pick(self, key: StreamKey, now: float) -> ReferenceProfile | None:
        """The snapshot closest to ``now - lag`` within the tolerance, or None."""
        target = now - self.lag
        best = min(self._index.get(key, []), key=lambda s: abs(s.taken_at - target), default=None)
        if best is None or abs(best.taken_at - target) > self.tolerance:
            return None
        cached = self._cache.get(key)
        if cached is not None and cached[0] == best.path:
            return cached[1]
        try:
            profile = ReferenceProfile.from_npz(best.path)
        except (OSError, ValueError, KeyError) as exc:
            logger.error("lagged snapshot %s is unreadable (%s); dropping it", best.path, exc)
            best.path.unlink(missing_ok=True)
            self._index[key] = [s for s in self._index[key] if s != best]
            return None
        self._cache[key] = (best.path, profile)
        return profile
