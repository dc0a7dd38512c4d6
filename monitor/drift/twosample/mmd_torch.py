"""MMD's kernel products in torch, for a CUDA device.

The twin of :func:`monitor.drift.twosample.mmd.kernel_label_products`.

Imported only when the configured device resolves to CUDA (:func:`monitor.drift.twosample.mmd.label_products`),
so a CPU daemon never loads torch. The pooled sample crosses to the device once per test; each
chunk of labels crosses there and its products come back, float64 both ways. Same tiles, same
arithmetic (float32 kernel, float64 label products) as the numpy path.
"""

from __future__ import annotations

import numpy as np
import torch


class TorchKernel:
    """``labels -> K̃ @ labels`` for one pooled sample and bandwidth on a torch ``device``."""

    def __init__(self, pooled: np.ndarray, bandwidth: float, block_size: int, device: str = "cuda"):
        self.device = torch.device(device)
        self.pooled = torch.from_numpy(np.ascontiguousarray(pooled, dtype=np.float32)).to(self.device)
        self.sq = (self.pooled * self.pooled).sum(dim=1)
        self.gamma = 1.0 / (2.0 * bandwidth * bandwidth)
        self.block_size = block_size

    def __call__(self, labels: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self._products(torch.from_numpy(np.ascontiguousarray(labels)).to(self.device)).cpu().numpy()

    def _products(self, labels: torch.Tensor) -> torch.Tensor:
        pooled, sq, block = self.pooled, self.sq, self.block_size
        n = pooled.shape[0]
        out = torch.zeros_like(labels)
        for i0 in range(0, n, block):
            i1 = min(i0 + block, n)
            for j0 in range(i0, n, block):
                j1 = min(j0 + block, n)
                tile = torch.addmm(sq[i0:i1, None] + sq[None, j0:j1], pooled[i0:i1], pooled[j0:j1].T, alpha=-2.0)
                tile.clamp_min_(0.0).mul_(-self.gamma).exp_()
                if i0 == j0:
                    tile.fill_diagonal_(0.0)
                tile64 = tile.double()
                out[i0:i1] += tile64 @ labels[j0:j1]
                if j0 != i0:
                    out[j0:j1] += tile64.T @ labels[i0:i1]
        return out
