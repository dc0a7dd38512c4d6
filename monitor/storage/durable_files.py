"""Files in the state directory: crash-safe writes, files set aside, and label values as file names.

Whatever instant the process dies, a reader sees the old file or the new one. Used for everything
the daemon persists in its state directory (references, lagged snapshots, canary pins); checkpoints
add a rotation of the previous file on top (monitor/storage/checkpoint_format.py). A temporary file is created
next to its target under an unpredictable name (``.<target>.<16 hex digits>.tmp``) with
``O_CREAT|O_EXCL|O_NOFOLLOW``, so nothing planted in the directory can be written through, and a
failed write removes it (a full disk stays no fuller than before). Start-up removes what a killed
process left: :func:`remove_stale_temporaries`, our own names only. A file the daemon cannot use
is renamed :func:`aside <move_aside>` (``<name>.rejected-<UTC time>``) rather than deleted, so an
operator can look at it. Model and stream names become path components through
:func:`safe_name`, which no label value can turn into ``..`` or a separator.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from monitor.tally import Tally

logger = logging.getLogger(__name__)

# Our temporary files: ``.<target>.<16 hex>.tmp``; before that, tempfile's ``.<target>.<8 chars>.tmp``
# and the checkpoint's ``.checkpoint.tmp-<pid>`` (still removed, as leftovers of older versions).
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?:[0-9a-f]{16}|[a-z0-9_]{8})\.tmp")
_LEGACY_CHECKPOINT_TEMPORARY = re.compile(r"\.checkpoint\.tmp-\d+")
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
REJECTED_KEPT = 3  # files set aside per name; older ones are deleted


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


def write_temporary(path: Path, write: Callable[[IO[bytes]], object]) -> Path:
    """A new temporary file next to ``path`` holding what ``write`` wrote, fsynced; on any failure
    (a full disk, a read-only directory) it is removed and the error raised."""
    for _ in range(16):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(temporary, _CREATE_FLAGS, 0o600)
        except FileExistsError:  # a name already taken, by anything (a symlink too): draw another
            continue
        break
    else:
        raise FileExistsError(f"no free temporary name next to {path}")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return temporary


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write`` on a temporary file next to ``path``, fsync it, rename it over ``path``, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_with(path, write_temporary(path, write))
    fsync_directory(path.parent)


def replace_with(path: Path, temporary: Path) -> None:
    """Rename ``temporary`` over ``path``; if that fails the temporary file is removed."""
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def remove_stale_temporaries(directory: Path, target: str | None = None) -> int:
    """Delete the temporary files a killed writer left in ``directory`` (those of ``target`` only,
    if given): our own name patterns, nothing else. Returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        ours = (match is not None and target in (None, match["target"])) or (
            target in (None, "checkpoint.embmon") and _LEGACY_CHECKPOINT_TEMPORARY.fullmatch(entry.name)
        )
        if ours and not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed += 1
    return removed


def move_aside(path: Path, keep: int = REJECTED_KEPT) -> Path:
    """Rename ``path`` to ``<name>.rejected-<UTC time>`` in its directory (never over another file)
    and delete all but the newest ``keep`` set-aside copies of that name. Raises OSError if the
    rename fails (a read-only directory)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = f"{path.name}.rejected-{stamp}"
    target = path.with_name(base)
    number = 1
    while target.exists() or target.is_symlink():
        number += 1
        target = path.with_name(f"{base}-{number}")
    os.rename(path, target)
    fsync_directory(path.parent)
    copies = sorted(path.parent.glob(f"{glob.escape(path.name)}.rejected-*"), key=_set_aside_order)
    for old in copies[: max(0, len(copies) - keep)]:
        with contextlib.suppress(OSError):
            old.unlink()
    return target


REJECTED_FILE_KINDS = ("reference", "canary_pins")  # the `file` label of embmon_state_files_rejected_total


class RejectedFiles:
    """Files of the state directory the daemon cannot use (a damaged stored reference, unreadable
    canary pins): each is moved aside, counted by kind and logged once, and the daemon goes on
    without it, as if it had never been written."""

    def __init__(self) -> None:
        self.counts: Tally[str] = Tally()

    def set_aside(self, kind: str, path: Path, reason: str) -> None:
        self.counts.add(kind)
        try:
            where = f"moved aside to {move_aside(path).name}"
        except OSError as exc:
            where = f"left in place: it could not be moved aside ({exc.strerror or exc})"
        logger.error("%s %s is unusable (%s); %s", kind.replace("_", " "), path, reason, where)


def _set_aside_order(path: Path) -> tuple[str, int]:
    stamp, _, number = path.name.rpartition(".rejected-")[2].partition("-")
    return stamp, int(number) if number.isdigit() else 1


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
