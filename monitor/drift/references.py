"""Reference baselines in the daemon: where each (model, stream)'s reference comes from, and where it lives.

Sources, most specific first (docs/drift.md, "In the daemon"):

1. a **pinned file** (``.npz`` written by :meth:`ReferenceProfile.to_npz`, or an ``.npy`` (n, d)
   matrix): ``drift.reference.pinned`` maps ``MODEL/STREAM`` or ``MODEL`` to a file
   (``--reference MODEL[/STREAM]=FILE``); ``drift.reference.path`` (``--reference FILE``) applies
   to every (model, stream) whose dimension matches the file's;
2. an **explicit capture** stored in the state directory: the current window pinned with
   ``POST /admin/baseline`` (``embedding-monitor baseline capture --url ...``), or a file prepared
   offline with ``baseline capture --from vectors.npy --state-dir DIR``;
3. a **lagged window** (``drift.reference.lagged_seconds``): the window sample of that long ago,
   from an on-disk ring of snapshots (:class:`LaggedRing`);
4. the **first N records** after start (``drift.reference.records``, ``--reference-records N``).

The active reference of each (model, stream) (whatever its origin, lagged ones excepted) is stored
as ``<state_dir>/references/<model>/<stream>.npz``: a ``ReferenceProfile`` archive (readable by
``ReferenceProfile.from_npz``, so it can be pinned elsewhere) plus one ``embmon_meta`` member
(JSON: origin, pinned-file hash). Every write is atomic (temporary file, fsync, rename, directory
fsync). At start the stored references are reloaded; a pinned file replaces the stored
reference only when its content differs from the file last applied to that (model, stream), so
a capture made while a file is pinned survives restarts until the operator pins a new file.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from monitor.drift.settings import DriftSettings, ReferenceSettings

from monitor.files import atomic_savez, fsync_directory

if TYPE_CHECKING:
    from monitor.drift.suite import ReferenceProfile

logger = logging.getLogger(__name__)

REFERENCES_DIR = "references"
LAGGED_DIR = "drift-lagged"
META_KEY = "embmon_meta"
LAGGED_SLOTS = 48  # snapshots per lag: a 24 h lag keeps one every 30 minutes
Origin = Literal["pinned", "first_records", "captured", "file"]
ORIGINS: tuple[str, ...] = ("pinned", "first_records", "captured", "file")
_TARGET_RE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,129}$")  # MODEL or MODEL/STREAM (label characters)
_SUFFIXES = (".npz", ".npy")
StreamKey = tuple[str, str]


# ---------------------------------------------------------------------------------- settings
def _check_reference_file(path: Path, what: str) -> Path:
    if Path(path).suffix not in _SUFFIXES:
        raise ValueError(f"{what}: {str(path)!r} must be an .npz reference or an .npy (n, d) matrix")
    if not Path(path).is_file():
        raise ValueError(f"{what}: file {str(path)!r} does not exist")
    return path


class DaemonReferenceSettings(ReferenceSettings):
    """``drift.reference`` in the daemon: the library's settings plus per-(model, stream) pins.

    ``path`` applies to every (model, stream) whose dimension matches the file; ``pinned`` maps
    ``MODEL`` (all its streams) or ``MODEL/STREAM`` to a file and wins over ``path``. Streams no
    pin applies to use ``lagged_seconds`` when set, else the first ``records`` records.
    """

    pinned: dict[str, Path] = Field(
        default_factory=dict, description="MODEL or MODEL/STREAM -> .npz/.npy reference file"
    )

    @field_validator("pinned")
    @classmethod
    def _check_pinned(cls, value: dict[str, Path]) -> dict[str, Path]:
        for target, path in value.items():
            if not _TARGET_RE.match(target) or target.startswith("/") or target.endswith("/"):
                raise ValueError(f"{target!r} is not MODEL or MODEL/STREAM")
            _check_reference_file(path, f"pinned[{target}]")
        return value

    @model_validator(mode="after")
    def _check_path(self) -> DaemonReferenceSettings:
        if self.path is not None:
            _check_reference_file(self.path, "path")
        return self

    @property
    def fallback_mode(self) -> Literal["lagged", "first_records"]:
        """What a (model, stream) that no pinned file applies to uses."""
        return "lagged" if self.lagged_seconds is not None else "first_records"


class DaemonDriftSettings(DriftSettings):
    """``drift:`` in the daemon's settings (the library's :class:`DriftSettings`, daemon references)."""

    reference: DaemonReferenceSettings = Field(default_factory=DaemonReferenceSettings)

    @model_validator(mode="before")
    @classmethod
    def _from_library_settings(cls, value: Any) -> Any:
        """Accept the library's own ``DriftSettings`` (e.g. ``Settings(drift=DriftSettings(...))``)."""
        if isinstance(value, DriftSettings) and not isinstance(value, cls):
            return value.model_dump()
        return value


def parse_reference_flag(text: str) -> tuple[str | None, str]:
    """``--reference`` → (target, file): ``FILE`` or ``*=FILE`` is for every stream, else ``MODEL[/STREAM]=FILE``.

    Model and stream names cannot contain ``=``, so the first ``=`` separates the target.

    >>> parse_reference_flag("ref.npz")
    (None, 'ref.npz')
    >>> parse_reference_flag("minilm/queries=/refs/q.npy")
    ('minilm/queries', '/refs/q.npy')
    """
    target, sep, path = text.partition("=")
    if not sep:
        return None, text
    if not path:
        raise ValueError(f"--reference {text!r}: the file is missing after '='")
    return (None if target == "*" else target), path


def reference_overrides(flags: list[str] | None, records: int | None) -> dict[str, Any]:
    """The ``drift.reference`` overrides for ``--reference`` (repeatable) and ``--reference-records``."""
    out: dict[str, Any] = {}
    pinned: dict[str, str] = {}
    for text in flags or []:
        target, path = parse_reference_flag(text)
        if target is None:
            if "path" in out:
                raise ValueError(
                    "--reference FILE (for every stream) was given twice; target the others with MODEL[/STREAM]=FILE"
                )
            out["path"] = path
        else:
            pinned[target] = path
    if pinned:
        out["pinned"] = pinned
    if records is not None:
        out["records"] = records
    return out


# ---------------------------------------------------------------------------------- files
def _profile_cls() -> type[ReferenceProfile]:
    from monitor.drift.suite import ReferenceProfile  # heavy (torch, sklearn): only when needed

    return ReferenceProfile


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def safe_name(label: str) -> str:
    """A label value as one path component: anything but ASCII letters, digits, ``_`` and ``-`` is %XX.

    >>> safe_name("sentence-transformers/all-MiniLM.v2"), safe_name("..")
    ('sentence-transformers%2Fall-MiniLM%2Ev2', '%2E%2E')
    """
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else f"%{ord(c):02X}" for c in label)


def unsafe_name(name: str) -> str:
    """Inverse of :func:`safe_name`."""
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), name)


def check_matrix(matrix: np.ndarray, what: str) -> np.ndarray:
    """A float32 (n >= 2, d >= 2) matrix of finite, non-zero rows, or ValueError naming the problem."""
    x = np.asarray(matrix)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        raise ValueError(f"{what}: expected an (n >= 2, d >= 2) matrix, got shape {x.shape}")
    if x.dtype.kind not in "fiu":
        raise ValueError(f"{what}: expected numbers, got dtype {x.dtype}")
    x = np.asarray(x, dtype=np.float32)
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise ValueError(f"{what}: {int(bad.sum())} rows contain NaN or infinity")
    zero = ~np.any(x != 0, axis=1)
    if zero.any():
        raise ValueError(f"{what}: {int(zero.sum())} rows are all zeros (no direction)")
    return x


def profile_from_matrix(
    matrix: np.ndarray, *, max_rows: int, captured_at: float, source: str, rng: np.random.Generator
) -> ReferenceProfile:
    """A reference from every row of ``matrix``: exact centroid and count, a uniform sample of ``max_rows``."""
    from monitor.drift.suite import uniform_subsample

    x = check_matrix(matrix, source)
    centroid = x.mean(axis=0, dtype=np.float64)
    sample = uniform_subsample(x, max_rows, rng)
    return _profile_cls()(sample=sample, centroid=centroid, count=len(x), captured_at=captured_at, source=source)


def load_reference_file(path: Path, *, max_rows: int, rng: np.random.Generator) -> ReferenceProfile:
    """A pinned reference: an ``.npz`` ReferenceProfile as is, or an ``.npy`` matrix (sampled to ``max_rows``)."""
    path = Path(path)
    if path.suffix == ".npz":
        try:
            profile = _profile_cls().from_npz(path)
        except KeyError as exc:
            raise ValueError(f"{path}: not a reference archive (missing {exc}); write one with "
                             "`embedding-monitor baseline capture --from vectors.npy --out FILE`") from None
        check_matrix(profile.sample, str(path))
        if len(profile.sample) > max_rows:
            from monitor.drift.suite import uniform_subsample

            profile = _profile_cls()(
                sample=uniform_subsample(profile.sample, max_rows, rng), centroid=profile.centroid,
                count=profile.count, captured_at=profile.captured_at, source=profile.source,
            )
        return profile
    if path.suffix == ".npy":
        matrix = np.load(path, mmap_mode="r", allow_pickle=False)
        return profile_from_matrix(
            matrix, max_rows=max_rows, captured_at=path.stat().st_mtime, source=f"pinned {path}", rng=rng
        )
    raise ValueError(f"{path}: a reference must be an .npz or .npy file")


@dataclass(frozen=True)
class PinnedFile:
    """A configured reference file; ``target`` None: every (model, stream) of its dimension."""

    target: str | None
    path: Path
    profile: ReferenceProfile
    sha256: str

    def matches(self, model: str, stream: str) -> int:
        """How specifically this pin names (model, stream): 2 MODEL/STREAM, 1 MODEL, 0 every stream, -1 not."""
        if self.target is None:
            return 0
        if self.target == f"{model}/{stream}":
            return 2
        return 1 if self.target == model else -1


class PinnedFiles:
    """Every configured pinned file, loaded once at start (an unreadable file is a configuration error)."""

    def __init__(self, settings: DaemonReferenceSettings, *, max_rows: int, seed: int = 0):
        self.pins: list[PinnedFile] = []
        rng = np.random.default_rng(seed)
        entries: list[tuple[str | None, Path]] = [(t, Path(p)) for t, p in settings.pinned.items()]
        if settings.path is not None:
            entries.append((None, Path(settings.path)))
        for target, path in entries:
            what = "drift.reference.path" if target is None else f"drift.reference.pinned[{target}]"
            try:
                profile = load_reference_file(path, max_rows=max_rows, rng=rng)
                digest = sha256_file(path)
            except (OSError, ValueError) as exc:
                raise ValueError(f"{what}: {exc}") from None
            self.pins.append(PinnedFile(target, path, profile, digest))

    def match(self, model: str, stream: str, dim: int) -> tuple[PinnedFile | None, str | None]:
        """The most specific pin for (model, stream), and a problem when a targeted pin's dimension is wrong."""
        best: PinnedFile | None = None
        for pin in self.pins:
            rank = pin.matches(model, stream)
            if rank < 0 or (pin.target is None and pin.profile.dim != dim):
                continue
            if best is None or rank > best.matches(model, stream):
                best = pin
        if best is not None and best.profile.dim != dim:
            return None, f"pinned reference {best.path} has dimension {best.profile.dim}, {model}/{stream} has {dim}"
        return best, None

    def __bool__(self) -> bool:
        return bool(self.pins)


# ---------------------------------------------------------------------------------- the store
@dataclass(frozen=True)
class StoredReference:
    """The active reference of one (model, stream) as stored in ``<state_dir>/references``."""

    model: str
    stream: str
    profile: ReferenceProfile
    origin: str  # one of ORIGINS
    pin_sha256: str | None = None  # the pinned file configured for this stream when it was set
    path: Path | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "stream": self.stream,
            "origin": self.origin,
            "records": self.profile.count,
            "sample_rows": len(self.profile.sample),
            "dim": self.profile.dim,
            "captured_at": self.profile.captured_at,
            "source": self.profile.source,
            "path": None if self.path is None else str(self.path),
        }


def _profile_arrays(profile: ReferenceProfile) -> dict[str, Any]:
    buffer = io.BytesIO()
    profile.to_npz(buffer)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


class ReferenceStore:
    """``<state_dir>/references/<model>/<stream>.npz``: one file per (model, stream), written atomically."""

    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / REFERENCES_DIR

    def path(self, model: str, stream: str) -> Path:
        return self.root / safe_name(model) / f"{safe_name(stream)}.npz"

    def save(self, ref: StoredReference) -> Path:
        if ref.origin not in ORIGINS:
            raise ValueError(f"unknown reference origin {ref.origin!r}")
        path = self.path(ref.model, ref.stream)
        arrays = _profile_arrays(ref.profile)
        meta = {
            "version": 1,
            "model": ref.model,
            "stream": ref.stream,
            "origin": ref.origin,
            "pin_sha256": ref.pin_sha256,
            "written_at": time.time(),
        }
        arrays[META_KEY] = np.str_(json.dumps(meta))
        atomic_savez(path, arrays)
        return path

    def load(self, path: Path) -> StoredReference:
        profile = _profile_cls().from_npz(path)
        with np.load(path, allow_pickle=False) as data:
            if META_KEY not in data.files:
                raise ValueError("no embmon_meta member: not written by the daemon")
            meta = json.loads(str(data[META_KEY]))
        origin = str(meta.get("origin"))
        if origin not in ORIGINS:
            raise ValueError(f"unknown origin {origin!r}")
        model, stream = str(meta["model"]), str(meta["stream"])
        if self.path(model, stream) != path:
            raise ValueError(f"names {model}/{stream}, which belongs in {self.path(model, stream)}")
        pin = meta.get("pin_sha256")
        return StoredReference(model, stream, profile, origin, None if pin is None else str(pin), path)

    def load_all(self) -> dict[StreamKey, StoredReference]:
        """Every readable stored reference; unreadable files are logged and skipped, stale temporaries removed."""
        out: dict[StreamKey, StoredReference] = {}
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob("*/*")):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)  # an interrupted write; the previous file is intact
                continue
            if path.suffix != ".npz":
                continue
            try:
                ref = self.load(path)
            except (OSError, ValueError, KeyError) as exc:
                logger.error("ignoring unreadable reference %s: %s", path, exc)
                continue
            out[(ref.model, ref.stream)] = ref
        return out

    def delete(self, model: str, stream: str) -> bool:
        path = self.path(model, stream)
        if not path.exists():
            return False
        path.unlink()
        fsync_directory(path.parent)
        return True


# ---------------------------------------------------------------------------------- lagged ring
@dataclass(frozen=True)
class _Snapshot:
    taken_at: float
    path: Path


class LaggedRing:
    """A bounded on-disk ring of window-sample snapshots per (model, stream), for a lagged reference.

    A snapshot (a ``ReferenceProfile`` of the window: its sample, its exact centroid and record
    count, ``captured_at`` = the window's end) is taken at a drift cycle when the newest one is at
    least ``spacing = max(interval, lag / LAGGED_SLOTS)`` old. :meth:`pick` returns the snapshot
    closest to ``now - lag``, if one lies within ``tolerance = (spacing + interval) / 2`` of it
    (snapshots are ``spacing`` to ``spacing + interval`` apart, so a ring without gaps always has
    one; none does during the first ``lag`` seconds). Snapshots older than ``now - lag - tolerance`` are
    deleted, and at most ``capacity = ceil(lag / spacing) + 2`` are kept per (model, stream): disk
    use is at most ``capacity × max_rows × d × 4`` bytes per (model, stream).

    Files: ``<state_dir>/drift-lagged/<model>/<stream>/<milliseconds>.npz``; they survive restarts.
    """

    def __init__(self, state_dir: Path, lag_seconds: float, interval_seconds: float, max_rows: int):
        self.root = Path(state_dir) / LAGGED_DIR
        self.lag = float(lag_seconds)
        self.spacing = max(float(interval_seconds), self.lag / LAGGED_SLOTS)
        self.tolerance = (self.spacing + float(interval_seconds)) / 2
        self.capacity = math.ceil(self.lag / self.spacing) + 2
        self.max_rows = int(max_rows)
        self._index: dict[StreamKey, list[_Snapshot]] = {}
        self._cache: dict[StreamKey, tuple[Path, ReferenceProfile]] = {}
        self._load_index()

    def _dir(self, key: StreamKey) -> Path:
        return self.root / safe_name(key[0]) / safe_name(key[1])

    def _load_index(self) -> None:
        if not self.root.is_dir():
            return
        for stream_dir in sorted(self.root.glob("*/*")):
            if not stream_dir.is_dir():
                continue
            key = (unsafe_name(stream_dir.parent.name), unsafe_name(stream_dir.name))
            snaps = []
            for path in stream_dir.iterdir():
                if path.name.startswith("."):
                    path.unlink(missing_ok=True)  # interrupted write
                elif path.suffix == ".npz" and path.stem.isdigit():
                    snaps.append(_Snapshot(int(path.stem) / 1000.0, path))
            self._index[key] = sorted(snaps, key=lambda s: s.taken_at)

    def snapshots(self, key: StreamKey) -> list[float]:
        """When each kept snapshot of ``key`` was taken, oldest first."""
        return [s.taken_at for s in self._index.get(key, [])]

    def due(self, key: StreamKey, now: float) -> bool:
        snaps = self._index.get(key)
        return not snaps or now - snaps[-1].taken_at >= self.spacing

    def add(self, key: StreamKey, profile: ReferenceProfile, now: float) -> Path:
        """Store a snapshot taken at ``now`` and prune the ring."""
        path = self._dir(key) / f"{round(now * 1000):015d}.npz"
        atomic_savez(path, _profile_arrays(profile))
        snaps = [s for s in self._index.get(key, []) if s.path != path] + [_Snapshot(round(now * 1000) / 1000.0, path)]
        snaps.sort(key=lambda s: s.taken_at)
        keep = [s for s in snaps if s.taken_at >= now - self.lag - self.tolerance][-self.capacity :]
        for gone in set(snaps) - set(keep):
            gone.path.unlink(missing_ok=True)
        self._index[key] = keep
        return path

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
            profile = _profile_cls().from_npz(best.path)
        except (OSError, ValueError, KeyError) as exc:
            logger.error("lagged snapshot %s is unreadable (%s); dropping it", best.path, exc)
            best.path.unlink(missing_ok=True)
            self._index[key] = [s for s in self._index[key] if s != best]
            return None
        self._cache[key] = (best.path, profile)
        return profile

    def keys(self) -> Iterator[StreamKey]:
        return iter(list(self._index))


# ---------------------------------------------------------------------------------- first N records
class FirstRecords:
    """Builds a reference from the first ``target`` records of a stream, in bounded memory.

    Keeps the exact float64 sum (so the centroid is exact over all ``target`` records) and a
    uniform sample of at most ``capacity`` of them (a :class:`~monitor.state.reservoir.Reservoir`).

    >>> builder = FirstRecords(target=5, dim=2, capacity=3, seed=0)
    >>> builder.add(np.ones((4, 2), dtype=np.float32)), builder.done
    (4, False)
    >>> builder.add(np.ones((4, 2), dtype=np.float32)), builder.done
    (1, True)
    >>> profile = builder.profile(captured_at=1.0)
    >>> profile.count, profile.sample.shape, profile.source
    (5, (3, 2), 'first 5 records')
    """

    def __init__(self, target: int, dim: int, capacity: int, seed: int = 0):
        from monitor.state.reservoir import Reservoir

        self.target = int(target)
        self.dim = int(dim)
        self.reservoir = Reservoir(min(int(capacity), self.target), self.dim, np.random.default_rng(seed))
        self.vector_sum = np.zeros(self.dim, dtype=np.float64)

    @property
    def seen(self) -> int:
        return self.reservoir.seen

    @property
    def done(self) -> bool:
        return self.seen >= self.target

    def add(self, vectors: np.ndarray) -> int:
        """Take rows until ``target`` is reached; returns how many rows of ``vectors`` were used."""
        take = max(0, min(len(vectors), self.target - self.seen))
        if take:
            rows = vectors[:take]
            self.reservoir.add(rows)
            self.vector_sum += rows.sum(axis=0, dtype=np.float64)
        return take

    def profile(self, captured_at: float) -> ReferenceProfile:
        if not self.done:
            raise ValueError(f"only {self.seen} of {self.target} records so far")
        return _profile_cls()(
            sample=self.reservoir.vectors.copy(), centroid=self.vector_sum / self.seen, count=self.seen,
            captured_at=captured_at, source=f"first {self.target} records",
        )

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target, "reservoir": self.reservoir.state_dict(), "vector_sum": self.vector_sum.copy()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FirstRecords:
        from monitor.state.reservoir import Reservoir

        reservoir = Reservoir.from_state_dict(dict(state["reservoir"]))
        builder = cls(int(state["target"]), reservoir.dim, reservoir.capacity)
        vector_sum = np.asarray(state["vector_sum"], dtype=np.float64)
        if vector_sum.shape != (reservoir.dim,) or reservoir.seen > builder.target:
            raise ValueError("first-records state is inconsistent")
        builder.reservoir = reservoir
        builder.vector_sum = vector_sum.copy()
        return builder
