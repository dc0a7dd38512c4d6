"""Exact streaming sufficient statistics of a stream of embedding vectors.

Every covariance-based intrinsic metric (isotropy, effective dimension, ranks, dead dimensions,
mean cosine, norm moments) is a function of a handful of sums. Keeping those sums instead of the
vectors makes the metrics exact over any number of records in O(d²) memory, and makes sub-window
statistics mergeable by plain addition.

The second moment is kept about a *centre* c (the first batch's mean): G = Σ(x − c)(x − c)ᵀ.
Shifting is what makes a cheaper float32 product safe (rows near their mean have no large common
part to cancel), and it also makes the covariance better conditioned in float64. Statistics with
different centres merge exactly by the identity

    Σ(x − c')(x − c')ᵀ = G + s·δᵀ + δ·sᵀ + n·δδᵀ,   δ = c − c',  s = Σ(x − c),

evaluated in float64, so sub-windows keep their own centres and a window is still exactly the sum
of its parts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from monitor.state import checks

logger = logging.getLogger(__name__)

__all__ = ["GRAM_PRECISIONS", "GramPrecision", "SufficientStats", "check_precision"]

GramPrecision = Literal["float64", "float32"]
GRAM_PRECISIONS: tuple[GramPrecision, ...] = ("float64", "float32")



def check_precision(precision: str) -> GramPrecision:
    """``precision`` if it names a supported product arithmetic, else ``ValueError``."""
    if precision not in GRAM_PRECISIONS:
        raise ValueError(f"precision must be one of {GRAM_PRECISIONS}, got {precision!r}")
    return precision


DEVICE_MIN_ROWS = 512
"""Batches of at least this many rows run their product on the configured CUDA device; smaller
ones stay on the CPU, where they cost less than the transfer."""

FLOAT32_BLOCK_ROWS = 4096
"""Rows per float32 product in ``float32`` precision: each block's XᵀX is summed in float32 inside
BLAS over at most this many rows, then added to the float64 accumulator, so rounding grows with
the block, never with the stream."""


class SufficientStats:
    """Running float64 sums over a stream of d-dimensional vectors.

    Parameters
    ----------
    dim : int
        The vector dimension ``d``.
    precision : {"float64", "float32"}
        Arithmetic of the per-batch product (x − c)ᵀ(x − c). ``float64`` (default) is exact to
        float64 rounding. ``float32`` runs the product in single precision, about 2× faster, on
        rows already shifted by the centre, and adds each block into the float64 accumulator;
        its error on every intrinsic metric is measured in docs/benchmarks.md. Every other sum is
        float64 in both modes.

    Attributes
    ----------
    count : int
        Number of vectors seen.
    vector_sum : ndarray, float64 (d,)
        Σ xᵢ.
    unit_sum : ndarray, float64 (d,)
        Σ xᵢ/‖xᵢ‖, the sum of the unit vectors (exact mean cosine similarity over all pairs).
    norm_sum, sq_norm_sum : float
        Σ ‖xᵢ‖ and Σ ‖xᵢ‖².
    norm_m2 : float
        Σ (‖xᵢ‖ − mean ‖x‖)², updated and merged about the mean (the norms' variance is
        ``norm_m2 / (n − 1)``; from the raw sums it would cancel on unit-norm rows).
    centre : ndarray, float64 (d,)
        The shift c of the second moment (zeros until the first batch; float32-representable).

    Notes
    -----
    ``update`` adds one batch with a single symmetric rank-k product (BLAS syrk via ``numpy.dot``),
    which writes only the upper triangle; only that triangle is kept, packed, and the full
    symmetric matrices are built when read, never per batch. Rows must have a non-zero norm
    (decoding rejects zero vectors); ``update`` raises ``ValueError`` rather than letting one
    poison ``unit_sum`` with NaN.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((100, 3))
    >>> stats = SufficientStats(3)
    >>> stats.update(x[:60]); stats.update(x[60:])
    >>> stats.count
    100
    >>> bool(np.allclose(stats.covariance(), np.cov(x.T)))
    True
    """

    def __init__(self, dim: int, precision: GramPrecision = "float64", device: str | None = None) -> None:
        if int(dim) < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.dim = int(dim)
        self.precision = check_precision(precision)
        self.device = device  # a torch CUDA device for large batches' products; None: CPU only
        self.count = 0
        self.vector_sum = np.zeros(self.dim, dtype=np.float64)
        self.unit_sum = np.zeros(self.dim, dtype=np.float64)
        self.norm_sum = 0.0
        self.sq_norm_sum = 0.0
        # Σ(‖x‖ − mean‖x‖)², kept about the running mean and merged exactly (Chan et al. 1979):
        # from raw sums, Σ‖x‖² − n·mean², it cancels to rounding noise on unit-norm rows, whose
        # norms spread by ~1e-8.
        self.norm_m2 = 0.0
        self.centre = np.zeros(self.dim, dtype=np.float64)
        # Σ(x − c), from the very rows the second moment saw (so both describe the same data).
        self._shifted_sum = np.zeros(self.dim, dtype=np.float64)
        # Σ(x − c)(x − c)ᵀ, upper triangle packed row by row (half the memory of a full matrix;
        # sub-windows hold ten of these per stream).
        self._moment_packed = np.zeros(_packed_size(self.dim), dtype=np.float64)

    # -- updating -------------------------------------------------------------------------

    def update(self, vectors: np.ndarray, norms: np.ndarray | None = None) -> None:
        """Add a batch of rows (float32 or float64, shape (n, d)).

        Parameters
        ----------
        vectors : ndarray (n, d)
            Finite rows with non-zero norm.
        norms : ndarray (n,), optional
            Precomputed Euclidean norms of the rows (saves one pass when the caller has them).
        """
        x = np.asarray(vectors)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {x.shape}")
        n = x.shape[0]
        if n == 0:
            return
        if norms is None:
            sq_norms = np.einsum("ij,ij->i", x, x, dtype=np.float64)
            row_norms = np.sqrt(sq_norms)
        else:
            row_norms = np.asarray(norms, dtype=np.float64)
            if row_norms.shape != (n,):
                raise ValueError(f"expected norms of shape ({n},), got {row_norms.shape}")
            sq_norms = row_norms * row_norms
        if not np.all(row_norms > 0.0):
            raise ValueError("vectors must be finite with non-zero norm (zero or NaN row found)")

        if self.count == 0:
            # Rounded to float32 so that float32 rows minus the centre is a float32 operation.
            self.centre = x.mean(axis=0, dtype=np.float64).astype(np.float32).astype(np.float64)
        if self.device is not None and n >= DEVICE_MIN_ROWS:
            shifted_sum, packed = _device_moment(x, self.centre, self.precision, self.device)
            self._moment_packed += packed
        else:
            upper = _upper_flat_indices(self.dim)
            if self.precision == "float32":
                shifted = np.subtract(x, self.centre.astype(np.float32), dtype=np.float32)
                block_rows = FLOAT32_BLOCK_ROWS
            else:
                shifted = np.subtract(x, self.centre, dtype=np.float64)  # one allocation: page faults cost
                block_rows = n
            for start in range(0, n, block_rows):
                block = shifted[start : start + block_rows]
                # numpy recognises the y.T @ y pattern and calls BLAS syrk (one triangle, mirrored);
                # a float32 block's product is summed into the float64 accumulator.
                self._moment_packed += np.dot(block.T, block).ravel().take(upper)
            shifted_sum = shifted.sum(axis=0, dtype=np.float64)
        self._shifted_sum += shifted_sum
        self.vector_sum += x.sum(axis=0, dtype=np.float64)
        # einsum, not BLAS: no float64 copy of a float32 batch, and no BLAS threads to wake (a
        # multi-threaded gemv stalls when kafka-python holds the other core).
        self.unit_sum += np.einsum("i,ij->j", 1.0 / row_norms, x, dtype=np.float64)
        batch_norm_mean = float(row_norms.mean())
        deviations = row_norms - batch_norm_mean
        self._add_norm_moment(n, batch_norm_mean, float(deviations @ deviations))
        self.norm_sum += float(row_norms.sum())
        self.sq_norm_sum += float(sq_norms.sum())
        self.count += n

    def merge(self, other: SufficientStats) -> SufficientStats:
        """Add ``other``'s sums into this one (statistics of the union of both streams)."""
        if other.dim != self.dim:
            raise ValueError(f"cannot merge stats of dim {other.dim} into dim {self.dim}")
        if other.count == 0:
            return self
        if self.count == 0:
            self.centre = other.centre.copy()
        self._add_shifted(other, other.centre - self.centre)
        return self

    def __iadd__(self, other: SufficientStats) -> SufficientStats:
        return self.merge(other)

    @classmethod
    def merged(cls, parts: Sequence[SufficientStats], precision: GramPrecision | None = None) -> SufficientStats:
        """The statistics of the union of ``parts`` (new object; parts are unchanged).

        All parts are shifted to one centre (the mean of the union, rounded to float32) with a
        single rank-2k product, which at d = 768 costs about as much as one packed addition,
        instead of a rank-2 update per part.
        """
        if not parts:
            raise ValueError("merged() needs at least one part")
        dim = parts[0].dim
        if any(part.dim != dim for part in parts):
            raise ValueError("cannot merge stats of different dims")
        out = cls(dim, precision or parts[0].precision)
        live = [part for part in parts if part.count]
        if not live:
            return out
        count = sum(part.count for part in live)
        total = sum((part.vector_sum for part in live), np.zeros(dim))  # 0 + first sum: the same bits as before
        out.centre = (total / count).astype(np.float32).astype(np.float64)
        deltas = np.stack([part.centre - out.centre for part in live], axis=1)  # (d, k)
        halves = np.stack([part._shifted_sum + 0.5 * part.count * (part.centre - out.centre) for part in live], axis=1)
        for part in live:
            out._add_sums(part)
            out._moment_packed += part._moment_packed
            out._shifted_sum += part._shifted_sum + part.count * (part.centre - out.centre)
        norm_mean = out.norm_sum / count  # every part's norms about the union's mean, in one sum
        out.norm_m2 = sum(part.norm_m2 + part.count * (part.norm_sum / part.count - norm_mean) ** 2 for part in live)
        if np.any(deltas):
            cross = deltas @ halves.T  # Σ δ·(s + n·δ/2)ᵀ; the shift term is this plus its transpose
            out._moment_packed += (cross + cross.T).ravel().take(_upper_flat_indices(dim))
        return out

    def copy(self) -> SufficientStats:
        """An independent deep copy (a few MB memcpy at d = 768)."""
        clone = SufficientStats(self.dim, self.precision, self.device)
        clone.merge(self)
        return clone

    def _add_norm_moment(self, count: int, norm_mean: float, norm_m2: float) -> None:
        """Fold in ``count`` norms of mean ``norm_mean`` and moment ``norm_m2`` (before the counts add)."""
        if self.count == 0:
            self.norm_m2 = norm_m2
            return
        delta = norm_mean - self.norm_sum / self.count
        self.norm_m2 += norm_m2 + delta * delta * self.count * count / (self.count + count)

    @property
    def norm_variance(self) -> float:
        """Unbiased variance of the row norms (count ≥ 2)."""
        if self.count < 2:
            raise ValueError(f"a variance needs at least 2 vectors, have {self.count}")
        return max(0.0, self.norm_m2) / (self.count - 1)

    def _add_sums(self, other: SufficientStats) -> None:
        if other.count:
            self._add_norm_moment(other.count, other.norm_sum / other.count, other.norm_m2)
        self.vector_sum += other.vector_sum
        self.unit_sum += other.unit_sum
        self.norm_sum += other.norm_sum
        self.sq_norm_sum += other.sq_norm_sum
        self.count += other.count

    def _add_shifted(self, other: SufficientStats, delta: np.ndarray) -> None:
        """Add ``other`` whose centre is this centre + ``delta``: its moment about our centre is
        G + s·δᵀ + δ·sᵀ + n·δδᵀ = G + δ·hᵀ + h·δᵀ with h = s + n·δ/2."""
        self._moment_packed += other._moment_packed
        if np.any(delta):
            half = other._shifted_sum + 0.5 * other.count * delta
            rows, cols = np.triu_indices(self.dim)
            self._moment_packed += delta[rows] * half[cols] + half[rows] * delta[cols]
        self._shifted_sum += other._shifted_sum + other.count * delta
        self._add_sums(other)

    # -- reading --------------------------------------------------------------------------

    @property
    def gram(self) -> np.ndarray:
        """XᵀX as a full symmetric float64 (d, d) array: Σ(x−c)(x−c)ᵀ + c·sᵀ + s·cᵀ + n·ccᵀ."""
        full = _unpack(self._moment_packed, self.dim)
        c, s = self.centre, self._shifted_sum
        if np.any(c):
            cross = np.outer(c, s + 0.5 * self.count * c)
            full += cross + cross.T  # a + b == b + a: exactly symmetric
        return full

    @property
    def mean(self) -> np.ndarray:
        """The mean vector μ = Σxᵢ / n (undefined for an empty stream)."""
        if self.count == 0:
            raise ValueError("mean of an empty stream is undefined")
        return self.vector_sum / self.count

    def covariance(self) -> np.ndarray:
        """Unbiased covariance (Σ(x−c)(x−c)ᵀ − n·(μ−c)(μ−c)ᵀ)/(n − 1), float64 (d, d); count ≥ 2."""
        n = self.count
        if n < 2:
            raise ValueError(f"covariance needs at least 2 vectors, have {n}")
        offset = self._shifted_sum / n  # μ − c, small: the centre is close to the mean
        cov = _unpack(self._moment_packed, self.dim)
        cov -= n * np.outer(offset, offset)
        cov /= n - 1
        return cov

    # -- checkpointing --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain numpy arrays and numbers, enough to rebuild an identical object."""
        return {
            "dim": self.dim,
            "precision": self.precision,
            "count": self.count,
            "vector_sum": self.vector_sum.copy(),
            "unit_sum": self.unit_sum.copy(),
            "norm_sum": self.norm_sum,
            "sq_norm_sum": self.sq_norm_sum,
            "norm_m2": self.norm_m2,
            "centre": self.centre.copy(),
            "shifted_sum": self._shifted_sum.copy(),
            "moment_packed": self._moment_packed.copy(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SufficientStats:
        """Rebuild from ``state_dict()`` output, validating shapes and values (``ValueError``:
        monitor/state/checks.py).

        A state without a centre (written before shifting existed) holds the raw XᵀX, which is
        the moment about c = 0: it loads as such. A state without ``norm_m2`` (written before the
        norms' moment was kept about their mean) gets it from the raw sums, as it was computed then.
        """
        stats = cls(checks.integer(state["dim"], "stats dim", 1), state.get("precision", "float64"))
        d = stats.dim
        vector_sum = checks.finite_array(state["vector_sum"], (d,), "vector_sum")
        if "centre" in state:
            packed = checks.finite_array(state["moment_packed"], (_packed_size(d),), "moment_packed")
            centre = checks.finite_array(state["centre"], (d,), "centre")
            shifted_sum = checks.finite_array(state["shifted_sum"], (d,), "shifted_sum")
        else:
            packed = checks.finite_array(state["gram_packed"], (_packed_size(d),), "gram_packed")
            centre = np.zeros(d)
            shifted_sum = vector_sum
        stats._moment_packed = packed.copy()
        stats.centre = centre.copy()
        stats._shifted_sum = shifted_sum.copy()
        stats.vector_sum = vector_sum.copy()
        stats.unit_sum = checks.finite_array(state["unit_sum"], (d,), "unit_sum").copy()
        stats.norm_sum = checks.finite(state["norm_sum"], "norm_sum", low=0.0)
        stats.sq_norm_sum = checks.finite(state["sq_norm_sum"], "sq_norm_sum", low=0.0)
        count = checks.count(state["count"], "stats count")
        if "norm_m2" in state:
            stats.norm_m2 = checks.finite(state["norm_m2"], "norm_m2")  # may round a hair below 0
        elif count:
            stats.norm_m2 = max(0.0, stats.sq_norm_sum - stats.norm_sum * stats.norm_sum / count)
        stats.count = count
        return stats

    def __repr__(self) -> str:
        return f"SufficientStats(dim={self.dim}, count={self.count}, precision={self.precision!r})"


def _device_moment(
    x: np.ndarray, centre: np.ndarray, precision: GramPrecision, device: str
) -> tuple[np.ndarray, np.ndarray]:
    """Σ(x − c) and the packed Σ(x − c)(x − c)ᵀ computed on a torch device, with the same
    arithmetic as the CPU path: rows cross the bus as they came (float32), are shifted there,
    and only the packed triangle comes back."""
    import torch  # only where a device is configured: the CPU path never needs it

    dtype = torch.float64 if precision == "float64" else torch.float32
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        dtype = torch.float64  # someone allowed TF32 (10-bit mantissas): not for these sums
    rows = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    shifted = rows.to(dtype) - torch.from_numpy(centre).to(device=device, dtype=dtype)
    block_rows = FLOAT32_BLOCK_ROWS if dtype == torch.float32 else shifted.shape[0]
    moment = None
    for start in range(0, shifted.shape[0], block_rows):
        block = shifted[start : start + block_rows]
        part = (block.T @ block).to(torch.float64)
        moment = part if moment is None else moment + part
    assert moment is not None
    packed = moment.flatten()[_device_upper_indices(x.shape[1], device)]
    return shifted.sum(dim=0, dtype=torch.float64).cpu().numpy(), packed.cpu().numpy()


@functools.lru_cache(maxsize=4)
def _device_upper_indices(dim: int, device: str) -> Any:
    import torch

    return torch.from_numpy(_upper_flat_indices(dim)).to(device)


def _packed_size(dim: int) -> int:
    return dim * (dim + 1) // 2


def _unpack(packed: np.ndarray, dim: int) -> np.ndarray:
    """The full symmetric (dim, dim) matrix of a packed upper triangle."""
    full = np.empty((dim, dim), dtype=np.float64)
    flat = full.ravel()
    rows, cols = np.triu_indices(dim)  # not cached: read per refresh, not per batch (4.7 MB at 768)
    flat[rows * dim + cols] = packed
    flat[cols * dim + rows] = packed
    return full


@functools.lru_cache(maxsize=16)
def _upper_flat_indices(dim: int) -> np.ndarray:
    """Flat indices of the upper triangle (row-major, i <= j) of a (dim, dim) matrix (every
    batch gathers with them: cached, and intp so that ``take`` needs no converted copy)."""
    rows, cols = np.triu_indices(dim)
    return rows * dim + cols
