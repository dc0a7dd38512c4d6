"""Our blocked MMD permutation test vs alibi-detect's ``MMDDrift`` (pytorch backend), same data.

Reference 5,000 × 384 vs window 5,000 × 384, 100 permutations, p-value threshold 0.05, for a
null case (a fresh sample of the reference distribution) and a shifted case (a small shift of
the mean along a random direction). Both must reach the same verdicts; ours must not be slower
than alibi's ``predict`` (alibi computes the reference kernel once at construction and caches it;
its construction time is printed separately). A third run of ours with alibi's bandwidth checks
that the two compute the same statistic (to within float32 summation noise in alibi's sums).

Ours runs with ``stop_after=None`` so that it, like alibi, draws all 100 permutations.

Run: ``scripts/setup alibi && PYTHONPATH=. .venv-alibi/bin/python bench/mmd_vs_alibi.py`` (``--help`` for
sizes; alibi-detect needs numpy<2, hence its own environment). Exit status 1 when the verdicts
differ or ours is slower.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import torch

from monitor.drift.twosample.mmd import mmd_test


def embedding_like(rng: np.random.Generator, n: int, dim: int, shift: np.ndarray | None = None) -> np.ndarray:
    """Unit vectors with a power-law spectrum around a common direction, like sentence embeddings."""
    spectrum = 1.0 / np.sqrt(np.arange(1, dim + 1))
    rows = rng.normal(size=(n, dim)) * spectrum * 0.15
    rows[:, 0] += 0.5
    if shift is not None:
        rows += shift
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="rows in the reference and in the window")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--permutations", type=int, default=100)
    parser.add_argument("--shift", type=float, default=0.01, help="mean shift of the shifted case (norm)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from alibi_detect.cd import MMDDrift  # imported here: slow, and only the benchmark needs it

    rng = np.random.default_rng(args.seed)
    reference = embedding_like(rng, args.n, args.dim)
    direction = rng.normal(size=args.dim)
    direction *= args.shift / np.linalg.norm(direction)
    cases = {
        "null": embedding_like(rng, args.n, args.dim),
        "shifted": embedding_like(rng, args.n, args.dim, shift=direction),
    }
    print(f"data: reference {reference.shape} vs window {cases['null'].shape}, {args.permutations} permutations, "
          f"torch threads {torch.get_num_threads()}, device {args.device}")

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # alibi permutes with the global numpy RNG
    started = time.perf_counter()
    alibi = MMDDrift(reference, backend="pytorch", p_val=0.05, n_permutations=args.permutations, device=args.device)
    alibi_init = time.perf_counter() - started
    alibi_sigma = float(alibi._detector.kernel.sigma.cpu().numpy()[0])
    print(f"alibi MMDDrift construction (reference kernel, bandwidth {alibi_sigma:.4f}): {alibi_init:.2f}s")

    failures = []
    header = f"{'case':8s} {'impl':6s} {'p-value':>8s} {'drift':>6s} {'MMD²':>11s} {'seconds':>8s}"
    print(header)
    for name, window in cases.items():
        started = time.perf_counter()
        prediction = alibi.predict(window)["data"]
        alibi_seconds = time.perf_counter() - started
        alibi_drift = bool(prediction["is_drift"])
        print(f"{name:8s} {'alibi':6s} {prediction['p_val']:8.4f} {alibi_drift!s:>6s} {prediction['distance']:11.4e} "
              f"{alibi_seconds:8.2f}")

        started = time.perf_counter()
        ours = mmd_test(window, reference, alpha=0.05, permutations=args.permutations, stop_after=None,
                        seed=args.seed, device=args.device)
        ours_seconds = time.perf_counter() - started
        print(f"{name:8s} {'ours':6s} {ours.p_value:8.4f} {ours.detected!s:>6s} {ours.statistic:11.4e} "
              f"{ours_seconds:8.2f}   (bandwidth {ours.extra['bandwidth']:.4f}; "
              f"alibi/ours time ratio {alibi_seconds / ours_seconds:.1f}x)")

        same_kernel = mmd_test(window, reference, permutations=100, stop_after=None, bandwidth=alibi_sigma,
                               device=args.device)
        # MMD² under no drift is ~0, so compare the difference with the permutation null's spread;
        # alibi sums ~10⁸ kernel values in float32, ours in float64
        relative = abs(same_kernel.statistic - prediction["distance"]) / same_kernel.extra["null_p95"]
        print(f"{name:8s} ours with alibi's bandwidth: MMD² {same_kernel.statistic:.6e}, p-value "
              f"{same_kernel.p_value:.4f} (difference {relative:.1e} of the null's 95th percentile)")

        if ours.detected != alibi_drift:
            failures.append(f"{name}: verdicts differ (ours {ours.detected}, alibi {alibi_drift})")
        if ours_seconds > alibi_seconds:
            failures.append(f"{name}: ours is slower ({ours_seconds:.2f}s vs {alibi_seconds:.2f}s)")
        if relative > 1e-2:
            failures.append(f"{name}: statistics differ with the same bandwidth ({relative:.1e})")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
