"""Exact k nearest neighbours: one matmul and one top-k per block of documents.

The score matrix of a block is (queries in block) × (documents in block), so memory is bounded
by ``query_block_size × (block_size + k)`` floats whatever the sample size. The running top-k of
each query is merged with every block's top-k.

**Order.** Score descending, ties by document index ascending, exactly: of the documents tied at
the k-th place, the lowest indices are kept, and each selection is put in (score descending,
index ascending) order before merging. A NaN score (a non-finite input vector) ranks as −inf.

**Devices.** numpy on the CPU; torch on a CUDA device (:mod:`monitor.retrieval.probes.knn_torch`,
imported only when the configured device resolves to CUDA, :mod:`monitor.devices`). Both give the
same neighbours in the same order (tested on the CPU; float32 scores can differ in the last bits
where the matrix products sum in a different order).

**Similarities.** ``cosine`` (rows L2-normalised, then the dot product), ``dot`` (inner product)
or ``l2`` (the score is −‖q − d‖², so the nearest document has the highest score).

Examples
--------
>>> docs = np.array([[1, 0], [0, 1], [1, 1], [1, 0]], dtype=np.float32)
>>> result = exact_topk(np.array([[1, 0]], dtype=np.float32), docs, k=3, similarity="dot")
>>> result.indices.tolist(), result.scores.tolist()
([[0, 2, 3]], [[1.0, 1.0, 1.0]])
>>> exact_topk(np.array([[1, 0]], dtype=np.float32), docs, k=2, exclude=np.array([0])).indices.tolist()
[[3, 2]]
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from monitor.devices import use_cuda

logger = logging.getLogger(__name__)

__all__ = ["Neighbours", "exact_topk", "prepare"]

_GROUP = 64  # columns per group for the top-k threshold (:func:`_block_topk`)

Ranked = tuple[Any, Any]
"""``(scores, indices)`` of each row, best first, (score desc, index asc): arrays of one library."""


class BlockOps(Protocol):
    """The array operations of :func:`search_blocks` that differ between numpy and torch."""

    def put(self, rows: np.ndarray) -> Any: ...  # a host array where the search runs
    def get(self, array: Any) -> np.ndarray: ...  # back to the host
    def row_sq(self, rows: Any) -> Any: ...  # squared norm of each row
    def top(self, scores: Any, kk: int) -> Ranked: ...  # each row's top kk
    def merge(self, best: Ranked, block: Ranked, k: int) -> Ranked: ...  # the top k of both


@dataclass(frozen=True)
class Neighbours:
    """``indices`` (Q, k) int64 rows of the document matrix, best first, −1 where there are fewer
    than k documents (or they were excluded); ``scores`` (Q, k) float32, −inf there."""

    indices: np.ndarray
    scores: np.ndarray


def prepare(vectors: np.ndarray, similarity: str) -> np.ndarray:
    """float32 C-contiguous rows, L2-normalised for ``cosine``."""
    if similarity not in ("cosine", "dot", "l2"):
        raise ValueError(f"similarity must be cosine, dot or l2, got {similarity!r}")
    out: np.ndarray = np.ascontiguousarray(vectors, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {out.shape}")
    if similarity == "cosine" and out.size:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.where(norms > 0, norms, 1.0).astype(np.float32)
    return out


def exact_topk(
    queries: np.ndarray,
    documents: np.ndarray,
    k: int,
    *,
    similarity: str = "cosine",
    block_size: int = 8192,
    query_block_size: int = 1024,
    device: str | None = "cpu",
    exclude: np.ndarray | None = None,
    check: Callable[[], None] | None = None,
) -> Neighbours:
    """The exact top ``k`` documents of each query.

    ``exclude`` (Q,) holds one document index per query to leave out (the query itself, when
    queries are documents), or −1 for none. ``check`` is called between blocks; it may raise to
    abandon the search (a probe's deadline). ``device``: numpy on the CPU, torch on a CUDA device
    (:mod:`monitor.devices`; :mod:`monitor.retrieval.probes.knn_torch`, imported only then).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if block_size < 1 or query_block_size < 1:
        raise ValueError("block sizes must be positive")
    q = prepare(queries, similarity)
    d = prepare(documents, similarity)
    if q.shape[0] and d.shape[0] and q.shape[1] != d.shape[1]:
        raise ValueError(f"queries have dimension {q.shape[1]} but documents {d.shape[1]}")
    n_queries, n_docs = q.shape[0], d.shape[0]
    if exclude is not None:
        exclude = np.asarray(exclude, dtype=np.int64)
        if exclude.shape != (n_queries,):
            raise ValueError(f"exclude must have one entry per query, got shape {exclude.shape}")
    indices = np.full((n_queries, k), -1, dtype=np.int64)
    scores = np.full((n_queries, k), -np.inf, dtype=np.float32)
    if n_queries == 0 or n_docs == 0:
        return Neighbours(indices, scores)
    for q_start, q_stop, best_v, best_i in search_blocks(
        q, d, k, block_ops(device), similarity=similarity, block_size=block_size,
        query_block_size=query_block_size, exclude=exclude, check=check,
    ):
        width = best_v.shape[1]
        scores[q_start:q_stop, :width] = best_v
        indices[q_start:q_stop, :width] = best_i
    indices[~np.isfinite(scores)] = -1  # excluded documents (the only non-finite scores)
    scores[indices < 0] = -np.inf
    return Neighbours(indices, scores)


def block_ops(device: str | None) -> BlockOps:
    """numpy on the CPU; torch on a CUDA device (imported only then, :mod:`monitor.devices`)."""
    if use_cuda(device):
        from monitor.retrieval.probes.knn_torch import TorchBlocks

        return TorchBlocks("cuda")
    return NumpyBlocks()


def search_blocks(
    q: np.ndarray,
    d: np.ndarray,
    k: int,
    ops: BlockOps,
    *,
    similarity: str,
    block_size: int,
    query_block_size: int,
    exclude: np.ndarray | None,
    check: Callable[[], None] | None,
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Each query block's ``(q_start, q_stop, scores, indices)``: its top ``k`` over every document
    block (prepared float32 rows), with ``ops``' arrays (the arithmetic below reads the same in
    numpy and torch)."""
    n_queries, n_docs = q.shape[0], d.shape[0]
    docs = ops.put(d)
    doc_sq = ops.row_sq(docs) if similarity == "l2" else None
    for q_start in range(0, n_queries, query_block_size):
        q_stop = min(q_start + query_block_size, n_queries)
        qb = ops.put(q[q_start:q_stop])
        q_sq = ops.row_sq(qb)[:, None] if similarity == "l2" else None
        ex = None if exclude is None else ops.put(exclude[q_start:q_stop])
        best: Ranked | None = None
        for d_start in range(0, n_docs, block_size):
            if check is not None:
                check()
            d_stop = min(d_start + block_size, n_docs)
            s = qb @ docs[d_start:d_stop].T
            if doc_sq is not None and q_sq is not None:
                s = 2.0 * s - doc_sq[None, d_start:d_stop] - q_sq
            if ex is not None:
                local = ex - d_start
                hit = (local >= 0) & (local < d_stop - d_start)
                s[hit, local[hit]] = -math.inf
            nan = s != s
            if nan.any():
                s[nan] = -math.inf
            v, i = ops.top(s, min(k, d_stop - d_start))
            block = (v, i + d_start)
            best = block if best is None else ops.merge(best, block, k)
        assert best is not None
        yield q_start, q_stop, ops.get(best[0]), ops.get(best[1])


class NumpyBlocks:
    """:class:`BlockOps` on the CPU (numpy); the CUDA twin is
    :class:`~monitor.retrieval.probes.knn_torch.TorchBlocks`."""

    def put(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def get(self, array: np.ndarray) -> np.ndarray:
        return array

    def row_sq(self, rows: np.ndarray) -> np.ndarray:
        return np.einsum("ij,ij->i", rows, rows)  # no (rows, dim) temporary

    def top(self, scores: np.ndarray, kk: int) -> Ranked:
        return _block_topk(scores, kk)

    def merge(self, best: Ranked, block: Ranked, k: int) -> Ranked:
        v, i = _ordered(np.concatenate([best[0], block[0]], axis=1), np.concatenate([best[1], block[1]], axis=1))
        return v[:, :k], i[:, :k]


def _block_topk(s: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``kk`` of each row of ``s``, ordered by (score desc, column asc), ties resolved exactly.

    A cheap threshold first: the kk-th largest of the row's group maxima (groups of
    ``_GROUP`` columns). kk groups reach it, so the row's kk-th largest score does too, and every
    score that can be in the top kk (ties at the k-th place included) is at or above it. Only
    those candidates, a few dozen per row in real data, are sorted.
    """
    n_rows, width = s.shape
    group_max = np.maximum.reduceat(s, np.arange(0, width, _GROUP), axis=1)
    groups = group_max.shape[1]
    if groups > kk:
        threshold = np.partition(group_max, groups - kk, axis=1)[:, groups - kk, None]
    else:
        threshold = np.full((n_rows, 1), -np.inf, dtype=s.dtype)
    rows, cols = np.nonzero(s >= threshold)
    values = s[rows, cols]
    order = np.lexsort((cols, -values, rows))  # by row, then score desc, then column asc
    counts = np.bincount(rows, minlength=n_rows)  # at least kk each
    first = np.cumsum(counts) - counts
    take = order[(first[:, None] + np.arange(kk)).ravel()]
    return values[take].reshape(n_rows, kk), cols[take].reshape(n_rows, kk)


def _ordered(values: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each row by score descending, then index ascending."""
    order = np.lexsort((index, -values), axis=1)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(index, order, axis=1)
