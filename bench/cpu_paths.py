"""The daemon's CPU paths in numpy against their torch twins run on the CPU (what they replaced).

    python bench/cpu_paths.py                # the sizes docs/benchmarks.md quotes (~1 min on 2 cores)
    python bench/cpu_paths.py --scale 0.1    # a smoke run

MMD (``drift.mmd.mmd_test``, 10,000 × 768 per side, 20 permutations) and exact k-NN
(``retrieval.probes.knn.exact_topk``, 200 queries against 200,000 × 384, k = 10), each run
alternately on numpy and on the torch code (``drift/twosample/mmd_torch.py``, ``retrieval/probes/knn_torch.py``)
with torch's CPU device, in one process so both see the same load; the median of ``--repeats``
calls, and how far the answers differ.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.drift.twosample import mmd, mmd_torch
from monitor.retrieval.probes import knn, knn_torch


def torch_on_cpu() -> None:
    """Route MMD's kernel products and k-NN's blocks through the torch code on the CPU."""
    mmd.label_products = lambda pooled, sigma, block, device: mmd_torch.TorchKernel(pooled, sigma, block, "cpu")
    knn.block_ops = lambda device: knn_torch.TorchBlocks("cpu")


def alternate(call: Callable[[], Any], repeats: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Median seconds and the last answer of ``call`` on numpy and on torch, alternating."""
    numpy_paths = (mmd.label_products, knn.block_ops)
    seconds: dict[str, list[float]] = {"numpy": [], "torch": []}
    answers: dict[str, Any] = {}
    for _ in range(repeats):
        for backend in ("numpy", "torch"):
            if backend == "torch":
                torch_on_cpu()
            else:
                mmd.label_products, knn.block_ops = numpy_paths
            started = time.perf_counter()
            answers[backend] = call()
            seconds[backend].append(time.perf_counter() - started)
    mmd.label_products, knn.block_ops = numpy_paths
    return {k: statistics.median(v) for k, v in seconds.items()}, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__} with {torch.get_num_threads()} threads, numpy {np.__version__}")
    print("\n| path | numpy s | torch (CPU) s | numpy / torch | difference |\n| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    rows = max(200, int(10_000 * args.scale))
    x = rng.standard_normal((rows, 768)).astype(np.float32)
    y = (rng.standard_normal((rows, 768)) + 0.01).astype(np.float32)
    seconds, out = alternate(
        lambda: mmd.mmd_test(x, y, permutations=20, stop_after=None, seed=1, device="cpu"), args.repeats
    )
    a, b = out["numpy"], out["torch"]
    relative = abs(a.statistic - b.statistic) / abs(b.statistic)
    print(f"| MMD test, {rows:,} x 768 per side, 20 permutations | {seconds['numpy']:.3f} | {seconds['torch']:.3f} | "
          f"{seconds['numpy'] / seconds['torch']:.2f} | MMD² rel. {relative:.1e}, "
          f"p-values {a.p_value:.3g} / {b.p_value:.3g} |")
    docs = rng.standard_normal((max(1000, int(200_000 * args.scale)), 384)).astype(np.float32)
    queries = rng.standard_normal((max(10, int(200 * args.scale)), 384)).astype(np.float32)
    seconds, out = alternate(lambda: knn.exact_topk(queries, docs, 10, device="cpu"), args.repeats)
    a, b = out["numpy"], out["torch"]
    print(f"| exact k-NN, {len(queries):,} queries x {len(docs):,} x 384, k=10 | {seconds['numpy']:.3f} | "
          f"{seconds['torch']:.3f} | {seconds['numpy'] / seconds['torch']:.2f} | same neighbours "
          f"{np.mean(a.indices == b.indices):.4%}, max score diff {np.max(np.abs(a.scores - b.scores)):.1e} |")


if __name__ == "__main__":
    main()
