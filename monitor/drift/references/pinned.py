"""Pinned reference files: ``drift.reference.path`` (every stream of its dimension) and
``drift.reference.pinned`` (``MODEL`` or ``MODEL/STREAM``), loaded once at start.

A file is an ``.npz`` written by :meth:`ReferenceProfile.to_npz` (``embedding-monitor baseline
capture --out``) or an ``.npy`` (n, d) matrix. Each pin carries the file's SHA-256, so the daemon
re-applies a pin only when the operator changes the file (a capture made meanwhile survives
restarts).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monitor.drift.references.profile import (
    ReferenceProfile,
    check_matrix,
    open_matrix,
    profile_from_matrix,
    uniform_subsample,
)
from monitor.drift.settings import DaemonReferenceSettings


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_reference_file(path: Path, *, max_rows: int, rng: np.random.Generator) -> ReferenceProfile:
    """A pinned reference: an ``.npz`` ReferenceProfile as is, or an ``.npy`` matrix (sampled to ``max_rows``)."""
    path = Path(path)
    if path.suffix == ".npz":
        try:
            profile = ReferenceProfile.from_npz(path)
        except ValueError as exc:
            raise ValueError(f"{path}: not a usable reference archive ({exc}); write one with "
                             "`embedding-monitor baseline capture --from vectors.npy --out FILE`") from None
        check_matrix(profile.sample, str(path))
        if len(profile.sample) > max_rows:
            profile = ReferenceProfile(
                sample=uniform_subsample(profile.sample, max_rows, rng), centroid=profile.centroid,
                count=profile.count, captured_at=profile.captured_at, source=profile.source,
            )
        return profile
    if path.suffix == ".npy":
        matrix = open_matrix(path)
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
