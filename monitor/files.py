"""Crash-safe file writes: whatever instant the process dies, a reader sees the old file or the new one.

Used for everything the daemon persists in its state directory (references, lagged snapshots);
checkpoints add a rotation of the previous file on top (monitor/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np


def fsync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # not supported everywhere (some network filesystems)
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write`` on a temporary file next to ``path``, fsync it, rename it over ``path``, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def atomic_savez(path: Path, arrays: dict[str, Any]) -> None:
    """``np.savez`` to ``path`` with :func:`atomic_write`."""
    atomic_write(path, lambda handle: np.savez(handle, **arrays))
