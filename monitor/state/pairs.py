"""Alignment's positive pairs: the two halves of a pair meet by ``pair_id`` in a bounded table.

A window (:mod:`monitor.state.window`) keeps one matcher across its sub-windows, so a pair whose
halves arrive in different sub-windows is still matched; the intrinsic metrics build one over a
sample when they recompute alignment from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.state import checks

__all__ = ["PositivePairMatcher"]


class PositivePairMatcher:
    """Matches the two halves of positive pairs by ``pair_id`` and sums ‖u₁ − u₂‖^α.

    The first record seen with a pair id waits (as a float32 unit vector) until a second record
    with the same id arrives; then the pair's distance is returned and the id is forgotten, so a
    third record with that id starts a new pair. At most ``max_pending`` halves wait; beyond
    that the oldest are evicted and counted in ``evicted``.

    Examples
    --------
    >>> matcher = PositivePairMatcher(max_pending=10, alpha=2.0)
    >>> units = np.eye(2)
    >>> matcher.match(units[[0]], ["q1"])
    (0.0, 0)
    >>> total, pairs = matcher.match(units[[1]], ["q1"])
    >>> round(total, 6), pairs
    (2.0, 1)
    """

    def __init__(self, max_pending: int, alpha: float) -> None:
        if int(max_pending) < 0:
            raise ValueError(f"max_pending_pairs must be non-negative, got {max_pending!r}")
        if not alpha > 0:
            raise ValueError(f"alignment_alpha must be positive, got {alpha!r}")
        self.max_pending = int(max_pending)
        self.alpha = float(alpha)
        self.evicted = 0
        # pair id -> waiting unit vector (float32), oldest first (dicts keep insertion order).
        self._pending: dict[str, np.ndarray | int] = {}

    @property
    def pending(self) -> int:
        """Number of first halves waiting for their partner."""
        return len(self._pending)

    def match(self, unit_vectors: np.ndarray, pair_ids: Sequence[str]) -> tuple[float, int]:
        """Feed rows (unit vectors) in stream order; return (Σ distance^α, pairs completed)."""
        if len(pair_ids) != len(unit_vectors):
            raise ValueError(f"got {len(pair_ids)} pair ids for {len(unit_vectors)} rows")
        firsts: list[np.ndarray | int] = []
        seconds: list[int] = []
        added: list[str] = []
        for row, pair_id in enumerate(pair_ids):
            partner = self._pending.pop(pair_id, None)
            if partner is None:
                self._pending[pair_id] = row  # a row of this batch, copied below if it stays
                added.append(pair_id)
            else:
                firsts.append(partner)
                seconds.append(row)

        while len(self._pending) > self.max_pending:
            del self._pending[next(iter(self._pending))]
            self.evicted += 1
        for pair_id in added:
            waiting = self._pending.get(pair_id)
            if isinstance(waiting, int):
                self._pending[pair_id] = np.array(unit_vectors[waiting], dtype=np.float32)

        if not seconds:
            return 0.0, 0
        first_rows = np.stack(
            [unit_vectors[p] if isinstance(p, int) else p for p in firsts]
        ).astype(np.float64)
        diff = first_rows - np.asarray(unit_vectors[seconds], dtype=np.float64)
        sq_dist = np.einsum("ij,ij->i", diff, diff)
        return float(np.sum(sq_dist ** (self.alpha / 2.0))), len(seconds)

    def state_dict(self) -> dict[str, Any]:
        ids = list(self._pending)
        vectors = [self._pending[i] for i in ids]
        return {
            "max_pending": self.max_pending,
            "alpha": self.alpha,
            "evicted": self.evicted,
            "ids": ids,
            "vectors": np.stack(vectors) if vectors else None,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], dim: int | None = None) -> PositivePairMatcher:
        """Rebuild from ``state_dict()`` output; waiting halves must be finite ``dim``-vectors (any
        one dimension when ``dim`` is None). ``ValueError`` names what does not fit."""
        matcher = cls(checks.count(state["max_pending"], "max_pending_pairs"), checks.finite(state["alpha"], "alpha"))
        matcher.evicted = checks.count(state["evicted"], "evicted pair halves")
        ids = list(state["ids"])
        if not all(isinstance(i, str) for i in ids) or len(set(ids)) != len(ids) or len(ids) > matcher.max_pending:
            raise checks.InvalidState(f"{len(ids)} pending pair ids are not distinct strings within max_pending_pairs")
        if ids:
            vectors = state["vectors"]
            width = getattr(vectors, "shape", (0, 0))[-1] if dim is None else dim
            vectors = checks.finite_array(vectors, (len(ids), width), "pending pair vectors", np.float32)
            matcher._pending = {pair_id: vectors[i].copy() for i, pair_id in enumerate(ids)}
        return matcher
