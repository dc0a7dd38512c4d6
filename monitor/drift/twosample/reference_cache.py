"""What a drift cycle computes from the reference sample alone, computed once per reference.

A stream's reference sample stays the same object from one cycle to the next (it changes only
when the reference is rebuilt), while every cycle compares a new window with it. Three pieces of
the tests depend on the reference rows alone:

- ``centred_gram``: the float64 Gram matrix of the reference rows less their mean (``n × n``,
  computed on first use), the reference-reference block of every pairwise distance the held-out
  MMD needs (its median bandwidth, its witness and its statistic,
  :func:`monitor.drift.twosample.mmd.heldout_mmd_from_gram`). Kept only while
  ``n ≤`` :data:`MAX_GRAM_ROWS` (32 MB at 2,048 rows); above it the tests compute as before.
- ``scatter`` and ``total``: ``(R - r̄)ᵀ (R - r̄)`` (``d × d``, centred on the reference's own
  mean, so that a column with a large offset loses no precision to cancellation) and the column
  sums, the reference's share of the pooled scatter matrix whose top eigenvectors are the KS
  test's ``pca_pooled`` basis (:class:`monitor.drift.twosample.spectrum.PooledScatter`).
- ``mean``, ``centred_rows``, ``centred_squared_norms``: the reference mean, and the float64
  rows less it and their squared norms.

The cache is keyed by the sample *object* (:func:`reference_cache`): a caller that edited a
reference array in place would be served stale pieces (the daemon does not: a new reference
is a new array). An entry lives as long as its sample and no longer. The entries together stay
under :data:`CACHE_BYTES` (their float64 rows, Gram and scatter matrices, counted before they
are computed): a reference that would not fit gets no entry and its tests compute as before, so
a daemon with more streams than fit never evicts and recomputes one stream's pieces for another's
(round-robin use would make every lookup a miss). numpy only.
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

MAX_GRAM_ROWS = 2048
CACHE_BYTES = 256 * 2**20


class ReferenceCache:
    """The reference-only pieces of a drift cycle (module docstring); the Gram matrix on first use."""

    def __init__(self, reference: np.ndarray, max_gram_rows: int = MAX_GRAM_ROWS):
        rows = np.asarray(reference, dtype=np.float64)
        if rows.ndim != 2:
            raise ValueError(f"a reference sample is 2-D (rows, dim); got shape {rows.shape}")
        self.size = len(rows)
        self.total = rows.sum(axis=0)
        self.mean = self.total / max(self.size, 1)
        self.centred_rows = rows - self.mean  # pairwise distances unchanged, dot products small
        self.scatter = self.centred_rows.T @ self.centred_rows
        self.max_gram_rows = max_gram_rows

    @staticmethod
    def bytes_for(rows: int, dim: int, max_gram_rows: int = MAX_GRAM_ROWS) -> int:
        """What the pieces of a ``rows × dim`` reference hold, float64 (the Gram matrix included)."""
        gram = rows * rows if rows <= max_gram_rows else 0
        return 8 * (rows * dim + dim * dim + 2 * dim + rows + gram)

    @functools.cached_property
    def centred_squared_norms(self) -> np.ndarray:
        return np.einsum("ij,ij->i", self.centred_rows, self.centred_rows)

    @functools.cached_property
    def centred_gram(self) -> np.ndarray | None:
        """The centred rows' Gram matrix in float64, or None above ``max_gram_rows`` rows."""
        if self.size > self.max_gram_rows:
            return None
        return self.centred_rows @ self.centred_rows.T


_lock = threading.RLock()  # reentrant: a weakref callback may run in a collection inside the lock
_cache: dict[int, tuple[weakref.ref[np.ndarray], ReferenceCache, int]] = {}


def reference_cache(reference: np.ndarray) -> ReferenceCache | None:
    """The cached pieces of this reference sample object, computed on first use; None when they
    would not fit in :data:`CACHE_BYTES` beside the others (module docstring).

    Examples
    --------
    >>> ref = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    >>> reference_cache(ref) is reference_cache(ref)
    True
    >>> centred = ref.astype(np.float64) - ref.astype(np.float64).mean(axis=0)
    >>> np.allclose(reference_cache(ref).centred_gram, centred @ centred.T)
    True
    """
    key = id(reference)
    with _lock:
        hit = _cache.get(key)
        if hit is not None and hit[0]() is reference:
            return hit[1]
        size = ReferenceCache.bytes_for(*np.shape(reference)) if np.ndim(reference) == 2 else 0
        if sum(entry[2] for entry in _cache.values()) + size > CACHE_BYTES:
            return None
    pieces = ReferenceCache(reference)

    def forget(dead: weakref.ref[np.ndarray]) -> None:  # the sample is gone: its id may be reused
        with _lock:
            if key in _cache and _cache[key][0] is dead:
                del _cache[key]

    with _lock:
        _cache[key] = (weakref.ref(reference, forget), pieces, size)
    return pieces


def clear() -> None:
    """Forget every cached reference (tests, and a reference store that replaces all of them)."""
    with _lock:
        _cache.clear()
