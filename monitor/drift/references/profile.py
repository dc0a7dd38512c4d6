"""The reference a window is compared with, and its ``.npz`` form; numpy only.

A :class:`ReferenceProfile` is what the daemon pins, stores in its state directory, reloads after
a restart and hands to the drift tests. Settings, the reference store and the ``baseline`` command
use it without loading torch or scikit-learn.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.drift.attribution.regions import REGION_MEMBERS, Regions
from monitor.drift.online.signals import SignalBaseline
from monitor.storage.archives import Member, read_npz
from monitor.storage.durable_files import atomic_savez

_NPZ_FORMAT_VERSION = 1
_LATEST_TIME = 1e11  # unix seconds (year 5138): a captured_at beyond is no time


@dataclass(frozen=True)
class ReferenceProfile:
    """What a window is compared with: a uniform sample of the reference records and their centroid.

    ``centroid`` is the mean over all ``count`` reference records (exact, from the running sums),
    not only over ``sample``. ``captured_at`` is unix seconds; ``source`` says where it came from
    (e.g. ``"first 5000 records"``, ``"pinned /etc/embmon/ref.npz"``, ``"lagged 86400s"``).
    ``sample_ids``: the records' own ids of the sample rows (None where a record had none; None
    when no row had one), so an explanation can name reference items. ``regions``: the partition
    the drift cycle explains shifts with (:mod:`monitor.drift.attribution.regions`); None until the drift
    component fits it (references written before regions existed have none either).

    Examples
    --------
    >>> import io
    >>> rng = np.random.default_rng(0)
    >>> profile = ReferenceProfile.from_sample(rng.normal(size=(50, 4)), captured_at=1.7e9, source="test")
    >>> buffer = io.BytesIO()
    >>> profile.to_npz(buffer)
    >>> _ = buffer.seek(0)
    >>> restored = ReferenceProfile.from_npz(buffer)
    >>> restored.count, restored.source, restored.sample.dtype, bool(np.all(restored.sample == profile.sample))
    (50, 'test', dtype('float32'), True)
    """

    sample: np.ndarray
    centroid: np.ndarray
    count: int
    captured_at: float
    source: str
    sample_ids: tuple[str | None, ...] | None = None
    regions: Regions | None = None

    def __post_init__(self) -> None:
        sample = np.ascontiguousarray(self.sample, dtype=np.float32)
        centroid = np.asarray(self.centroid, dtype=np.float64)
        if sample.ndim != 2 or len(sample) < 2:
            raise ValueError(f"the reference sample must be (n >= 2, d); got shape {sample.shape}")
        if centroid.shape != (sample.shape[1],):
            raise ValueError(f"the centroid must have shape ({sample.shape[1]},); got {centroid.shape}")
        if not np.all(np.isfinite(sample)) or not np.all(np.isfinite(centroid)):
            raise ValueError("the reference contains non-finite values")
        if self.count < len(sample):
            raise ValueError(f"count ({self.count}) is smaller than the sample ({len(sample)} rows)")
        ids = self.sample_ids
        if ids is not None:
            ids = tuple(None if i is None or i == "" else str(i) for i in ids)
            if len(ids) != len(sample):
                raise ValueError(f"{len(ids)} sample ids for {len(sample)} sample rows")
            if all(i is None for i in ids):
                ids = None
        if self.regions is not None and self.regions.dim != sample.shape[1]:
            raise ValueError(f"regions of dimension {self.regions.dim} for a {sample.shape[1]}-d reference")
        object.__setattr__(self, "sample_ids", ids)
        object.__setattr__(self, "sample", sample)
        object.__setattr__(self, "centroid", centroid)
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "captured_at", float(self.captured_at))

    @classmethod
    def from_sample(
        cls,
        sample: np.ndarray,
        *,
        captured_at: float,
        source: str,
        centroid: np.ndarray | None = None,
        count: int | None = None,
    ) -> ReferenceProfile:
        """A profile whose centroid and count default to the sample's own."""
        sample = np.asarray(sample, dtype=np.float32)
        return cls(
            sample=sample,
            centroid=sample.mean(axis=0, dtype=np.float64) if centroid is None else centroid,
            count=len(sample) if count is None else count,
            captured_at=captured_at,
            source=source,
        )

    @property
    def dim(self) -> int:
        return int(self.sample.shape[1])

    def signal_baseline(self) -> SignalBaseline:
        """The online detectors' baseline (centroid direction and signal scales) from this reference."""
        return SignalBaseline.from_reference(self.sample, self.centroid)

    def to_arrays(self) -> dict[str, Any]:
        """The members of the ``.npz`` archive (the reference store adds a metadata member to them).

        ``sample_ids`` and the regions' members are optional: readers that predate them ignore
        them, and archives without them load with none.
        """
        arrays = {
            "format_version": np.int64(_NPZ_FORMAT_VERSION),
            "sample": self.sample,
            "centroid": self.centroid,
            "count": np.int64(self.count),
            "captured_at": np.float64(self.captured_at),
            "source": np.str_(self.source),
        }
        if self.sample_ids is not None:
            arrays["sample_ids"] = np.array(["" if i is None else i for i in self.sample_ids], dtype=np.str_)
        if self.regions is not None:
            arrays.update(self.regions.to_arrays())
        return arrays

    def to_npz(self, target: str | os.PathLike[str] | Any) -> None:
        """Write to a path (atomically: temporary file, then rename) or to a binary file object."""
        arrays = self.to_arrays()
        if not isinstance(target, (str, os.PathLike)):
            np.savez(target, **arrays)
            return
        atomic_savez(Path(target), arrays)

    @classmethod
    def from_npz(cls, source: str | os.PathLike[str] | Any) -> ReferenceProfile:
        """Read what :meth:`to_npz` wrote; anything else (another format version, a damaged or
        oversized archive, a member of the wrong shape or type) is a one-line ``ValueError``."""
        return cls.from_arrays(read_reference_arrays(source))

    @classmethod
    def from_arrays(cls, data: Mapping[str, np.ndarray]) -> ReferenceProfile:
        """A profile from the members :func:`read_reference_arrays` checked."""
        version = int(data["format_version"]) if "format_version" in data else None
        if version != _NPZ_FORMAT_VERSION:
            raise ValueError(f"unsupported reference format version {version}; expected {_NPZ_FORMAT_VERSION}")
        missing = [name for name in ("sample", "centroid", "count", "captured_at", "source") if name not in data]
        if missing:
            raise ValueError(f"no {missing[0]!r} member: not a reference archive")
        captured_at = float(data["captured_at"])
        if not 0 <= captured_at < _LATEST_TIME:
            raise ValueError(f"captured_at {captured_at} is not a time")
        try:
            regions = Regions.from_arrays(data)
        except KeyError as exc:
            raise ValueError(f"regions without their {exc} member") from None
        return cls(
            sample=data["sample"],
            centroid=data["centroid"],
            count=int(data["count"]),
            captured_at=captured_at,
            source=str(data["source"]),
            sample_ids=tuple(str(i) for i in data["sample_ids"]) if "sample_ids" in data else None,
            regions=regions,
        )


REFERENCE_MAX_BYTES = 2**30
"""A reference archive larger than this (its file, or its arrays uncompressed) is refused unread: 1 GiB
is 350,000 rows at d = 768; the daemon keeps 2 × ``drift.reference_sample_size`` rows (20,000 by default)."""

# every one optional here: ReferenceProfile.from_arrays checks the format version first
_REFERENCE_MEMBERS = {
    name: Member(ndim, kinds, required=False)
    for name, ndim, kinds in (
        ("format_version", 0, "iu"), ("sample", 2, "fiu"), ("centroid", 1, "fiu"), ("count", 0, "iu"),
        ("captured_at", 0, "fiu"), ("source", 0, "U"), ("sample_ids", 1, "U"), *REGION_MEMBERS,
    )
}


def read_reference_arrays(
    source: str | os.PathLike[str] | Any, extra: Mapping[str, Member] | None = None
) -> dict[str, np.ndarray]:
    """The members of a reference archive (and ``extra`` ones), each checked before it is read
    (monitor/storage/archives.py); members this build does not know are left unread."""
    return read_npz(source, {**_REFERENCE_MEMBERS, **(extra or {})}, max_bytes=REFERENCE_MAX_BYTES)


def open_matrix(path: Path) -> np.ndarray:
    """An ``.npy`` file, memory-mapped (rows are read as they are used); anything else, an empty or
    truncated file included, is a one-line ``ValueError`` (OSError if it cannot be opened)."""
    with open(path, "rb") as handle:
        if handle.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not an .npy file")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # a truncated header or data section, object arrays
        raise ValueError(f"{path}: not a readable .npy matrix ({exc})") from None


def uniform_subsample(sample: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``size`` rows, uniformly without replacement, in their original order."""
    if len(sample) <= size:
        return sample
    return sample[subsample_index(len(sample), size, rng)]


def subsample_index(rows: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of :func:`uniform_subsample`'s rows (every row when there are at most ``size``), so
    ids can follow their rows."""
    if rows <= size:
        return np.arange(rows)
    return np.sort(rng.choice(rows, size=size, replace=False))


def subsample_ids(ids: tuple[str | None, ...] | None, index: np.ndarray) -> tuple[str | None, ...] | None:
    """The ids of the rows at ``index`` (None when there are no ids)."""
    return None if ids is None else tuple(ids[i] for i in index)


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
    x = check_matrix(matrix, source)
    centroid = x.mean(axis=0, dtype=np.float64)
    sample = uniform_subsample(x, max_rows, rng)
    return ReferenceProfile(sample=sample, centroid=centroid, count=len(x), captured_at=captured_at, source=source)
