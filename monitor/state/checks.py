"""Checks of restored state values: what a checkpoint or a replica's partial may hold.

A state that passed its checksum can still hold values no run of the daemon produces (a counter
of -1000, a NaN sum, an array of another dimension, an offset of 2^70); once installed they are
exported or stall ingest. Every ``from_state_dict`` reads its numbers through these, which raise
:class:`InvalidState` (a ``ValueError``) naming the field, so a restore refuses the whole state
instead. A state written under other settings raises a plain ``ValueError`` (incompatible, not
invalid).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INT64_MAX = 2**63 - 1


class InvalidState(ValueError):
    """A restored value that no run of the daemon produces."""


def integer(value: Any, what: str, low: int = 0, high: int = INT64_MAX) -> int:
    """``value`` as an int in ``[low, high]`` (an int, not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidState(f"{what} must be an integer, got {type(value).__name__}")
    number = int(value)
    if not low <= number <= high:
        raise InvalidState(f"{what} is {number}, outside [{low}, {high}]")
    return number


def count(value: Any, what: str) -> int:
    """A non-negative int64 (a counter, a size)."""
    return integer(value, what)


def finite(value: Any, what: str, low: float = -math.inf) -> float:
    """``value`` as a finite float, at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidState(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < low:
        raise InvalidState(f"{what} is {number}, expected a finite number" + (f" >= {low}" if low > -math.inf else ""))
    return number


def probability(value: Any, what: str) -> float:
    """A p-value, level or share: finite and in [0, 1]."""
    number = finite(value, what, low=0.0)
    if number > 1.0:
        raise InvalidState(f"{what} is {number}, outside [0, 1]")
    return number


def finite_array(value: Any, shape: tuple[int, ...], what: str, dtype: type = np.float64) -> np.ndarray:
    """``value`` as a ``dtype`` array of exactly ``shape`` with only finite entries."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu":
        raise InvalidState(f"{what} must be a numeric array, got {type(value).__name__}")
    if value.shape != shape:
        raise InvalidState(f"{what} has shape {value.shape}, expected {shape}")
    array: np.ndarray = np.asarray(value, dtype=dtype)
    if not np.isfinite(array).all():
        raise InvalidState(f"{what} holds NaN or infinity")
    return array
