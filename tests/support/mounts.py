"""Real filesystem faults for a state directory: a small tmpfs (a full disk), remounted read-only and
back, and peak resident memory while something runs. Mounting needs root, which the tests run as
(a container's root, or CI's); every mount is undone on the way out."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.waiting import wait_until


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """``path`` as a fresh tmpfs of ``size`` bytes (a disk that fills), unmounted when the block ends."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def remount(path: Path, mode: str) -> None:
    """Remount the tmpfs at ``path`` ``ro`` (writes fail with EROFS, root's too) or ``rw``; a remount
    that finds a file open for writing (a checkpoint being written) fails busy, and is tried again."""
    wait_until(
        lambda: subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True).returncode == 0,
        timeout=20, interval=0.05, message=f"remount {path} {mode}",
    )


def fill(directory: Path) -> Path:
    """A file that takes every free byte of ``directory``'s filesystem (a full disk); delete it to free them."""
    filler = directory / "filler"
    chunk = bytes(64 * 1024)
    with filler.open("wb", buffering=0) as handle:
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                handle.write(chunk)
    with filler.open("ab", buffering=0) as handle, contextlib.suppress(OSError):
        while True:  # the last partial chunk's worth, byte pages at a time
            handle.write(bytes(4096))
    return filler


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_rss_growth(action: Callable[[], object]) -> int:
    """Bytes by which this process's peak resident memory rose above its resident memory while
    ``action`` ran (Linux: the peak is reset through /proc/self/clear_refs first)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    action()
    return (_status_kib("VmHWM") - before) * 1024
