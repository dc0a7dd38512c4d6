"""Reading ``.npz`` archives that may be damaged or hostile, with nothing allocated before it is checked.

``numpy.load`` trusts an archive: a member's header may declare a shape of 10^12 rows (a
MemoryError), a 2 MB zip may inflate to gigabytes (measured: 1.9 MB to 2.6 GiB of resident memory),
a scalar may be an array (a TypeError where an int was expected). :func:`read_npz` reads the
central directory first and refuses, with one line naming the member, before reading any data:

* a file larger than ``max_bytes``, or members whose uncompressed sizes add up to more;
* a member that is not an ``.npy`` array, or whose header does not parse;
* a member whose header declares more (or fewer) bytes than the member holds;
* a dtype holding Python objects (nothing is ever unpickled), or of a kind or number of dimensions
  the caller did not ask for (:class:`Member`).

Every refusal is an :class:`ArchiveError` (a ``ValueError``). Checkpoints (monitor/storage/checkpoint_format.py)
and references (monitor/drift/references/profile.py) read their archives through it.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

_MAX_HEADER_BYTES = 10_000  # numpy's own default bound on an .npy header
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "c": "complex numbers", "U": "text"}


class ArchiveError(ValueError):
    """An archive that cannot be read safely; the message names the member and the problem."""


@dataclass(frozen=True)
class Member:
    """What one member must be: its number of dimensions (0 a scalar; None any) and the dtype kinds
    allowed (``numpy.dtype.kind`` letters: ``"iu"`` integers, ``"f"`` floats, ``"U"`` text)."""

    ndim: int | tuple[int, ...] | None
    kinds: str
    required: bool = True

    def check(self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        if dtype.kind not in self.kinds:
            wanted = " or ".join(dict.fromkeys(_KIND_NAMES.get(k, k) for k in self.kinds))
            raise ArchiveError(f"member {name!r} holds {dtype} where {wanted} are expected")
        allowed = (self.ndim,) if isinstance(self.ndim, int) else self.ndim
        if allowed is not None and len(shape) not in allowed:
            what = "a scalar" if allowed == (0,) else f"{' or '.join(map(str, allowed))}-dimensional"
            raise ArchiveError(f"member {name!r} has shape {shape}, expected {what}")


def read_npz(
    source: str | os.PathLike[str] | IO[bytes],
    members: Mapping[str, Member],
    *,
    max_bytes: int,
    others: Member | None = None,
    stored_only: bool = False,
) -> dict[str, np.ndarray]:
    """The members of an ``.npz`` archive named in ``members`` (and every other one if ``others``
    says what they must be; otherwise other members are left unread), checked as the module says.

    ``max_bytes`` bounds the file (a path's size, before it is opened) and the members' total
    uncompressed size. ``stored_only``: refuse compressed members (a checkpoint never has any).
    """
    if isinstance(source, (str, os.PathLike)):
        size = os.stat(source).st_size
        if size > max_bytes:
            raise ArchiveError(f"the file is {size} bytes, over the limit of {max_bytes}")
    try:
        with zipfile.ZipFile(source) as archive:
            return _read_members(archive, members, max_bytes, others, stored_only)
    except ArchiveError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, ValueError, NotImplementedError) as exc:
        raise ArchiveError(f"not a readable .npz archive: {type(exc).__name__}: {exc}") from None


def _read_members(
    archive: zipfile.ZipFile, members: Mapping[str, Member], max_bytes: int, others: Member | None, stored_only: bool
) -> dict[str, np.ndarray]:
    infos: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name == info.filename:
            raise ArchiveError(f"member {info.filename!r} is not an .npy array")
        if name in infos:
            raise ArchiveError(f"member {name!r} appears twice")
        infos[name] = info
    missing = [name for name, spec in members.items() if spec.required and name not in infos]
    if missing:
        raise ArchiveError(f"no {missing[0]!r} member")
    wanted = {name: spec for name in infos if (spec := members.get(name, others)) is not None}
    total = sum(infos[name].file_size for name in wanted)
    if total > max_bytes:
        raise ArchiveError(f"its arrays hold {total} bytes uncompressed, over the limit of {max_bytes}")
    if stored_only:
        for name in wanted:
            if infos[name].compress_type != zipfile.ZIP_STORED:
                raise ArchiveError(f"member {name!r} is compressed, which this writer never does")
    return {name: _read_member(archive, infos[name], name, spec) for name, spec in wanted.items()}


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, spec: Member) -> np.ndarray:
    with archive.open(info) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle, max_header_size=_MAX_HEADER_BYTES)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle, max_header_size=_MAX_HEADER_BYTES)
        else:
            raise ArchiveError(f"member {name!r}: .npy format {version} is not read here")
        data_bytes = info.file_size - handle.tell()
    if dtype.hasobject:
        raise ArchiveError(f"member {name!r} holds Python objects (pickles are never loaded)")
    spec.check(name, shape, dtype)
    declared = math.prod(shape) * dtype.itemsize
    if declared != data_bytes:
        raise ArchiveError(
            f"member {name!r} declares shape {shape} of {dtype} ({declared} bytes) but holds {data_bytes}"
        )
    with archive.open(info) as handle:  # read exactly the declared bytes (the CRC is checked at the end)
        return np.lib.format.read_array(handle, allow_pickle=False, max_header_size=_MAX_HEADER_BYTES)
