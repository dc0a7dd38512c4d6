"""Intrinsic health of an embedding window: isotropy, spread, ranks, collapse, uniformity, alignment.

Pure functions from exact window statistics (``SufficientStats``), the window's uniform sample
and its alignment sums to an immutable ``IntrinsicReport``. Every field of the report is one
exported gauge (``embmon_<field>``); docs/metrics.md gives each formula, its source and what
healthy and unhealthy values look like.

Spectral metrics use the eigenvalues λ₁ ≥ … ≥ λ_d of the window covariance, one d × d
``eigvalsh`` (≈ 25 ms at d = 768) whatever the number of records. Eigenvalues below the
rounding floor d·ε·E‖x‖² (:func:`rounding_floor`) are exact zeros, so every ratio metric is the
same for the data multiplied by any c > 0, and ranks never exceed min(d, n − 1).

Uniformity runs in numpy on the CPU and in torch only on a CUDA device, so a CPU-only daemon
never imports torch for it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from monitor.devices import torch_device, use_cuda
from monitor.quality.settings import IntrinsicSettings
from monitor.state.pairs import PositivePairMatcher
from monitor.state.stats import SufficientStats
from monitor.state.window import WindowSnapshot

logger = logging.getLogger(__name__)

__all__ = [
    "IntrinsicReport",
    "collapse_reasons",
    "report_from_matrix",
    "report_from_snapshot",
    "report_from_stats",
    "rounding_floor",
    "uniformity",
]

_VARIANCE_ROUNDING = 1e-12
"""A dimension whose variance is below this share of the mean square coordinate is treated as
constant even when every dimension is (identical vectors), where the relative rule is void."""

_BLOCK_ELEMENTS = 4_000_000
"""Uniformity works on row blocks of the pair matrix with at most this many entries (16 MB)."""


@dataclass(frozen=True, slots=True)
class IntrinsicReport:
    """Intrinsic health of one window; each field is the gauge ``embmon_<field>``.

    With fewer than 2 records every float metric is NaN (no covariance), ``dead_dimensions`` and
    ``collapse_detected`` are 0. ``uniformity`` is ``None`` when the sample has fewer than 2
    rows; ``alignment`` is ``None`` when no positive pair completed in the window.
    """

    partition_isotropy: float
    effective_dimension: float
    effective_dimension_ratio: float
    top10_variance_ratio: float
    mean_cosine_similarity: float
    vector_norm_mean: float
    vector_norm_stddev: float
    dead_dimensions: int
    effective_rank: float
    stable_rank: float
    collapse_detected: int
    uniformity: float | None
    alignment: float | None
    dimension: int
    window_records: int
    sample_records: int

    def as_gauges(self) -> dict[str, float]:
        """``{"embmon_<field>": value}`` for every defined (not None, not NaN) field."""
        return {
            f"embmon_{name}": float(value)
            for name, value in asdict(self).items()
            if value is not None and not math.isnan(float(value))
        }


# -- entry points ----------------------------------------------------------------------------


def report_from_snapshot(
    snapshot: WindowSnapshot,
    settings: IntrinsicSettings | None = None,
    *,
    device: str | None = None,
) -> IntrinsicReport:
    """The report of one published window snapshot (the scheduled refresh calls this)."""
    settings = settings or IntrinsicSettings()
    if not math.isclose(snapshot.alignment_alpha, settings.alignment_alpha):
        raise ValueError(
            f"window sums alignment with alpha={snapshot.alignment_alpha} but settings say "
            f"alignment_alpha={settings.alignment_alpha}; build the window from the same settings"
        )
    return report_from_stats(
        snapshot.stats,
        sample=snapshot.sample,
        alignment=(snapshot.alignment_sum, snapshot.alignment_pairs),
        settings=settings,
        device=device,
    )


def report_from_matrix(
    vectors: np.ndarray,
    settings: IntrinsicSettings | None = None,
    *,
    pair_ids: Sequence[str | None] | None = None,
    seed: int = 0,
    device: str | None = None,
) -> IntrinsicReport:
    """The report of a whole (n, d) matrix, as if it were one window (the ``inspect`` CLI).

    Rows with the same ``pair_ids`` entry form positive pairs in row order, exactly as in the
    live window. The uniformity sample is a seeded random subset, since row order in a file
    need not be random.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> report = report_from_matrix(rng.standard_normal((2000, 32)))
    >>> report.dead_dimensions, report.collapse_detected, round(report.effective_dimension_ratio, 2)
    (0, 0, 0.98)
    """
    settings = settings or IntrinsicSettings()
    x = np.asarray(vectors)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"expected an (n, d) matrix, got shape {x.shape}")
    n, d = x.shape
    stats = SufficientStats(d)
    for start in range(0, n, 8192):  # bounded float64 temporaries
        stats.update(x[start : start + 8192])

    rng = np.random.default_rng(seed)
    take = min(n, _max_sample_rows(settings.uniformity_pair_budget))
    sample = np.asarray(x[np.sort(rng.choice(n, size=take, replace=False))], dtype=np.float32)
    sample = sample[rng.permutation(take)]

    alignment = (0.0, 0)
    if pair_ids is not None:
        if len(pair_ids) != n:
            raise ValueError(f"got {len(pair_ids)} pair ids for {n} rows")
        rows = [i for i, pair_id in enumerate(pair_ids) if pair_id is not None]
        ids = [pair_id for pair_id in pair_ids if pair_id is not None]
        if rows:
            paired = np.asarray(x[rows], dtype=np.float64)
            units = paired / np.linalg.norm(paired, axis=1, keepdims=True)
            matcher = PositivePairMatcher(max_pending=len(rows), alpha=settings.alignment_alpha)
            alignment = matcher.match(units, ids)
    return report_from_stats(stats, sample=sample, alignment=alignment, settings=settings, device=device)


def report_from_stats(
    stats: SufficientStats,
    sample: np.ndarray | None = None,
    alignment: tuple[float, int] = (0.0, 0),
    settings: IntrinsicSettings | None = None,
    *,
    device: str | None = None,
) -> IntrinsicReport:
    """All intrinsic metrics from exact window statistics plus a uniform sample.

    Parameters
    ----------
    stats : SufficientStats
        Exact sums over the window.
    sample : ndarray (m, d), optional
        Rows in random order, each window record equally likely to be in it (uniformity).
    alignment : (float, int)
        Σ‖u₁ − u₂‖^α over completed positive pairs, and their number.
    settings : IntrinsicSettings, optional
    device : str, optional
        Where uniformity runs: ``"cpu"`` (default), ``"cuda"``, or ``"auto"`` (monitor/devices.py).
    """
    settings = settings or IntrinsicSettings()
    started = time.perf_counter()
    n, d = stats.count, stats.dim
    alignment_sum, alignment_pairs = alignment
    alignment_value = float(alignment_sum) / alignment_pairs if alignment_pairs > 0 else None
    uniformity_value, used = (None, 0)
    if sample is not None:
        uniformity_value, used = uniformity(
            sample, t=settings.uniformity_t, pair_budget=settings.uniformity_pair_budget, device=device
        )
    if n < 2:
        nan = math.nan
        return IntrinsicReport(
            partition_isotropy=nan, effective_dimension=nan, effective_dimension_ratio=nan,
            top10_variance_ratio=nan, mean_cosine_similarity=nan,
            vector_norm_mean=stats.norm_sum / n if n else nan, vector_norm_stddev=nan,
            dead_dimensions=0, effective_rank=nan, stable_rank=nan, collapse_detected=0,
            uniformity=uniformity_value, alignment=alignment_value,
            dimension=d, window_records=n, sample_records=0 if sample is None else int(sample.shape[0]),
        )  # fmt: skip

    cov = stats.covariance()
    eigenvalues = np.linalg.eigvalsh(cov)[::-1]  # descending
    eigenvalues = np.where(eigenvalues > rounding_floor(stats, float(np.trace(cov))), eigenvalues, 0.0)
    spectrum = _spectrum_metrics(eigenvalues)
    norm_mean = stats.norm_sum / n
    norm_var = stats.norm_variance
    unit_sum = stats.unit_sum
    mean_cosine = (float(unit_sum @ unit_sum) - n) / (n * (n - 1))

    report = IntrinsicReport(
        partition_isotropy=spectrum["partition_isotropy"],
        effective_dimension=spectrum["effective_dimension"],
        effective_dimension_ratio=spectrum["effective_dimension"] / d,
        top10_variance_ratio=spectrum["top10_variance_ratio"],
        mean_cosine_similarity=mean_cosine,
        vector_norm_mean=norm_mean,
        vector_norm_stddev=math.sqrt(norm_var),
        dead_dimensions=_dead_dimensions(np.diag(cov), stats.sq_norm_sum / n, settings.dead_dimension_ratio),
        effective_rank=spectrum["effective_rank"],
        stable_rank=spectrum["stable_rank"],
        collapse_detected=0,
        uniformity=uniformity_value,
        alignment=alignment_value,
        dimension=d,
        window_records=n,
        sample_records=0 if sample is None else int(sample.shape[0]),
    )
    reasons = collapse_reasons(report, settings)
    if reasons:
        logger.debug("collapse rule fired (%s) over %s records", ", ".join(reasons), n)
    logger.debug("intrinsic report over %s records took %.3fs", n, time.perf_counter() - started)
    return replace(report, collapse_detected=int(bool(reasons)))


# -- the metrics -----------------------------------------------------------------------------


def rounding_floor(stats: SufficientStats, total_variance: float) -> float:
    """The smallest covariance eigenvalue that is not rounding.

    float64 products (the default): d·ε₆₄·E‖x‖². The covariance comes from float64 sums, so each
    eigenvalue is known to within a few ε times the second moment's norm, which E‖x‖² =
    trace(XᵀX)/n bounds. Like ``numpy.linalg.matrix_rank``'s tolerance (σ_max·max(M, N)·ε), the
    floor scales with the data: multiplying every vector by c > 0 multiplies the floor and every
    eigenvalue by c², so what counts as a null direction, and every ratio below, does not depend
    on the scale. Measured noise eigenvalues of rank-deficient data (rank 1–20, d = 384–768, means
    up to 100× the spread, scales 1e-4–1e4) stay below 7·10⁻¹⁶·E‖x‖², over 100× under the floor.

    float32 products (``window.gram_precision: float32``): √d·ε₃₂·trace(C), also scale-free. The
    shifted rows' product rounds in single precision, so null directions come out near
    10⁻⁸·E‖x − c‖² (measured up to 1.2·10⁻⁸ on the same cases), far above the float64 floor;
    trace(C) is that size when the centre c is near the mean. At d = 768 the floor is
    3.3·10⁻⁶·trace(C): 280× the measured noise, and 7× under MiniLM's smallest real eigenvalue
    (2.4·10⁻⁵·trace(C)). d·ε₃₂ would be 9·10⁻⁵ and erase real directions, hence √d.
    """
    n = stats.count
    floor = stats.dim * float(np.finfo(np.float64).eps) * (stats.sq_norm_sum / n if n else 0.0)
    if stats.precision == "float32":
        floor = max(floor, math.sqrt(stats.dim) * float(np.finfo(np.float32).eps) * max(total_variance, 0.0))
    return floor


def _spectrum_metrics(eigenvalues: np.ndarray) -> dict[str, float]:
    """Isotropy, effective dimension and ranks from descending covariance eigenvalues, rounding
    already set to exact zeros (zeros add nothing to an entropy or a sum).

    Singular values of the centred data are σᵢ = sqrt((n − 1)·λᵢ); the (n − 1) factor cancels in
    every ratio below, so no SVD of the data is needed. A window without variance (identical
    vectors) has rank 0: isotropy, effective dimension and both ranks are 0, the top-10 share
    undefined (NaN).
    """
    lam = eigenvalues
    total = float(lam.sum())
    if total <= 0.0:
        zero = {"partition_isotropy": 0.0, "effective_dimension": 0.0, "effective_rank": 0.0, "stable_rank": 0.0}
        return {**zero, "top10_variance_ratio": math.nan}
    sigma = np.sqrt(lam[lam > 0.0])
    p = sigma / sigma.sum()
    entropy = float(-(p * np.log(p)).sum())
    return {
        "partition_isotropy": lam.size * float(lam[-1]) / total,
        "effective_dimension": total * total / float((lam * lam).sum()),
        "top10_variance_ratio": float(lam[:10].sum()) / total,
        "effective_rank": math.exp(entropy),
        "stable_rank": total / float(lam[0]),
    }


def _dead_dimensions(variances: np.ndarray, mean_square_norm: float, ratio: float) -> int:
    """Dimensions with variance < ratio × mean per-dimension variance (or at rounding level)."""
    d = variances.size
    rounding_floor = _VARIANCE_ROUNDING * mean_square_norm / d
    threshold = max(ratio * float(variances.mean()), rounding_floor)
    return int(np.count_nonzero(variances < threshold))


def collapse_reasons(report: IntrinsicReport, settings: IntrinsicSettings | None = None) -> list[str]:
    """Which parts of the collapse rule fire for ``report`` (empty list: no collapse).

    The rule (any part fires, all thresholds in ``IntrinsicSettings``), evaluated only with at
    least ``collapse_min_records`` records:

    * ``dead_dimensions``: dead dimensions / d > ``collapse_dead_dimension_share``;
    * ``effective_rank``: effective_rank / min(d, n − 1) < ``collapse_effective_rank_ratio``;
    * ``stable_rank``: stable_rank < ``collapse_stable_rank``;
    * ``mean_cosine``: mean cosine similarity > ``collapse_mean_cosine``.
    """
    settings = settings or IntrinsicSettings()
    n, d = report.window_records, report.dimension
    if n < max(2, settings.collapse_min_records):
        return []
    reasons = []
    if report.dead_dimensions / d > settings.collapse_dead_dimension_share:
        reasons.append("dead_dimensions")
    if report.effective_rank / min(d, n - 1) < settings.collapse_effective_rank_ratio:
        reasons.append("effective_rank")
    if report.stable_rank < settings.collapse_stable_rank:
        reasons.append("stable_rank")
    if report.mean_cosine_similarity > settings.collapse_mean_cosine:
        reasons.append("mean_cosine")
    return reasons


def _max_sample_rows(pair_budget: int) -> int:
    """Largest m with m(m − 1)/2 ≤ pair_budget."""
    m = (1 + math.isqrt(1 + 8 * pair_budget)) // 2
    while m * (m - 1) // 2 > pair_budget:
        m -= 1
    return max(m, 1)


def uniformity(
    sample: np.ndarray,
    t: float = 2.0,
    pair_budget: int = 2_000_000,
    device: str | None = None,
) -> tuple[float | None, int]:
    """Wang & Isola uniformity log E[exp(−t‖uᵢ − uⱼ‖²)] over all distinct pairs of a prefix.

    Uses the first m rows with m(m − 1)/2 ≤ ``pair_budget`` (the sample is in random order, so
    the prefix is itself a uniform sample), normalises them to unit length and evaluates every
    pair exactly, one row block at a time (‖uᵢ − uⱼ‖² = 2 − 2uᵢ·uⱼ, float32 products), combining
    blocks with a float64 logsumexp. Returns ``(value, m)``; value is ``None`` when m < 2.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> value, used = uniformity(rng.standard_normal((500, 64)), pair_budget=10_000)
    >>> used, round(value, 2)  # uniform on the sphere in 64-d: about -4 + 8/64
    (141, -3.87)
    """
    x = np.asarray(sample)
    m = min(x.shape[0], _max_sample_rows(pair_budget))
    if m < 2:
        return None, m
    u = np.ascontiguousarray(x[:m], dtype=np.float32)
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    if use_cuda(device):
        total = _pair_logsumexp_torch(u, t, device)
    else:
        total = _logsumexp(np.array([_logsumexp(block) for block in _pair_logit_blocks(u, t) if block.size]))
    return total - math.log(m * (m - 1) // 2), m


def _pair_logit_blocks(u: np.ndarray, t: float) -> Iterator[np.ndarray]:
    """−t·‖uᵢ − uⱼ‖² for every pair i < j of unit rows, one row block at a time."""
    m = u.shape[0]
    rows_per_block = max(1, min(m, _BLOCK_ELEMENTS // m))
    for start in range(0, m - 1, rows_per_block):
        stop = min(start + rows_per_block, m)
        # Pairs i < j with start <= i < stop: inside the block (upper triangle), then every later row.
        inside = _pair_logits(u[start:stop], u[start:stop], t)
        yield inside[np.triu_indices(stop - start, k=1)]
        if stop < m:
            yield _pair_logits(u[start:stop], u[stop:], t).ravel()


def _pair_logits(rows: np.ndarray, cols: np.ndarray, t: float) -> np.ndarray:
    """−t·‖uᵢ − uⱼ‖² = t·(2uᵢ·uⱼ − 2) for unit rows, clamped at 0 against rounding."""
    logits = rows @ cols.T
    logits *= 2.0
    logits -= 2.0
    np.minimum(logits, 0.0, out=logits)
    logits *= t
    return logits


def _logsumexp(values: np.ndarray) -> float:
    top = float(values.max())
    return top + math.log(float(np.exp(np.asarray(values, dtype=np.float64) - top).sum()))


def _pair_logsumexp_torch(u: np.ndarray, t: float, device: str | None) -> float:
    """The same sum on a CUDA device (the pair matrix of a large sample is a GPU-sized GEMM)."""
    import torch

    with torch.no_grad():
        rows = torch.as_tensor(u, device=torch_device(device))
        m = rows.shape[0]
        rows_per_block = max(1, min(m, _BLOCK_ELEMENTS // m))
        parts = []
        for start in range(0, m - 1, rows_per_block):
            stop = min(start + rows_per_block, m)
            inside = (rows[start:stop] @ rows[start:stop].T).mul_(2.0).sub_(2.0).clamp_(max=0.0).mul_(t)
            upper = torch.ones_like(inside, dtype=torch.bool).triu_(diagonal=1)
            parts.append(torch.logsumexp(inside[upper], dim=0))
            if stop < m:
                later = (rows[start:stop] @ rows[stop:].T).mul_(2.0).sub_(2.0).clamp_(max=0.0).mul_(t)
                parts.append(torch.logsumexp(later.flatten(), dim=0))
        return float(torch.logsumexp(torch.stack(parts).double(), dim=0).item())
