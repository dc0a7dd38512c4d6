"""Durable, verifiable snapshots of the daemon's state and of the Kafka offsets it reflects.

File layout (``<state_dir>/checkpoint.embmon``; the one before it is kept as
``checkpoint.prev.embmon``)::

    offset  size  field
    0       8     magic  b"EMBMONCK"
    8       2     format version, little-endian uint16 (FORMAT_VERSION)
    10      2     flags (0)
    12      8     payload length in bytes, little-endian uint64
    20      32    sha256 of the payload
    52      ...   payload: an uncompressed ``numpy.savez`` archive

The archive holds ``meta`` (UTF-8 JSON as a uint8 array) and one ``a<k>`` member per numpy array
of the state; in the JSON tree an array is ``{"__nd__": k}``. Nothing is pickled: arrays are read
with ``allow_pickle=False``, so a hostile or corrupt file can fail to load but cannot run code.

Writing is crash-safe: the bytes go to a new temporary file in the same directory (an
unpredictable name created exclusively, never through a symlink: monitor/storage/durable_files.py), which is
fsynced, then the current checkpoint is renamed to ``.prev`` and the temporary file renamed over
the current one (both atomic), and the directory is fsynced. A crash at any instant leaves at
least one complete, verifiable checkpoint; a failed write removes its temporary file.

Reading checks before it allocates: the file's size against ``checkpoint.max_bytes``, the header
against the file's size, the sha256 over the payload, then every archive member's declared shape
and dtype (monitor/storage/archives.py). A file that fails anything, or whose state the caller refuses, is
renamed aside (``checkpoint.embmon.rejected-<UTC time>``; the newest three are kept) and the
previous one is tried: the rotation can then never push a good ``.prev`` out with a file that was
not restored.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.storage.archives import ArchiveError, Member, read_npz
from monitor.storage.durable_files import (
    fsync_directory,
    move_aside,
    remove_stale_temporaries,
    replace_with,
    write_temporary,
)

logger = logging.getLogger(__name__)

MAGIC = b"EMBMONCK"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHQ32s")
CURRENT = "checkpoint.embmon"
PREVIOUS = "checkpoint.prev.embmon"
DEFAULT_MAX_BYTES = 16 * 2**30  # checkpoint.max_bytes: a bigger file is refused unread
# The `reason` label of embmon_checkpoint_restore_failures_total.
RESTORE_FAILURE_REASONS = ("unreadable", "corrupt", "incompatible", "invalid")
_TAGS = ("__nd__", "__bytes__", "__items__")


class CheckpointError(Exception):
    """A checkpoint that cannot be used; ``reason`` is one of RESTORE_FAILURE_REASONS."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# ------------------------------------------------------------------------------ encoding
def flatten(obj: Any, arrays: list[np.ndarray]) -> Any:
    """A JSON-able copy of ``obj`` with numpy arrays moved (copied) into ``arrays``.

    Supports dicts (any keys), lists, tuples (read back as lists), str, int (any size), float
    (NaN/inf included), bool, None, bytes, numpy scalars and numeric/bool/unicode arrays.

    >>> arrays = []
    >>> tree = flatten({"n": np.int64(3), "x": np.arange(2.0), 1: b"ok"}, arrays)
    >>> tree, len(arrays)
    ({'__items__': [['n', 3], ['x', {'__nd__': 0}], [1, {'__bytes__': 'b2s='}]]}, 1)
    >>> unflatten(tree, arrays)
    {'n': 3, 'x': array([0., 1.]), 1: b'ok'}
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufcU":
            if obj.dtype.kind == "O":
                return flatten(obj.tolist(), arrays)
            raise TypeError(f"cannot checkpoint arrays of dtype {obj.dtype}")
        arrays.append(np.array(obj, copy=True))
        return {"__nd__": len(arrays) - 1}
    if isinstance(obj, np.generic):
        return flatten(obj.item(), arrays)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"__bytes__": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, (list, tuple)):
        return [flatten(v, arrays) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _TAGS for k in obj):
            return {k: flatten(v, arrays) for k, v in obj.items()}
        return {"__items__": [[flatten(k, arrays), flatten(v, arrays)] for k, v in obj.items()]}
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__}")


def unflatten(tree: Any, arrays: list[np.ndarray]) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(tree, list):
        return [unflatten(v, arrays) for v in tree]
    if isinstance(tree, dict):
        if len(tree) == 1:
            ((tag, value),) = tree.items()
            if tag == "__nd__":
                return arrays[int(value)]
            if tag == "__bytes__":
                return base64.b64decode(value)
            if tag == "__items__":
                return {_hashable(unflatten(k, arrays)): unflatten(v, arrays) for k, v in value}
        return {k: unflatten(v, arrays) for k, v in tree.items()}
    return tree


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def encode(tree: Any, arrays: list[np.ndarray]) -> bytes:
    """The whole file: header + savez payload of an already flattened state."""
    meta = json.dumps(tree, separators=(",", ":")).encode()
    members = {"meta": np.frombuffer(meta, dtype=np.uint8)}
    members.update({f"a{k}": a for k, a in enumerate(arrays)})
    buffer = io.BytesIO()
    np.savez(buffer, **members)  # type: ignore[arg-type]  # numpy's stub: a **dict could fill allow_pickle
    payload = buffer.getvalue()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), hashlib.sha256(payload).digest())
    return header + payload


def decode(data: bytes) -> Any:
    """Verify and decode a checkpoint file's bytes; raises :class:`CheckpointError`."""
    digest, length = _check_header(bytes(data[: _HEADER.size]), len(data))
    return _decode_payload(memoryview(data)[_HEADER.size :], digest)


def read_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Verify and decode a checkpoint file, reading no more of it than its checks allow (a file over
    ``max_bytes``, or whose header disagrees with its size, is refused before its payload is read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise CheckpointError("unreadable", exc.strerror or str(exc)) from None
    with open(fd, "rb") as handle:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError("unreadable", "not a regular file")
            if info.st_size > max_bytes:
                raise CheckpointError("unreadable", f"{info.st_size} bytes, over checkpoint.max_bytes ({max_bytes})")
            digest, length = _check_header(handle.read(_HEADER.size), info.st_size)
            _verify(handle, length, digest)  # in 1 MiB pieces: a bad file of any size costs no memory
            handle.seek(_HEADER.size)
            payload = handle.read(length)
        except OSError as exc:
            raise CheckpointError("unreadable", exc.strerror or str(exc)) from None
    if len(payload) != length:
        raise CheckpointError("corrupt", f"payload is {len(payload)} bytes, header says {length} (truncated?)")
    return _decode_payload(payload, None)  # verified above, through the same open file


def _verify(handle: Any, length: int, digest: bytes) -> None:
    sha, buffer = hashlib.sha256(), memoryview(bytearray(1 << 20))
    left = length
    while left:
        read = handle.readinto(buffer[: min(left, len(buffer))])
        if not read:
            raise CheckpointError("corrupt", f"the payload ends {left} bytes early")
        sha.update(buffer[:read])
        left -= read
    if sha.digest() != digest:
        raise CheckpointError("corrupt", "sha256 mismatch")


def _check_header(header: bytes, size: int) -> tuple[bytes, int]:
    """(sha256, payload length) of a header that describes a file of ``size`` bytes."""
    if len(header) < _HEADER.size:
        raise CheckpointError("corrupt", f"{size} bytes is shorter than the header")
    magic, version, _flags, length, digest = _HEADER.unpack(header)
    if magic != MAGIC:
        raise CheckpointError("corrupt", "not an embedding-monitor checkpoint (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointError("incompatible", f"checkpoint format {version}, this build reads {FORMAT_VERSION}")
    if length != size - _HEADER.size:
        raise CheckpointError("corrupt", f"payload is {size - _HEADER.size} bytes, header says {length} (truncated?)")
    return digest, length


def _decode_payload(payload: bytes | memoryview, digest: bytes | None) -> Any:
    """The state in a payload (its sha256 checked against ``digest`` unless already verified)."""
    if digest is not None and hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("corrupt", "sha256 mismatch")
    try:
        members = read_npz(io.BytesIO(payload), {"meta": Member(1, "u")}, others=Member(None, "biufcU"),
                           max_bytes=len(payload), stored_only=True)
    except ArchiveError as exc:
        raise CheckpointError("corrupt", f"payload does not decode: {exc}") from None
    count = len(members) - 1
    if set(members) != {"meta", *(f"a{k}" for k in range(count))}:
        raise CheckpointError("corrupt", f"payload members {sorted(members)} are not meta, a0 ... a{count - 1}")
    try:
        tree = json.loads(members["meta"].tobytes().decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError("corrupt", f"state tree is not JSON: {exc}") from None
    try:
        return unflatten(tree, [members[f"a{k}"] for k in range(count)])
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CheckpointError("corrupt", f"state tree does not decode: {type(exc).__name__}: {exc}") from None


# ------------------------------------------------------------------------------ files
@dataclass(frozen=True)
class Written:
    path: Path
    size_bytes: int


class CheckpointStore:
    """The checkpoint files of one state directory."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self._not_set_aside: list[Path] = []  # rejected files the rename could not move yet

    @property
    def current(self) -> Path:
        return self.directory / CURRENT

    @property
    def previous(self) -> Path:
        return self.directory / PREVIOUS

    def write(self, tree: Any, arrays: list[np.ndarray]) -> Written:
        """Atomically replace the current checkpoint, keeping the one before as ``.prev``."""
        data = encode(tree, arrays)
        self.directory.mkdir(parents=True, exist_ok=True)
        for rejected in list(self._not_set_aside):  # never rotate a rejected file into .prev
            if _exists(rejected):
                move_aside(rejected)
            self._not_set_aside.remove(rejected)
        temporary = write_temporary(self.current, lambda handle: handle.write(data))
        if _exists(self.current):
            try:
                os.replace(self.current, self.previous)
            except BaseException:
                with contextlib.suppress(OSError):
                    temporary.unlink()
                raise
        replace_with(self.current, temporary)
        fsync_directory(self.directory)
        return Written(self.current, len(data))

    def load(
        self, restore: Callable[[Any], None], on_failure: Callable[[str, Path, str], None]
    ) -> Path | None:
        """Decode the newest usable checkpoint and hand it to ``restore``; returns its path.

        ``restore`` raises (a :class:`CheckpointError`, or anything else, read as "invalid") to
        reject a checkpoint; it must not have changed anything when it does. Any failure to read
        or decode a file is "corrupt" unless it says otherwise. Each rejected file is reported
        through ``on_failure(reason, path, message)``, moved aside and the next older one tried.
        None when nothing was usable.
        """
        remove_stale_temporaries(self.directory, CURRENT)
        for path in (self.current, self.previous):
            if not _exists(path):
                continue
            try:
                try:
                    state = read_file(path, self.max_bytes)
                except CheckpointError:
                    raise
                except Exception as exc:  # noqa: BLE001 - whatever a bad file does, it is a bad file
                    raise CheckpointError("corrupt", f"{type(exc).__name__}: {exc}") from None
                try:
                    restore(state)
                except CheckpointError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a state that does not fit is refused
                    raise CheckpointError("invalid", f"{type(exc).__name__}: {exc}") from None
            except CheckpointError as exc:
                on_failure(exc.reason, path, f"{exc}; {self._set_aside(path)}")
                continue
            return path
        return None

    def _set_aside(self, path: Path) -> str:
        """Move a rejected file out of the rotation (retried before the next write if it fails)."""
        try:
            return f"moved aside to {move_aside(path).name}"
        except OSError as exc:
            self._not_set_aside.append(path)
            return f"could not be moved aside ({exc.strerror or exc}), retried before the next write"


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()
