"""Exact k-NN's block operations in torch, for a CUDA device.

The twin of :class:`monitor.retrieval.probes.knn.NumpyBlocks`, imported only when the configured
device resolves to CUDA (:func:`monitor.retrieval.probes.knn.block_ops`), so a CPU daemon never
loads torch; the search loop itself is :func:`monitor.retrieval.probes.knn.search_blocks`. The
documents cross to the device once per search; each query block's top k comes back.
``torch.topk`` picks an arbitrary member of a tie that straddles the k-th place, so a row where
that happens is re-ranked with a stable sort, and each selection is put in (score descending,
index ascending) order before merging: the order is the numpy path's, exactly.
"""

from __future__ import annotations

import numpy as np
import torch


class TorchBlocks:
    """The search's array operations on a torch ``device``."""

    def __init__(self, device: str = "cuda"):
        self.device = torch.device(device)

    def put(self, rows: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(rows).to(self.device)

    def get(self, array: torch.Tensor) -> np.ndarray:
        return array.cpu().numpy()

    def row_sq(self, rows: torch.Tensor) -> torch.Tensor:
        return (rows * rows).sum(dim=1)

    def top(self, scores: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _block_topk(scores, kk)

    def merge(
        self, best: tuple[torch.Tensor, torch.Tensor], block: tuple[torch.Tensor, torch.Tensor], k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        v, i = _ordered(torch.cat([best[0], block[0]], dim=1), torch.cat([best[1], block[1]], dim=1))
        return v[:, :k], i[:, :k]


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
