"""A bounded uniform sample of a stream of vectors (reservoir sampling, Algorithm R).

Pairwise metrics such as uniformity cost O(m²·d), so they run on a sample. A reservoir keeps a
sample without replacement that is uniform over *everything* added so far, in fixed memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from monitor.state import checks

logger = logging.getLogger(__name__)

__all__ = ["Reservoir", "generator_from_state", "uniform_sample"]


def generator_from_state(state: dict[str, Any]) -> np.random.Generator:
    """Rebuild a ``numpy.random.Generator`` from ``rng.bit_generator.state``."""
    bit_generator_cls = getattr(np.random, str(state["bit_generator"]), None)
    if bit_generator_cls is None or not isinstance(bit_generator_cls, type):
        raise ValueError(f"unknown bit generator {state['bit_generator']!r}")
    bit_generator = bit_generator_cls()
    bit_generator.state = state
    return np.random.Generator(bit_generator)


class Reservoir:
    """Uniform sample without replacement of at most ``capacity`` rows, with their ids.

    Algorithm R, vectorised per batch: the row with global index t (0-based) is kept with
    probability capacity/(t + 1) and replaces a uniformly chosen slot. One batch draws all its
    slot numbers at once (``j ~ U{0..t}``, kept when ``j < capacity``) and applies the
    replacements in stream order, so the result is exactly that of the sequential algorithm
    while a mostly-rejected batch costs one vectorised draw and no Python loop.

    Parameters
    ----------
    capacity : int
        Maximum number of rows kept (0 keeps nothing).
    dim : int
        Row dimension.
    rng : numpy.random.Generator
        Source of randomness; its state is part of ``state_dict``.

    Notes
    -----
    Slot order is not random (while filling, slot t holds row t), so take a random subset
    (``rng.choice``), not a prefix, when fewer rows are needed.

    Examples
    --------
    >>> rng = np.random.default_rng(7)
    >>> res = Reservoir(capacity=4, dim=2, rng=rng)
    >>> res.add(np.ones((3, 2), dtype=np.float32), ids=["a", "b", "c"])
    3
    >>> accepted = res.add(np.zeros((100, 2), dtype=np.float32))
    >>> res.seen, res.vectors.shape
    (103, (4, 2))
    """

    def __init__(self, capacity: int, dim: int, rng: np.random.Generator) -> None:
        if int(capacity) < 0:
            raise ValueError(f"capacity must be non-negative, got {capacity!r}")
        if int(dim) < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not isinstance(rng, np.random.Generator):
            raise TypeError("rng must be a numpy.random.Generator")
        self.capacity = int(capacity)
        self.dim = int(dim)
        self.rng = rng
        self.seen = 0
        self._vectors = np.empty((self.capacity, self.dim), dtype=np.float32)
        self._ids = np.full(self.capacity, None, dtype=object)
        # While shared: held row i is _shared[_shared_rows[i]] when that index is >= 0, else
        # _rest[-_shared_rows[i] - 1] (the rows the sample did not take, privately held).
        self._shared: np.ndarray | None = None
        self._shared_rows: np.ndarray | None = None
        self._rest: np.ndarray = np.empty((0, self.dim), dtype=np.float32)

    @property
    def size(self) -> int:
        """Number of rows currently held: min(seen, capacity)."""
        return min(self.seen, self.capacity)

    @property
    def vectors(self) -> np.ndarray:
        """The held rows, float32 (size, dim); a view, valid until the next ``add`` (a copy
        while the rows are shared)."""
        if self._shared is not None:
            return self.take(np.arange(self.size))
        return self._vectors[: self.size]

    def take(self, slots: np.ndarray) -> np.ndarray:
        """A copy of the held rows at ``slots`` (one gather, also while shared)."""
        if self._shared is None:
            return self._vectors[slots]
        assert self._shared_rows is not None
        where = self._shared_rows[slots]
        if self._rest.shape[0] == 0:
            return self._shared[where]
        out = np.empty((len(where), self.dim), dtype=np.float32)
        inside = where >= 0
        out[inside] = self._shared[where[inside]]
        out[~inside] = self._rest[-where[~inside] - 1]
        return out

    def share(self, storage: np.ndarray, rows: np.ndarray) -> None:
        """Hold the held rows in ``storage``, an array owned elsewhere that nobody writes to (the
        published sample), as far as it has them, and free the private copy.

        ``rows[i]`` is where held row i is in ``storage``, or -1 where the storage lacks it: those
        rows are kept in a private array of their own. A window shares the rows of sub-windows that
        take no more records with the sample it published, so a row is in memory once, not twice,
        whether the sample took all of a sub-window's rows or some. Adding rows later copies them
        back first.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if rows.shape != (self.size,) or storage.ndim != 2 or storage.shape[1] != self.dim:
            raise ValueError("shared rows do not match the reservoir's size and dimension")
        missing = np.flatnonzero(rows < 0)
        rest = self.take(missing)  # before re-pointing: from the current storage, shared or not
        rows = rows.copy()
        rows[missing] = -np.arange(1, len(missing) + 1)
        self._shared, self._shared_rows, self._rest = storage, rows, rest
        self._vectors = np.empty((0, self.dim), dtype=np.float32)

    @property
    def shared(self) -> bool:
        return self._shared is not None

    def _own(self) -> None:
        """Copy shared rows back into private storage (before a write)."""
        if self._shared is not None:
            held = self.vectors
            self._vectors = np.empty((self.capacity, self.dim), dtype=np.float32)
            self._vectors[: held.shape[0]] = held
            self._shared = self._shared_rows = None
            self._rest = np.empty((0, self.dim), dtype=np.float32)

    @property
    def ids(self) -> tuple[str | None, ...]:
        """Ids of the held rows, aligned with ``vectors`` (``None`` where a row had none)."""
        return tuple(self._ids[: self.size])

    def add(self, vectors: np.ndarray, ids: Sequence[str | None] | None = None) -> int:
        """Offer a batch of rows; return how many entered the sample.

        A row that entered and was replaced later in the same batch still counts, so the
        return value can exceed ``capacity`` (it is Algorithm R's acceptance count).
        """
        x = np.asarray(vectors)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {x.shape}")
        n = x.shape[0]
        if ids is not None and len(ids) != n:
            raise ValueError(f"got {len(ids)} ids for {n} rows")
        if n == 0:
            return 0
        self._own()

        first = self.seen
        self.seen += n
        accepted = 0

        # Phase 1: rows that land in still-empty slots are always kept.
        fill = max(0, min(n, self.capacity - first))
        if fill:
            self._vectors[first : first + fill] = x[:fill]
            self._ids[first : first + fill] = list(ids[:fill]) if ids is not None else None
            accepted += fill
        if fill == n:
            return accepted

        # Phase 2: row with global index t draws j ~ U{0..t}; j < capacity replaces slot j.
        rest = np.arange(fill, n)
        slots = self.rng.integers(0, first + rest + 1)
        keep = slots < self.capacity
        rows, slots = rest[keep], slots[keep]
        if rows.size == 0:
            return accepted
        # A slot hit twice keeps the later row, as the sequential algorithm would.
        last_rows, last_slots = _last_write_per_slot(rows, slots)
        self._vectors[last_slots] = x[last_rows]
        if ids is None:
            self._ids[last_slots] = None
        else:
            self._ids[last_slots] = [ids[i] for i in last_rows]
        return accepted + int(rows.size)

    def state_dict(self) -> dict[str, Any]:
        """Held rows, ids, counters and the RNG state (so sampling continues identically)."""
        return {
            "capacity": self.capacity,
            "dim": self.dim,
            "seen": self.seen,
            "vectors": self.vectors.copy(),
            "ids": list(self.ids),
            "rng_state": self.rng.bit_generator.state,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Reservoir:
        """Rebuild from ``state_dict()`` output (``ValueError`` on a value that does not fit)."""
        capacity = checks.count(state["capacity"], "reservoir capacity")
        dim = checks.integer(state["dim"], "reservoir dim", 1)
        reservoir = cls(capacity, dim, generator_from_state(state["rng_state"]))
        seen = checks.count(state["seen"], "reservoir seen")
        size = min(seen, reservoir.capacity)
        vectors = checks.finite_array(state["vectors"], (size, reservoir.dim), "reservoir vectors", np.float32)
        ids = list(state["ids"])
        if len(ids) != size or not all(i is None or isinstance(i, str) for i in ids):
            raise checks.InvalidState(f"reservoir holds {len(ids)} ids for {size} rows, or ids that are not strings")
        reservoir.seen = seen
        reservoir._vectors[:size] = vectors
        reservoir._ids[:size] = ids if size else None
        return reservoir

    def __repr__(self) -> str:
        return f"Reservoir(capacity={self.capacity}, dim={self.dim}, seen={self.seen})"


def _last_write_per_slot(rows: np.ndarray, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each distinct slot, the last row (in stream order) written to it."""
    reversed_slots = slots[::-1]
    unique_slots, first_in_reversed = np.unique(reversed_slots, return_index=True)
    return rows[::-1][first_in_reversed], unique_slots


def uniform_sample(
    reservoirs: Sequence[Reservoir],
    dim: int,
    rng: np.random.Generator,
    share: Sequence[bool] | None = None,
    limit: int | None = None,
) -> tuple[np.ndarray, tuple[str | None, ...]]:
    """One sample of the union of several reservoirs' streams, every record equally likely.

    Reservoir j saw n_j records and holds r_j = min(n_j, capacity) of them, each with
    probability r_j/n_j; so p = min_j r_j/n_j and reservoir j contributes a uniform subset of
    p·n_j of its rows (randomised rounding keeps the expectation exact). The pieces may be the
    sub-windows of one window or those of several replicas (the reducer merges those).
    Returns the rows in random order (any prefix is itself such a sample) and their ids.
    A reservoir marked in ``share`` (one that takes no more records: a closed sub-window) keeps
    the rows the sample took only inside the returned sample (and the others on their own), which
    saves a copy of them.
    ``limit`` lowers p to at most limit/Σn_j, so the sample holds about ``limit`` rows (exactly
    in expectation) and stays uniform.

    >>> rng = np.random.default_rng(0)
    >>> a, b = Reservoir(4, 2, rng), Reservoir(4, 2, rng)
    >>> _ = a.add(np.ones((8, 2), dtype=np.float32)); _ = b.add(np.zeros((2, 2), dtype=np.float32))
    >>> sample, ids = uniform_sample([a, b], 2, np.random.default_rng(1))
    >>> len(sample)  # p = min(4/8, 2/2) = 0.5: 4 rows of a, 1 of b
    5
    """
    seen = np.array([r.seen for r in reservoirs], dtype=np.int64)
    held = np.array([r.size for r in reservoirs], dtype=np.int64)
    if seen.sum() == 0 or held.sum() == 0:
        return np.empty((0, dim), dtype=np.float32), ()
    nonempty = seen > 0
    p = float(np.min(held[nonempty] / seen[nonempty]))
    if limit is not None:
        p = min(p, limit / float(seen.sum()))
    share = share if share is not None else [False] * len(reservoirs)
    parts: list[np.ndarray] = []
    ids: list[str | None] = []
    shared: list[tuple[Reservoir, np.ndarray, int]] = []  # (shareable reservoir, rows taken, their offset)
    total = 0
    for reservoir, n_j, r_j, shareable in zip(reservoirs, seen, held, share, strict=True):
        if n_j == 0:
            continue
        take = _randomised_round(p * n_j, int(r_j), rng)
        chosen = np.sort(rng.choice(int(r_j), size=take, replace=False))
        if shareable:
            shared.append((reservoir, chosen, total))
        parts.append(reservoir.take(chosen))
        total += len(parts[-1])
        reservoir_ids = reservoir.ids
        ids.extend(reservoir_ids[i] for i in chosen)
    order = rng.permutation(total)
    sample = np.concatenate(parts)[order]
    position = np.empty(total, dtype=np.int64)
    position[order] = np.arange(total)
    for reservoir, chosen, start in shared:
        rows = np.full(reservoir.size, -1, dtype=np.int64)
        rows[chosen] = position[start : start + len(chosen)]
        reservoir.share(sample, rows)
    return sample, tuple(ids[i] for i in order)


def _randomised_round(value: float, ceiling: int, rng: np.random.Generator) -> int:
    """floor(value) plus a Bernoulli(frac) draw, so the expectation is exactly ``value``."""
    nearest = round(value)
    if abs(value - nearest) < 1e-9:
        return min(int(nearest), ceiling)
    base = math.floor(value)
    return min(base + int(rng.random() < value - base), ceiling)
