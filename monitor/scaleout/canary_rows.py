"""Canary arrivals as a replica publishes them: inside the sub-window partial they were counted in.

Scaled out, the reducer compares canaries with their pins (:mod:`monitor.scaleout.canaries`): it
holds the pins, so first sightings, ``pins_file`` and re-pins have one authority, as in one
daemon. A replica only forwards what arrived: each canary record's vector (float32, as decoded),
its id, its arrival time and a sequence number, filed under the (model, stream, sub-window) whose
exact statistics counted the record. So the arrivals travel in the sub-window partial itself
(key ``canaries`` of the partial's ``subwindow``), re-sent, superseded, tombstoned and bound to
the manifest exactly as that sub-window is, and the reducer counts each arrival exactly once
where the window statistics count each record once (docs/deployment.md, "Canaries").

The sequence number is ``max(previous + 1, arrival time in ns)``, restored with the replica's
checkpoint: a replica's arrivals are numbered in order across restarts (a restart restores the
checkpoint its newest publication names, and later arrivals are numbered after it), so the
reducer counts an arrival when its number is above the highest it counted for that replica.
A partial written before this existed has no ``canaries`` key and reads as none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_ARRIVALS = 10_000  # per sub-window partial: canaries arrive on a schedule, a flood is cut


@dataclass(frozen=True)
class CanaryRows:
    """Canary arrivals of one sub-window of one (model, stream), in arrival order."""

    seq: np.ndarray  # int64 (n,), strictly increasing
    times: np.ndarray  # float64 (n,), the replica's processing time (unix seconds)
    ids: tuple[str, ...]
    vectors: np.ndarray  # float32 (n, d)

    def __len__(self) -> int:
        return len(self.ids)

    def state_dict(self) -> dict[str, Any]:
        return {"seq": self.seq.copy(), "times": self.times.copy(), "ids": list(self.ids),
                "vectors": self.vectors.copy()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], dim: int) -> CanaryRows:
        """Checked rows (``ValueError`` on anything a replica could not have written)."""
        seq = np.asarray(state["seq"])
        times = np.asarray(state["times"])
        ids = state["ids"]
        vectors = np.asarray(state["vectors"])
        n = len(ids)
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids) or n > MAX_ARRIVALS:
            raise ValueError(f"canary ids must be a list of at most {MAX_ARRIVALS} non-empty strings")
        if seq.dtype.kind not in "iu" or seq.shape != (n,) or (n > 1 and not np.all(np.diff(seq) > 0)):
            raise ValueError("canary sequence numbers must be increasing integers, one per id")
        if times.dtype.kind != "f" or times.shape != (n,) or not np.all(np.isfinite(times)):
            raise ValueError("canary arrival times must be finite floats, one per id")
        if vectors.dtype != np.float32 or vectors.shape != (n, dim) or not np.all(np.isfinite(vectors)):
            raise ValueError(f"canary vectors must be finite float32 of shape ({n}, {dim})")
        if n and not np.all(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64) > 0):
            raise ValueError("a canary vector is zero")
        return cls(seq.astype(np.int64), times.astype(np.float64), tuple(ids), vectors)

    @classmethod
    def of(cls, rows: Sequence[tuple[int, float, str, np.ndarray]], dim: int) -> CanaryRows:
        """From (seq, time, id, vector) tuples."""
        vectors = np.array([r[3] for r in rows], dtype=np.float32).reshape(len(rows), dim)
        return cls(np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.float64),
                   tuple(r[2] for r in rows), vectors)


def next_seq(previous: int, now: float) -> int:
    """The sequence number of an arrival at ``now`` after ``previous`` (module docstring).

    >>> next_seq(0, 2.5), next_seq(2_500_000_000, 2.5)
    (2500000000, 2500000001)
    """
    return max(previous + 1, int(math.floor(now * 1e9)))
