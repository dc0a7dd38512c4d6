"""Exact k nearest neighbours in torch: one matmul and one top-k per block of documents.

The score matrix of a block is (queries in block) × (documents in block), so memory is bounded
by ``query_block_size × (block_size + k)`` floats whatever the sample size. The running top-k of
each query is merged with every block's top-k.

**Order.** Score descending, ties by document index ascending, exactly: ``torch.topk`` picks an
arbitrary member of a tie that straddles the k-th place, so a row where that happens is re-ranked
with a stable sort (rare in real data, common in tests), and each selection is put in
(score descending, index ascending) order before merging.

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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["Neighbours", "exact_topk", "prepare", "resolve_device"]

_warned_cuda = False


@dataclass(frozen=True)
class Neighbours:
    """``indices`` (Q, k) int64 rows of the document matrix, best first, −1 where there are fewer
    than k documents (or they were excluded); ``scores`` (Q, k) float32, −inf there."""

    indices: np.ndarray
    scores: np.ndarray


def resolve_device(device: str | None) -> torch.device:
    """``cuda`` when asked for (``cuda`` or ``auto``) and available, else the CPU."""
    global _warned_cuda
    if device not in (None, "auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda")
    if device == "cuda" and not _warned_cuda:
        _warned_cuda = True
        logger.warning("device 'cuda' requested for the probes but CUDA is not available; using the CPU")
    return torch.device("cpu")


def prepare(vectors: np.ndarray, similarity: str) -> np.ndarray:
    """float32 C-contiguous rows, L2-normalised for ``cosine``."""
    if similarity not in ("cosine", "dot", "l2"):
        raise ValueError(f"similarity must be cosine, dot or l2, got {similarity!r}")
    out = np.ascontiguousarray(vectors, dtype=np.float32)
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
    device: str | torch.device | None = "cpu",
    exclude: np.ndarray | None = None,
    check: Callable[[], None] | None = None,
) -> Neighbours:
    """The exact top ``k`` documents of each query.

    ``exclude`` (Q,) holds one document index per query to leave out (the query itself, when
    queries are documents), or −1 for none. ``check`` is called between blocks; it may raise to
    abandon the search (a probe's deadline).
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
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    with torch.inference_mode():
        docs = torch.from_numpy(d).to(dev)
        doc_sq = (docs * docs).sum(dim=1) if similarity == "l2" else None
        for q_start in range(0, n_queries, query_block_size):
            q_stop = min(q_start + query_block_size, n_queries)
            qb = torch.from_numpy(q[q_start:q_stop]).to(dev)
            q_sq = (qb * qb).sum(dim=1, keepdim=True) if similarity == "l2" else None
            ex = None if exclude is None else torch.from_numpy(exclude[q_start:q_stop]).to(dev)
            best_v: torch.Tensor | None = None
            best_i: torch.Tensor | None = None
            for d_start in range(0, n_docs, block_size):
                if check is not None:
                    check()
                d_stop = min(d_start + block_size, n_docs)
                s = qb @ docs[d_start:d_stop].T
                if doc_sq is not None and q_sq is not None:
                    s = 2.0 * s - doc_sq[d_start:d_stop][None, :] - q_sq
                if ex is not None:
                    local = ex - d_start
                    rows = torch.nonzero((local >= 0) & (local < d_stop - d_start)).flatten()
                    if rows.numel():
                        s[rows, local[rows]] = -torch.inf
                v, i = _block_topk(s, min(k, d_stop - d_start))
                i = i + d_start
                if best_v is None or best_i is None:
                    best_v, best_i = v, i
                else:
                    v, i = _ordered(torch.cat([best_v, v], dim=1), torch.cat([best_i, i], dim=1))
                    best_v, best_i = v[:, :k], i[:, :k]
            assert best_v is not None and best_i is not None
            width = best_v.shape[1]
            scores[q_start:q_stop, :width] = best_v.cpu().numpy()
            indices[q_start:q_stop, :width] = best_i.cpu().numpy()
    indices[~np.isfinite(scores)] = -1  # excluded documents (the only non-finite scores)
    scores[indices < 0] = -np.inf
    return Neighbours(indices, scores)


def _block_topk(s: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top ``kk`` of each row of ``s``, ordered by (score desc, column asc), ties resolved exactly."""
    values, index = torch.topk(s, kk, dim=1, largest=True, sorted=True)
    kth = values[:, -1:]
    straddling = (s == kth).sum(dim=1) > (values == kth).sum(dim=1)
    if bool(straddling.any()):
        rows = torch.nonzero(straddling).flatten()
        v, i = torch.sort(s[rows], dim=1, descending=True, stable=True)
        values[rows] = v[:, :kk]
        index[rows] = i[:, :kk]
    return _ordered(values, index)


def _ordered(values: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by score descending, then index ascending (two stable sorts)."""
    index_sorted, perm = torch.sort(index, dim=1, stable=True)
    values = torch.gather(values, 1, perm)
    values_sorted, perm = torch.sort(values, dim=1, descending=True, stable=True)
    return values_sorted, torch.gather(index_sorted, 1, perm)
