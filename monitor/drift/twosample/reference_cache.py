"""What a drift cycle computes from the reference sample alone, computed once per reference.

A stream's reference sample stays the same object from one cycle to the next (it changes only
when the reference is rebuilt), while every cycle compares a new window with it. Three pieces of
the tests depend on the reference rows alone:

- ``centred_gram``: the float64 Gram matrix of the reference rows less their mean (``n × n``,
  computed on first use), the reference-reference block of every pairwise distance the held-out
  MMD needs (its median bandwidth, its witness and its statistic,
  :func:`monitor.drift.twosample.mmd.heldout_mmd_from_gram`). Kept only while
  ``n ≤`` :data:`MAX_GRAM_ROWS` (32 MB at 2,048 rows); above it the tests compute as before.
- ``scatter`` and ``total``: ``Rᵀ R`` (``d × d``) and the column sums, the reference's share of
  the pooled scatter matrix whose top eigenvectors are the KS test's ``pca_pooled`` basis
  (:func:`monitor.drift.twosample.ks.pooled_pca_basis`).
- ``rows``, ``mean``, ``centred_rows``, ``centred_squared_norms``: the float64 copy, its mean, and
  the centred rows and their squared norms.

The cache is keyed by the sample *object* (:func:`reference_cache`): a caller that edited a
reference array in place would be served stale pieces (the daemon does not: a new reference
is a new array). An entry goes when its sample is collected; the cache holds the
last :data:`CACHED_REFERENCES` references, so a daemon
with more streams than that recomputes (correct, only slower). numpy only.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict

import numpy as np

MAX_GRAM_ROWS = 2048
CACHED_REFERENCES = 16


class ReferenceCache:
    """The reference-only pieces of a drift cycle (module docstring); the Gram matrix on first use."""

    def __init__(self, reference: np.ndarray, max_gram_rows: int = MAX_GRAM_ROWS):
        rows = np.ascontiguousarray(reference, dtype=np.float64)
        if rows.ndim != 2:
            raise ValueError(f"a reference sample is 2-D (rows, dim); got shape {rows.shape}")
        self.rows = rows
        self.total = rows.sum(axis=0)
        self.scatter = rows.T @ rows
        self.max_gram_rows = max_gram_rows

    @functools.cached_property
    def mean(self) -> np.ndarray:
        return self.total / len(self.rows)

    @functools.cached_property
    def centred_rows(self) -> np.ndarray:
        """The rows less the reference mean (pairwise distances unchanged, dot products small)."""
        return self.rows - self.mean

    @functools.cached_property
    def centred_squared_norms(self) -> np.ndarray:
        return np.einsum("ij,ij->i", self.centred_rows, self.centred_rows)

    @functools.cached_property
    def centred_gram(self) -> np.ndarray | None:
        """The centred rows' Gram matrix in float64, or None above ``max_gram_rows`` rows."""
        if len(self.rows) > self.max_gram_rows:
            return None
        return self.centred_rows @ self.centred_rows.T


_lock = threading.RLock()  # reentrant: a weakref callback may run in a collection inside the lock
_cache: OrderedDict[int, tuple[weakref.ref[np.ndarray], ReferenceCache]] = OrderedDict()


def reference_cache(reference: np.ndarray) -> ReferenceCache:
    """The cached pieces of this reference sample object, computed on first use.

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
            _cache.move_to_end(key)
            return hit[1]
    pieces = ReferenceCache(reference)

    def forget(dead: weakref.ref[np.ndarray]) -> None:  # the sample is gone: its id may be reused
        with _lock:
            if key in _cache and _cache[key][0] is dead:
                del _cache[key]

    with _lock:
        _cache[key] = (weakref.ref(reference, forget), pieces)
        _cache.move_to_end(key)
        while len(_cache) > CACHED_REFERENCES:
            _cache.popitem(last=False)
    return pieces


def clear() -> None:
    """Forget every cached reference (tests, and a reference store that replaces all of them)."""
    with _lock:
        _cache.clear()
