"""Kernel two-sample test: unbiased MMD² with an RBF kernel and a permutation p-value.

MMD compares whole distributions (means, spreads, shapes, clusters), so it catches what the
cheaper tests cannot: a rotation or a model swap that leaves the mean alone.

Memory bound. The pooled kernel matrix of N = m + n points has N² entries (400 MB in float32
for N = 10,000) and the usual implementation (alibi-detect's) keeps it and re-indexes it for
every permutation. Here every permutation statistic is a quadratic form in the labels: with
``a`` the 0/1 indicator of the window rows and ``K`` the kernel with a zeroed diagonal,
``sum_XX = aᵀKa``, ``sum_XY = aᵀK1 - aᵀKa`` and ``sum_YY = 1ᵀK1 - 2 sum_XY - sum_XX``. So a
chunk of C relabellings needs only ``K @ A`` (A: N × C labels), accumulated one
``block × block`` kernel tile at a time over the upper triangle (each tile computed once per
chunk and used for both halves). Peak memory is about ``3 block²`` floats for the tile
(4 MB each at block = 1024, float32 plus its float64 copy) plus the label chunk, kept under
``label_budget_bytes`` (64 MB: 279 relabellings at N = 10,000; with sequential stopping the
first chunk is 64 and they double from there). Nothing of size N² is ever held. A larger
permutation budget (a tiny per-test alpha needs ~1/alpha permutations) costs more chunks, each
recomputing the tiles; the sequential stopping rule keeps that to the first chunk whenever the
data do not look drifted. The label products run in float64: the statistic is a small
difference of sums of ~N² kernel values, which float32 accumulation would blur; in float64 the
accumulation adds nothing to the float32 kernel's own rounding (a kernel entry may round one ulp
apart when the BLAS blocks a tile of another shape: ~1e-8 relative on the products). Within one
test every chunk uses the same tiles, so the observed and the permuted statistics agree exactly.

Devices. numpy on the CPU; on a CUDA device (:mod:`monitor.devices`) the kernel products run in
torch (:mod:`monitor.drift.twosample.mmd_torch`, imported only then), the same tiles in the same
precisions, so both give the statistic to float32 rounding of the kernel (tested: within 1e-6
relative; a statistic near 0 moves more, relatively) and the same p-values. The bandwidth and the
label bookkeeping stay in numpy.

Two nulls. ``permutation`` (above) is the most powerful but cannot give a p-value below
``1 / (1 + permutations)``; ``heldout`` ranks one half of the rows by the MMD witness function
learned on the other half (:mod:`monitor.drift.twosample.heldout`), needs no permutations and reaches any
alpha, for half the sample's worth of power. The settings pick ``heldout`` when the per-test
alpha would need more permutations than ``drift.max_permutations`` (short cycles).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np

from monitor.deadline import Deadline
from monitor.devices import device_type, use_cuda
from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.heldout import (
    RankOutcome,
    kernel_witness,
    rank_test,
    split_halves,
    split_indices,
)
from monitor.drift.twosample.permutation import check_permutation_budget, relabellings, sequential_permutation_test
from monitor.drift.twosample.reference_cache import ReferenceCache

logger = logging.getLogger(__name__)

Device = Literal["auto", "cpu", "cuda"]
Null = Literal["permutation", "heldout"]
LabelProducts = Callable[[np.ndarray], np.ndarray]
"""``labels`` (N, L) float64 -> ``K̃ @ labels`` (N, L) float64, for one pooled sample and bandwidth."""

DEFAULT_PERMUTATIONS = 200
DEFAULT_BLOCK_SIZE = 1024
DEFAULT_BANDWIDTH_POINTS = 1000
HELDOUT_BANDWIDTH_POINTS = 400  # the held-out null's median heuristic: 79,800 pairs of training rows
DEFAULT_STOP_AFTER = 10
DEFAULT_LABEL_BUDGET_BYTES = 64 * 2**20
FIRST_CHUNK = 64


def median_bandwidth(
    pooled: np.ndarray, rng: np.random.Generator, max_points: int = DEFAULT_BANDWIDTH_POINTS
) -> float:
    """Median heuristic: the median Euclidean distance between distinct points of the pooled sample.

    Pooled (window and reference together), so the bandwidth is a symmetric function of the
    pooled set and the permutation test stays exact. (The lower middle value when the number of
    pairs is even; computed on squared distances, in float64.) Above ``max_points`` rows a uniform subsample
    of that many rows is used (~500k pairs: the median is then accurate to well under 1%).
    Falls back to 1.0 when the median is 0 (more than half the pairs are duplicates). Always on
    the CPU: at most ``max_points²`` pairs, and the same bandwidth whatever the device.
    """
    n = pooled.shape[0]
    if n > max_points:
        pooled = pooled[np.sort(rng.choice(n, size=max_points, replace=False))]
    rows = np.asarray(pooled, dtype=np.float64)
    sq = (rows**2).sum(axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T
    np.maximum(d2, 0.0, out=d2)
    return median_of_squared_distances(d2[np.triu_indices(len(rows), k=1)])


def median_of_squared_distances(pairs: np.ndarray) -> float:
    """The median heuristic from the squared distances of every pair of the chosen points."""
    lower_middle = (pairs.size - 1) // 2
    return _median_value(np.partition(pairs, lower_middle)[lower_middle])


def _median_value(squared: float) -> float:
    median = float(np.sqrt(squared))
    if not math.isfinite(median) or median <= 0.0:
        logger.warning("median pairwise distance is %s; using bandwidth 1.0", median)
        return 1.0
    return median


def kernel_label_products(
    pooled: np.ndarray, labels: np.ndarray, bandwidth: float, block_size: int = DEFAULT_BLOCK_SIZE
) -> np.ndarray:
    """``K̃ @ labels`` for the RBF kernel ``exp(-|x-y|² / (2 σ²))`` with a zeroed diagonal.

    ``pooled`` is (N, d) float32, ``labels`` (N, L) float64. The kernel is built one
    ``block_size²`` float32 tile at a time over the upper triangle; each off-diagonal tile
    contributes to both its row and its column block, so every kernel entry is computed once.
    (The CUDA twin is :class:`monitor.drift.twosample.mmd_torch.TorchKernel`.)
    """
    n = pooled.shape[0]
    gamma = 1.0 / (2.0 * bandwidth * bandwidth)
    sq = np.einsum("ij,ij->i", pooled, pooled)
    # (L, N) layout: the skinny float64 products run ~1.5x faster in OpenBLAS this way round
    labels_t = np.ascontiguousarray(labels.T)
    out_t = np.zeros_like(labels_t)
    for i0 in range(0, n, block_size):
        i1 = min(i0 + block_size, n)
        for j0 in range(i0, n, block_size):
            j1 = min(j0 + block_size, n)
            tile = pooled[i0:i1] @ pooled[j0:j1].T
            tile *= -2.0
            tile += sq[i0:i1, None]
            tile += sq[None, j0:j1]
            np.maximum(tile, 0.0, out=tile)
            tile *= -gamma
            np.exp(tile, out=tile)
            if i0 == j0:
                np.fill_diagonal(tile, 0.0)
            tile64 = tile.astype(np.float64)
            out_t[:, i0:i1] += labels_t[:, j0:j1] @ tile64.T
            if j0 != i0:
                out_t[:, j0:j1] += labels_t[:, i0:i1] @ tile64
    return out_t.T  # a view: no third (N, L) array


def label_products(pooled: np.ndarray, bandwidth: float, block_size: int, device: str | None) -> LabelProducts:
    """The kernel products of ``pooled`` where ``device`` says: numpy on the CPU, torch on CUDA
    (imported only then)."""
    if use_cuda(device):
        from monitor.drift.twosample.mmd_torch import TorchKernel

        return TorchKernel(pooled, bandwidth, block_size, "cuda")
    return functools.partial(kernel_label_products, pooled, bandwidth=bandwidth, block_size=block_size)


def mmd2_from_products(
    labels: np.ndarray, products: np.ndarray, row_sums: np.ndarray, m: int, n: int
) -> np.ndarray:
    """Unbiased MMD² for every labelling column, from ``labels``, ``K̃ @ labels`` and ``K̃ @ 1``."""
    total = row_sums.sum()
    sum_xx = (labels * products).sum(axis=0)
    sum_xy = row_sums @ labels - sum_xx  # aᵀ K̃ 1 = sum_XX + sum_XY
    sum_yy = total - 2.0 * sum_xy - sum_xx
    return sum_xx / (m * (m - 1)) + sum_yy / (n * (n - 1)) - 2.0 * sum_xy / (m * n)


def mmd2_unbiased(x: np.ndarray, y: np.ndarray, bandwidth: float) -> float:
    """Unbiased MMD² between two samples for a given bandwidth (no test; for checks and examples).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(200, 4)).astype(np.float32)
    >>> round(mmd2_unbiased(x, rng.normal(size=(200, 4)).astype(np.float32), 2.0), 3)
    -0.002
    >>> round(mmd2_unbiased(x, rng.normal(1.0, 1.0, size=(200, 4)).astype(np.float32), 2.0), 3)
    0.22
    """
    pooled = np.concatenate([x, y]).astype(np.float32)
    return pooled_mmd2(label_products(pooled, bandwidth, DEFAULT_BLOCK_SIZE, "cpu"), len(x), len(y))


def pooled_mmd2(products: LabelProducts, m: int, n: int) -> float:
    """Unbiased MMD² between the first ``m`` rows of the pooled sample behind ``products`` and the other ``n``."""
    labels = np.zeros((m + n, 2), dtype=np.float64)
    labels[:m, 0] = 1.0
    labels[:, 1] = 1.0
    out = products(labels)
    return float(mmd2_from_products(labels[:, :1], out[:, :1], out[:, 1], m, n)[0])


def _doubling(start: int, cap: int) -> Iterator[int]:
    """Chunk sizes after a first chunk of ``start``: each twice the last, at most ``cap``."""
    chunk = start
    while True:
        chunk = min(2 * chunk, cap)
        yield chunk


def _validate_samples(x: np.ndarray, y: np.ndarray, minimum: int = 2) -> None:
    if x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"samples must be 2-D (rows, dim); got shapes {x.shape} and {y.shape}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"samples have different dimensions: {x.shape[1]} and {y.shape[1]}")
    if len(x) < minimum or len(y) < minimum:
        raise ValueError(f"each sample needs at least {minimum} rows; got {len(x)} and {len(y)}")


def mmd_test(
    x: np.ndarray,
    y: np.ndarray,
    *,
    alpha: float = 0.05,
    permutations: int = DEFAULT_PERMUTATIONS,
    stop_after: int | None = DEFAULT_STOP_AFTER,
    bandwidth: float | None = None,
    seed: int | np.random.SeedSequence | None = 0,
    device: Device = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    bandwidth_points: int | None = None,
    label_budget_bytes: int = DEFAULT_LABEL_BUDGET_BYTES,
    null: Null = "permutation",
    deadline: Deadline | None = None,
    reference: ReferenceCache | None = None,
) -> TestResult:
    """Kernel two-sample test of "the window ``x`` (m, d) and the reference ``y`` (n, d) share a distribution".

    Statistic: the unbiased MMD² (Gretton et al. 2012, eq. 3) with the RBF kernel
    ``exp(-|u - v|² / (2 σ²))``; ``σ`` is ``bandwidth`` or the median heuristic on the pooled
    sample (:func:`median_bandwidth`). p-value: over at most ``permutations`` random relabellings
    of the pooled rows, ``(1 + #{perm ≥ observed}) / (1 + permutations)``, or, with
    ``stop_after`` set, the Besag–Clifford sequential p-value that stops drawing once that many
    relabellings reached the observed statistic (see
    :func:`~monitor.drift.twosample.permutation.sequential_p_value`; ``None`` always draws all of them).
    Relabellings are processed in chunks whose label matrices fit ``label_budget_bytes``; the
    kernel tiles are recomputed per chunk rather than stored. Deterministic given ``seed``.
    ``deadline``: no further chunk of relabellings is drawn once it has passed (the p-value stays
    valid; ``extra["p_value_floor"]`` rises). ``null="heldout"``: the p-value of the held-out
    witness test instead (no permutations; the bandwidth then comes from the training halves, the
    median heuristic on ``bandwidth_points`` of them, default :data:`HELDOUT_BANDWIDTH_POINTS`);
    its statistic is the witness's mean difference on the held-out rows, an unbiased estimate of
    MMD² (the permutation null's is the whole samples' unbiased MMD²). ``reference``: the cached
    pieces of ``y`` (:mod:`monitor.drift.twosample.reference_cache`); the held-out null then reads
    every distance from one pooled Gram matrix (:func:`heldout_mmd_from_gram`).

    Examples
    --------
    >>> rng = np.random.default_rng(7)
    >>> ref = rng.normal(size=(300, 8)).astype(np.float32)
    >>> same = rng.normal(size=(300, 8)).astype(np.float32)
    >>> moved = rng.normal(0.3, 1.0, size=(300, 8)).astype(np.float32)
    >>> mmd_test(same, ref, permutations=100, seed=1, device="cpu").detected
    False
    >>> r = mmd_test(moved, ref, permutations=100, seed=1, device="cpu")
    >>> r.detected, r.p_value
    (True, 0.009900990099009901)
    >>> h = mmd_test(moved, ref, null="heldout", seed=1, device="cpu")
    >>> h.detected, h.p_value < 1e-4, h.extra["p_value_floor"]
    (True, True, 0.0)
    """
    x = np.asarray(x, dtype=np.float32)
    y = np.asarray(y, dtype=np.float32)
    _validate_samples(x, y)
    check_permutation_budget(permutations, stop_after)
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    if null not in ("permutation", "heldout"):
        raise ValueError(f"null must be 'permutation' or 'heldout', got {null!r}")
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    m, n = len(x), len(y)
    size = m + n
    if null == "heldout":
        return _heldout_mmd(x, y, rng, alpha, bandwidth, HELDOUT_BANDWIDTH_POINTS if bandwidth_points is None
                            else bandwidth_points, device, started, reference)

    pooled = np.ascontiguousarray(np.concatenate([x, y]))
    sigma = _bandwidth(bandwidth, pooled, rng, bandwidth_points or DEFAULT_BANDWIDTH_POINTS)
    products_of = label_products(pooled, sigma, block_size, device)

    # labels and products, float64 (size, columns) each, plus a temporary of the same size
    budget_columns = max(64, label_budget_bytes // (3 * 8 * size))
    # with sequential stopping, chunks grow from FIRST_CHUNK, doubling up to the budget: under no
    # drift the rule usually stops within the first few dozen relabellings, so that pass is cheap
    chunk = budget_columns if stop_after is None else min(FIRST_CHUNK, budget_columns)
    base = np.zeros(size, dtype=np.uint8)
    base[:m] = 1

    def as_columns(drawn: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(drawn.T, dtype=np.float64)

    # first pass: the observed labelling, the row sums (the all-ones column) and a first chunk
    first = min(permutations, chunk)
    observed_labels = base[:, None].astype(np.float64)
    ones = np.ones((size, 1), dtype=np.float64)
    labels = np.concatenate([observed_labels, as_columns(relabellings(base, first, rng)), ones], axis=1)
    products = products_of(labels)
    row_sums = products[:, -1].copy()
    stats = mmd2_from_products(labels[:, :-1], products[:, :-1], row_sums, m, n)
    del labels, products

    def null_statistics(drawn: np.ndarray) -> np.ndarray:
        columns = as_columns(drawn)
        return mmd2_from_products(columns, products_of(columns), row_sums, m, n)

    observed = float(stats[0])
    outcome = sequential_permutation_test(
        observed, null_statistics, base, rng, permutations=permutations, stop_after=stop_after,
        chunk_sizes=_doubling(chunk, budget_columns), first_null=stats[1:], deadline=deadline,
    )
    p_value = outcome.p_value
    elapsed = time.perf_counter() - started
    logger.debug("mmd: m=%d n=%d d=%d permutations=%d/%d mmd2=%.3g p=%.3g in %.2fs", m, n, x.shape[1],
                 outcome.used, permutations, observed, p_value, elapsed)
    return TestResult.at_level(
        "mmd", observed, p_value, alpha,
        extra={
            "bandwidth": sigma,
            **outcome.diagnostics(permutations),
            "window_size": m,
            "reference_size": n,
            "device": device_type(device),
            "seconds": elapsed,
        },
    )


def _bandwidth(bandwidth: float | None, rows: np.ndarray, rng: np.random.Generator, points: int) -> float:
    sigma = float(bandwidth) if bandwidth is not None else median_bandwidth(rows, rng, points)
    if not sigma > 0:
        raise ValueError(f"bandwidth must be positive, got {sigma}")
    return sigma


def heldout_mmd_from_gram(
    x: np.ndarray, reference: ReferenceCache, rng: np.random.Generator, bandwidth: float | None,
    bandwidth_points: int = HELDOUT_BANDWIDTH_POINTS,
) -> tuple[float, RankOutcome, float]:
    """The held-out MMD of ``x`` against the cached reference: ``(bandwidth, ranked, MMD² estimate)``.

    The same test as the plain path of :func:`mmd_test` with ``null="heldout"``: the same split,
    the same bandwidth subsample and the same witness, drawn from ``rng`` in the same order (the
    p-values agree; tested). Cheaper in three ways. Only the dot products the witness and the
    bandwidth's subsample need are computed, once, in float64; the reference-reference ones are
    read from the reference's cached Gram matrix. And the
    kernel is factored, ``exp(-γ|u - v|²) = exp(-γ|u|²) exp(-γ|v|²) exp(2γ u·v)``, so a kernel
    block costs one scaling and one ``exp`` of its dot products, and the row and column factors
    enter as vectors. The rows are centred on the reference mean first (distances do not
    change), which keeps ``2γ u·v`` small: ``|2γ u·v| ≤ |u||v| / σ²``, a few units for rows
    within a few bandwidths of the reference. The statistic, ``mean w(x_test) - mean w(y_test)``,
    comes from the same scores (the plain path's agrees to rounding).
    """
    rr = reference.centred_gram
    if rr is None:
        raise ValueError("the reference cache holds no Gram matrix (the reference has too many rows)")
    x64 = np.asarray(x, dtype=np.float64) - reference.mean
    m, n = len(x64), reference.size
    x_order, y_order = split_indices(m, n, rng)
    m_train, n_train = int(m * 0.5), int(n * 0.5)
    ordered = x64[x_order]
    x_tr, x_te = ordered[:m_train], ordered[m_train:]
    r_tr_i, r_te_i = y_order[:n_train], y_order[n_train:]
    centred = reference.centred_rows
    r_tr, r_te = centred[r_tr_i], centred[r_te_i]
    sq_x = np.einsum("ij,ij->i", ordered, ordered)
    sq_r = reference.centred_squared_norms
    sq_xtr, sq_xte, sq_rtr, sq_rte = sq_x[:m_train], sq_x[m_train:], sq_r[r_tr_i], sq_r[r_te_i]

    if bandwidth is None:
        # the median heuristic on the pooled training rows (a subsample above bandwidth_points):
        # the dot products of just those rows, the reference's read from its cached Gram
        chosen = np.arange(m_train + n_train)
        if len(chosen) > bandwidth_points:
            chosen = np.sort(rng.choice(len(chosen), size=bandwidth_points, replace=False))
        from_x, from_r = chosen[chosen < m_train], r_tr_i[chosen[chosen >= m_train] - m_train]
        xs = x_tr[from_x]
        xr = xs @ centred[from_r].T
        gram = np.block([[xs @ xs.T, xr], [xr.T, rr[np.ix_(from_r, from_r)]]])
        sq_points = np.r_[sq_xtr[from_x], sq_r[from_r]]
        d2 = sq_points[:, None] + sq_points[None, :] - 2.0 * gram  # exactly symmetric
        np.maximum(d2, 0.0, out=d2)
        np.fill_diagonal(d2, np.inf)
        # every pair twice, in the first N (N - 1) places once sorted: its lower middle is the pairs' lower middle
        pairs = len(d2) * (len(d2) - 1) // 2
        sigma = _median_value(np.partition(d2.ravel(), 2 * ((pairs - 1) // 2))[2 * ((pairs - 1) // 2)])
    else:
        sigma = _bandwidth(bandwidth, x64, rng, bandwidth_points)
    gamma = 1.0 / (2.0 * sigma * sigma)

    def factor(sq: np.ndarray) -> np.ndarray:
        return np.exp(-gamma * sq)

    def cross(gram: np.ndarray) -> np.ndarray:
        out = gram * (2.0 * gamma)
        return np.exp(out, out=out)

    a_xtr, a_xte, a_rtr, a_rte = factor(sq_xtr), factor(sq_xte), factor(sq_rtr), factor(sq_rte)
    weights = np.r_[a_xtr / m_train, -a_rtr / n_train]  # the witness's train-side weights, factors folded in
    x_scores = a_xte * (cross(x_te @ x_tr.T) @ weights[:m_train] + cross(x_te @ r_tr.T) @ weights[m_train:])
    r_cross = cross(rr[np.ix_(r_te_i, r_tr_i)])
    r_scores = a_rte * (cross(r_te @ x_tr.T) @ weights[:m_train] + r_cross @ weights[m_train:])
    # the witness's mean difference on the held-out rows: an unbiased estimate of MMD²
    return sigma, rank_test(x_scores, r_scores), float(x_scores.mean() - r_scores.mean())


def _heldout_mmd(
    x: np.ndarray,
    y: np.ndarray,
    rng: np.random.Generator,
    alpha: float,
    bandwidth: float | None,
    bandwidth_points: int,
    device: str | None,
    started: float,
    reference: ReferenceCache | None = None,
) -> TestResult:
    """The held-out witness test; its bandwidth comes from the training halves only, so the
    held-out rows stay exchangeable under no drift. With ``reference`` (its cached Gram, on the
    CPU) the distances come from one pooled Gram (:func:`heldout_mmd_from_gram`)."""
    m, n = len(x), len(y)
    cached = reference is not None and reference.size == n and not use_cuda(device)
    if cached and reference is not None and reference.centred_gram is not None:
        sigma, ranked, observed = heldout_mmd_from_gram(x, reference, rng, bandwidth, bandwidth_points)
    else:
        halves = split_halves(x, y, rng)
        train = np.concatenate([halves.x_train, halves.y_train])
        sigma = _bandwidth(bandwidth, train, rng, bandwidth_points)
        witness = kernel_witness(sigma)(halves.x_train, halves.y_train)
        x_scores, y_scores = witness(halves.x_test), witness(halves.y_test)
        ranked = rank_test(x_scores, y_scores)
        observed = float(x_scores.mean() - y_scores.mean())
    elapsed = time.perf_counter() - started
    logger.debug("mmd (held-out): m=%d n=%d mmd2=%.3g auc=%.3f p=%.3g in %.2fs", m, n, observed, ranked.auc,
                 ranked.p_value, elapsed)
    return TestResult.at_level(
        "mmd", observed, ranked.p_value, alpha,
        extra={
            "null": "heldout",
            "bandwidth": sigma,
            "auc": ranked.auc,
            "p_value_floor": 0.0,
            "test_rows": ranked.test_rows,
            "window_size": m,
            "reference_size": n,
            "device": device_type(device),
            "seconds": elapsed,
        },
    )
