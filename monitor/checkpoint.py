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

Writing is crash-safe: the bytes go to a temporary file in the same directory, which is fsynced,
then the current checkpoint is renamed to ``.prev`` and the temporary file renamed over the
current one (both atomic), and the directory is fsynced. A crash at any instant leaves at least
one complete, verifiable checkpoint.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import os
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monitor.files import fsync_directory

logger = logging.getLogger(__name__)

MAGIC = b"EMBMONCK"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHQ32s")
CURRENT = "checkpoint.embmon"
PREVIOUS = "checkpoint.prev.embmon"
REJECTED = "checkpoint.rejected.embmon"
_TMP_PREFIX = ".checkpoint.tmp-"
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
    np.savez(buffer, **members)
    payload = buffer.getvalue()
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(payload), hashlib.sha256(payload).digest())
    return header + payload


def decode(data: bytes) -> Any:
    """Verify and decode a checkpoint file's bytes; raises :class:`CheckpointError`."""
    if len(data) < _HEADER.size:
        raise CheckpointError("corrupt", f"{len(data)} bytes is shorter than the header")
    magic, version, _flags, length, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError("corrupt", "not an embedding-monitor checkpoint (bad magic)")
    if version != FORMAT_VERSION:
        raise CheckpointError("incompatible", f"checkpoint format {version}, this build reads {FORMAT_VERSION}")
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise CheckpointError("corrupt", f"payload is {len(payload)} bytes, header says {length} (truncated?)")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("corrupt", "sha256 mismatch")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            names = archive.files
            arrays = [archive[f"a{k}"] for k in range(len(names) - 1)]
            tree = json.loads(bytes(archive["meta"]).decode())
    except (ValueError, KeyError, OSError, zipfile.BadZipFile, UnicodeDecodeError, EOFError) as exc:
        raise CheckpointError("corrupt", f"payload does not decode: {type(exc).__name__}: {exc}") from None
    try:
        return unflatten(tree, arrays)
    except (IndexError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError("corrupt", f"state tree does not decode: {exc}") from None


# ------------------------------------------------------------------------------ files
@dataclass(frozen=True)
class Written:
    path: Path
    size_bytes: int


class CheckpointStore:
    """The checkpoint files of one state directory."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

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
        tmp = self.directory / f"{_TMP_PREFIX}{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if self.current.exists():
                os.replace(self.current, self.previous)
            os.replace(tmp, self.current)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_directory(self.directory)
        return Written(self.current, len(data))

    def load(
        self, restore: Callable[[Any], None], on_failure: Callable[[str, Path, str], None]
    ) -> Path | None:
        """Decode the newest usable checkpoint and hand it to ``restore``; returns its path.

        ``restore`` raises :class:`CheckpointError` (or ValueError/KeyError/TypeError, read as
        "invalid") to reject a checkpoint; it must not have changed anything when it does. Each
        rejected file is reported through ``on_failure(reason, path, message)`` and the next older
        one is tried; a rejected current checkpoint is moved aside (``checkpoint.rejected.embmon``)
        so the next write cannot push the good previous one out. None when nothing was usable.
        """
        self._remove_stale_temporaries()
        for path in (self.current, self.previous):
            if not path.exists():
                continue
            try:
                try:
                    data = path.read_bytes()
                except OSError as exc:
                    raise CheckpointError("unreadable", f"{exc.strerror or exc}") from None
                state = decode(data)
                try:
                    restore(state)
                except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                    raise CheckpointError("invalid", f"{type(exc).__name__}: {exc}") from None
            except CheckpointError as exc:
                on_failure(exc.reason, path, str(exc))
                if path == self.current:
                    with contextlib.suppress(OSError):
                        os.replace(path, self.directory / REJECTED)
                continue
            return path
        return None

    def _remove_stale_temporaries(self) -> None:
        if not self.directory.is_dir():
            return
        for stale in self.directory.glob(f"{_TMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                stale.unlink()
