"""Files in the state directory: crash-safe writes, and label values as file names.

Whatever instant the process dies, a reader sees the old file or the new one. Used for everything
the daemon persists in its state directory (references, lagged snapshots); checkpoints add a
rotation of the previous file on top (monitor/checkpoint.py). Model and stream names become path
components through :func:`safe_name`, which no label value can turn into ``..`` or a separator.
"""

from __future__ import annotations

import contextlib
import os
import re
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


def safe_name(label: str) -> str:
    """A label value as one path component: anything but ASCII letters, digits, ``_`` and ``-`` is %XX.

    >>> safe_name("sentence-transformers/all-MiniLM.v2"), safe_name("..")
    ('sentence-transformers%2Fall-MiniLM%2Ev2', '%2E%2E')
    """
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else f"%{ord(c):02X}" for c in label)


def unsafe_name(name: str) -> str:
    """Inverse of :func:`safe_name`."""
    return re.sub(r"%([0-9A-F]{2})", lambda m: chr(int(m.group(1), 16)), name)
