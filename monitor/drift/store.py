"""The active reference of each (model, stream), on disk: ``<state_dir>/references/<model>/<stream>.npz``.

Whatever its origin (a pinned file, a capture, a prepared file, the first N records; lagged
references live in :mod:`monitor.drift.lagged`), a stream's reference is stored as a
``ReferenceProfile`` archive (readable by ``ReferenceProfile.from_npz``, so it can be pinned
elsewhere) plus one ``embmon_meta`` member (JSON: origin, pinned-file hash). Every write is
atomic (temporary file, fsync, rename, directory fsync). At start the stored references are
reloaded, so a restart never re-captures.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from monitor.drift.profile import ReferenceProfile
from monitor.files import atomic_savez, fsync_directory, safe_name
from monitor.records import StreamKey

logger = logging.getLogger(__name__)

REFERENCES_DIR = "references"
META_KEY = "embmon_meta"
Origin = Literal["pinned", "first_records", "captured", "file"]
ORIGINS: tuple[str, ...] = ("pinned", "first_records", "captured", "file")


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
        arrays = ref.profile.to_arrays()
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
        profile = ReferenceProfile.from_npz(path)
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
