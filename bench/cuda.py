"""The CUDA code paths against the CPU on the same inputs: time, speed-up and largest difference.

    python bench/cuda.py                 # the sizes docs/benchmarks.md quotes (needs a GPU and ~5 min)
    python bench/cuda.py --scale 0.02    # a smoke run; without CUDA only the CPU side runs

Paths compared (each function is the one the daemon calls, with ``device`` set):

* window statistics: ``SufficientStats.update`` of 2048-row batches (the product of a large
  batch runs on the device), float64 and float32, then every intrinsic metric from both;
* ``quality.intrinsic.uniformity`` over a 10,000 × 768 sample (all 50 M pairs);
* ``drift.mmd.mmd_test`` with 50,000 × 768 per side;
* ``retrieval.probes.knn.exact_topk``: 1,000 queries against 10⁶ × 384 documents, k = 10.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.drift.twosample.mmd import mmd_test
from monitor.quality.intrinsic import report_from_stats, uniformity
from monitor.retrieval.probes.knn import exact_topk
from monitor.state.stats import SufficientStats


def timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """Result and seconds of one call after one warm-up (CUDA work synchronised)."""
    fn()
    sync(device)
    started = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - started


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def relative(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(b), 1e-300)


def row(name: str, cpu: float, gpu: float | None, diff: str) -> None:
    speed = f"{cpu / gpu:,.1f}x" if gpu else "-"
    gpu_text = f"{gpu:.3f}" if gpu else "-"
    print(f"| {name} | {cpu:.3f} | {gpu_text} | {speed} | {diff} |", flush=True)


def bench_stats(rng: np.random.Generator, devices: list[str], rows: int, dim: int) -> None:
    x = (rng.standard_normal((rows, dim)) * np.geomspace(1e-2, 1, dim) + 0.5).astype(np.float32)
    for precision in ("float64", "float32"):
        reports, seconds, host = {}, {}, {}
        for device in devices:
            def fill(device: str = device, precision: str = precision) -> SufficientStats:
                stats = SufficientStats(dim, precision, None if device == "cpu" else device)
                for start in range(0, rows, 2048):
                    stats.update(x[start : start + 2048])
                return stats

            cpu_before = time.process_time()
            stats, seconds[device] = timed(fill, device)
            host[device] = (time.process_time() - cpu_before) / 2  # the warm-up and the timed call
            reports[device] = report_from_stats(stats)
        diff = "-"
        if "cuda" in reports:
            fields = [
                f.name for f in dataclasses.fields(reports["cpu"]) if isinstance(getattr(reports["cpu"], f.name), float)
            ]
            worst = max(fields, key=lambda f: relative(getattr(reports["cuda"], f), getattr(reports["cpu"], f)))
            worst_diff = relative(getattr(reports["cuda"], worst), getattr(reports["cpu"], worst))
            diff = (f"max rel. diff of any metric {worst_diff:.1e}"
                    f" ({worst}); host CPU time {host['cuda']:.2f} s vs {host['cpu']:.2f} s")
        row(f"window statistics, {rows:,} x {dim}, {precision}", seconds["cpu"], seconds.get("cuda"), diff)


def bench_uniformity(rng: np.random.Generator, devices: list[str], rows: int, dim: int) -> None:
    sample = rng.standard_normal((rows, dim)).astype(np.float32)
    pairs = rows * (rows - 1) // 2
    out = {d: timed(lambda d=d: uniformity(sample, pair_budget=pairs, device=d), d) for d in devices}
    diff = f"rel. diff {relative(out['cuda'][0][0], out['cpu'][0][0]):.1e}" if "cuda" in out else "-"
    row(f"uniformity, {rows:,} x {dim} ({pairs / 1e6:,.0f} M pairs)", out["cpu"][1], out.get("cuda", (0, None))[1],
        diff)


def bench_mmd(rng: np.random.Generator, devices: list[str], rows: int, dim: int, permutations: int) -> None:
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    y = (rng.standard_normal((rows, dim)) + 0.01).astype(np.float32)
    out = {}
    for d in devices:
        result, seconds = timed_once(
            lambda d=d: mmd_test(x, y, permutations=permutations, stop_after=None, seed=1, device=d)
        )
        out[d] = (result, seconds)
    diff = "-"
    if "cuda" in out:
        c, g = out["cpu"][0], out["cuda"][0]
        diff = f"MMD² rel. diff {relative(g.statistic, c.statistic):.1e}, p-values {c.p_value:.3g} / {g.p_value:.3g}"
    row(f"MMD test, {rows:,} x {dim} per side, {permutations} permutations", out["cpu"][1],
        out.get("cuda", (0, None))[1], diff)


def timed_once(fn: Callable[[], Any]) -> tuple[Any, float]:
    """One call (too long to repeat on the CPU); CUDA warmed up by the earlier benches."""
    started = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


def bench_knn(rng: np.random.Generator, devices: list[str], docs: int, queries: int, dim: int) -> None:
    d = rng.standard_normal((docs, dim)).astype(np.float32)
    q = rng.standard_normal((queries, dim)).astype(np.float32)
    out = {dev: timed_once(lambda dev=dev: exact_topk(q, d, 10, device=dev)) for dev in devices}
    diff = "-"
    if "cuda" in out:
        c, g = out["cpu"][0], out["cuda"][0]
        same = float(np.mean(c.indices == g.indices))
        diff = f"same neighbours {same:.4%}, max score diff {float(np.max(np.abs(c.scores - g.scores))):.1e}"
    row(f"exact k-NN, {queries:,} queries x {docs:,} x {dim}, k=10", out["cpu"][1], out.get("cuda", (0, None))[1], diff)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="shrink every size (smoke runs)")
    parser.add_argument("--permutations", type=int, default=20)
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {name}")
    print("\n| path | CPU s | CUDA s | speed-up | CUDA vs CPU |\n| --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    s = args.scale
    bench_stats(rng, devices, max(4096, int(200_000 * s)), 768)
    bench_uniformity(rng, devices, max(100, int(10_000 * s)), 768)
    bench_knn(rng, devices, max(1000, int(1_000_000 * s)), max(10, int(1000 * s)), 384)
    bench_mmd(rng, devices, max(200, int(50_000 * s)), 768, args.permutations)


if __name__ == "__main__":
    main()
