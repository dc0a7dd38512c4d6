"""The first N records of a stream as its reference, built on the ingest thread in bounded memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.drift.references.profile import ReferenceProfile
from monitor.state import checks
from monitor.state.reservoir import Reservoir


class FirstRecords:
    """Builds a reference from the first ``target`` records of a stream, in bounded memory.

    Keeps the exact float64 sum (so the centroid is exact over all ``target`` records) and a
    uniform sample of at most ``capacity`` of them (a :class:`~monitor.state.reservoir.Reservoir`),
    with the records' ids (the regions' exemplars name them).

    >>> builder = FirstRecords(target=5, dim=2, capacity=3, seed=0)
    >>> builder.add(np.ones((4, 2), dtype=np.float32)), builder.done
    (4, False)
    >>> builder.add(np.ones((4, 2), dtype=np.float32)), builder.done
    (1, True)
    >>> profile = builder.profile(captured_at=1.0)
    >>> profile.count, profile.sample.shape, profile.source
    (5, (3, 2), 'first 5 records')
    """

    def __init__(self, target: int, dim: int, capacity: int, seed: int = 0):
        self.target = int(target)
        self.dim = int(dim)
        self.reservoir = Reservoir(min(int(capacity), self.target), self.dim, np.random.default_rng(seed))
        self.vector_sum = np.zeros(self.dim, dtype=np.float64)

    @property
    def seen(self) -> int:
        return self.reservoir.seen

    @property
    def done(self) -> bool:
        return self.seen >= self.target

    def add(self, vectors: np.ndarray, ids: Sequence[str | None] | None = None) -> int:
        """Take rows (and their ids) until ``target`` is reached; returns how many rows of ``vectors`` were used."""
        take = max(0, min(len(vectors), self.target - self.seen))
        if take:
            rows = vectors[:take]
            self.reservoir.add(rows, None if ids is None else ids[:take])
            self.vector_sum += rows.sum(axis=0, dtype=np.float64)
        return take

    def profile(self, captured_at: float) -> ReferenceProfile:
        if not self.done:
            raise ValueError(f"only {self.seen} of {self.target} records so far")
        return ReferenceProfile(
            sample=self.reservoir.vectors.copy(), centroid=self.vector_sum / self.seen, count=self.seen,
            captured_at=captured_at, source=f"first {self.target} records", sample_ids=self.reservoir.ids,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target, "reservoir": self.reservoir.state_dict(), "vector_sum": self.vector_sum.copy()}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> FirstRecords:
        reservoir = Reservoir.from_state_dict(dict(state["reservoir"]))
        builder = cls(checks.integer(state["target"], "first-records target", 1), reservoir.dim, reservoir.capacity)
        vector_sum = checks.finite_array(np.asarray(state["vector_sum"]), (reservoir.dim,), "first-records vector sum")
        if reservoir.seen > builder.target:
            raise ValueError("first-records state is inconsistent")
        builder.reservoir = reservoir
        builder.vector_sum = vector_sum.copy()
        return builder
