"""The active reference of each (model, stream), on disk: ``<state_dir>/references/<model>/<stream>.npz``.

Whatever its origin (a pinned file, a capture, a prepared file, the first N records; lagged
references live in :mod:`monitor.drift.references.lagged`), a stream's reference is stored as a
``ReferenceProfile`` archive (readable by ``ReferenceProfile.from_npz``, so it can be pinned
elsewhere) plus one ``embmon_meta`` member (JSON: origin, pinned-file hash). Every write is
atomic (temporary file, fsync, rename, directory fsync). At start the stored references are
reloaded, so a restart never re-captures; one that cannot be read (damaged, oversized, of the wrong
shape: monitor/storage/archives.py) is reported by :meth:`ReferenceStore.scan` for the daemon to set aside.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from monitor.decoding.records import StreamKey
from monitor.drift.references.profile import ReferenceProfile, read_reference_arrays
from monitor.storage.archives import Member
from monitor.storage.durable_files import atomic_savez, fsync_directory, remove_stale_temporaries, safe_name

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
        """The stored reference in ``path``; ``ValueError`` (one line) for anything unusable."""
        try:
            data = read_reference_arrays(path, {META_KEY: Member(0, "U", required=False)})
        except OSError as exc:
            raise ValueError(exc.strerror or str(exc)) from None
        if META_KEY not in data:
            raise ValueError("no embmon_meta member: not written by the daemon")
        profile = ReferenceProfile.from_arrays(data)
        meta = json.loads(str(data[META_KEY]))
        if not isinstance(meta, dict) or not all(isinstance(meta.get(k), str) for k in ("model", "stream")):
            raise ValueError("embmon_meta does not name a model and a stream")
        origin = str(meta.get("origin"))
        if origin not in ORIGINS:
            raise ValueError(f"unknown origin {origin!r}")
        model, stream = meta["model"], meta["stream"]
        if self.path(model, stream) != path:
            raise ValueError(f"names {model}/{stream}, which belongs in {self.path(model, stream)}")
        pin = meta.get("pin_sha256")
        return StoredReference(model, stream, profile, origin, None if pin is None else str(pin), path)

    def remove_stale_temporaries(self) -> None:
        """Remove the temporary files of interrupted writes (the previous file is intact): the daemon
        at start, never a reader beside a running daemon."""
        if self.root.is_dir():
            for model_dir in self.root.iterdir():
                remove_stale_temporaries(model_dir)

    def scan(self) -> tuple[dict[StreamKey, StoredReference], dict[Path, str]]:
        """Every readable stored reference, and every unreadable one with the reason."""
        out: dict[StreamKey, StoredReference] = {}
        unreadable: dict[Path, str] = {}
        if not self.root.is_dir():
            return out, unreadable
        for path in sorted(self.root.glob("*/*.npz")):
            try:
                ref = self.load(path)
            except ValueError as exc:
                unreadable[path] = str(exc)
                continue
            out[(ref.model, ref.stream)] = ref
        return out, unreadable

    def load_all(self) -> dict[StreamKey, StoredReference]:
        """Every readable stored reference (:meth:`scan` without the unreadable ones)."""
        return self.scan()[0]

    def delete(self, model: str, stream: str) -> bool:
        path = self.path(model, stream)
        if not path.exists():
            return False
        path.unlink()
        fsync_directory(path.parent)
        return True
