"""Principal axes and eigenvalues of sample scatter matrices, and the pooled scatter the drift tests share.

The KS test's ``pca_pooled`` basis, the classifier's squared components and the centroid test's
analytic null all need the top of a d × d scatter's spectrum. :class:`PooledScatter` holds the
window and reference rows' pooled mean and centred scatter for one cycle and computes its top
eigenpairs once (:func:`sketched_eigenpairs`), so the KS basis and the centroid's null weights
come from one decomposition. It is a symmetric function of the pooled rows, which the KS
p-values' exactness and the centroid's permutation-style null both need.

numpy and scipy only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import linalg

from monitor.drift.twosample.reference_cache import ReferenceCache

SKETCH_ITERATIONS = 2  # subspace iterations of the pooled basis (sketched_eigenvectors)
SKETCH_OVERSAMPLING = 16  # extra columns of its subspace
SKETCH_SEED = 20261129  # its Gaussian test matrix: a constant, so the basis depends on the data alone


def pca_basis(sample: np.ndarray, components: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean (d,) and the top ``components`` principal axes (d, p) of ``sample``, via the d × d scatter.

    An eigendecomposition of the d × d scatter matrix is cheaper than an SVD of the sample when
    rows outnumber dimensions (d ≤ 1024 here); float64 throughout.
    """
    data = np.asarray(sample, dtype=np.float64)
    mean = data.mean(axis=0)
    centred = data - mean
    return mean, sketched_eigenvectors(centred.T @ centred, components)


def top_eigenvectors(scatter: np.ndarray, components: int) -> np.ndarray:
    """The ``components`` eigenvectors (d, p) of the symmetric ``scatter`` with the largest eigenvalues, largest first.

    Only those are computed (LAPACK ``dsyevr`` on an index range: about 0.7 of a full ``eigh`` at
    d = 384, p = 50). An eigenvector's sign is arbitrary either way; every use here is
    sign-blind (two-sided KS statistics, squared projections).

    Examples
    --------
    >>> top_eigenvectors(np.diag([1.0, 3.0, 2.0]), 2).round(6).tolist()
    [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    """
    return top_eigenpairs(scatter, components)[1]


def top_eigenpairs(scatter: np.ndarray, components: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_eigenvectors` with their eigenvalues (p,), largest first."""
    d = scatter.shape[0]
    components = min(components, d)
    if components < 1:
        return np.zeros(0), np.zeros((d, 0))
    eigenvalues, eigenvectors = linalg.eigh(scatter, subset_by_index=[d - components, d - 1], driver="evr")
    order = np.argsort(eigenvalues, kind="stable")[::-1]
    return eigenvalues[order], eigenvectors[:, order]


def sketched_eigenvectors(scatter: np.ndarray, components: int, iterations: int = SKETCH_ITERATIONS) -> np.ndarray:
    """Approximate top ``components`` eigenvectors (d, p) of the symmetric ``scatter``, largest first
    (:func:`sketched_eigenpairs`'s vectors)."""
    return sketched_eigenpairs(scatter, components, iterations)[1]


def sketched_eigenpairs(
    scatter: np.ndarray, components: int, iterations: int = SKETCH_ITERATIONS
) -> tuple[np.ndarray, np.ndarray]:
    """Approximate top ``components`` eigenvalues (p,) and eigenvectors (d, p) of the symmetric ``scatter``,
    largest first.

    Randomised subspace iteration (Halko, Martinsson & Tropp 2011, algorithm 4.4): a fixed
    Gaussian ``d × (p + SKETCH_OVERSAMPLING)`` test matrix (drawn from a constant seed, so it does
    not depend on the data), ``iterations`` multiplications by ``scatter`` with a QR after each,
    then the Ritz vectors of ``scatter`` in that subspace. About 4 ms at d = 384, p = 50, against
    13-19 ms for LAPACK's top eigenvectors, because only ``d × 66`` products are taken; the
    leading axes are accurate to rounding, the last few mix with their neighbours where the
    spectrum is flat. The result is a function of ``scatter`` alone: built from the pooled
    scatter, it is a symmetric function of the pooled rows, which is all that the KS p-values'
    exactness needs (module docstring). Falls back to :func:`top_eigenvectors` when the subspace
    would be more than half of ``d``.

    The eigenvalues are the Ritz values, each at most the true one (they are Rayleigh quotients).

    Examples
    --------
    >>> scatter = np.diag(np.r_[50.0, 40.0, 30.0, 20.0, 10.0, np.ones(195)])
    >>> values, axes = sketched_eigenpairs(scatter, 5)
    >>> bool(np.allclose(np.abs(axes[:5]), np.eye(5), atol=1e-3))  # the 5th mixes in 1e-5 of the 6th onwards
    True
    >>> values.round(3).tolist()  # the last two 2e-6 and 7e-5 below their true values
    [50.0, 40.0, 30.0, 20.0, 10.0]
    """
    d = scatter.shape[0]
    components = min(components, d)
    width = components + SKETCH_OVERSAMPLING
    if components < 1 or 2 * width > d:
        return top_eigenpairs(scatter, components)
    basis = _orthonormal(scatter @ _test_matrix(d, width))
    for _ in range(iterations):
        basis = _orthonormal(scatter @ basis)
    eigenvalues, vectors = linalg.eigh(basis.T @ scatter @ basis, check_finite=False)
    top = np.argsort(eigenvalues, kind="stable")[::-1][:components]
    return eigenvalues[top], basis @ vectors[:, top]


def _orthonormal(columns: np.ndarray) -> np.ndarray:
    q, _ = linalg.qr(columns, mode="economic", overwrite_a=True, check_finite=False)
    return q


@functools.lru_cache(maxsize=16)
def _test_matrix(d: int, width: int) -> np.ndarray:
    matrix = np.random.default_rng(SKETCH_SEED).standard_normal((d, width))
    matrix.flags.writeable = False
    return matrix


@dataclass(frozen=True)
class Spectrum:
    """Eigenvalues of a covariance: the ``top`` ones (largest first) and the sum and sum of squares of the rest."""

    top: np.ndarray
    rest_sum: float
    rest_squares: float


class PooledScatter:
    """The pooled rows of a window ``x`` (m, d) and a reference ``y`` (n, d): mean, centred scatter, top eigenpairs.

    The scatter is ``Σ (z - z̄)(z - z̄)ᵀ`` over the ``m + n`` pooled rows, in float64. With
    ``reference`` (the cached pieces of ``y``, its scatter ``S_y`` about its own mean ``ȳ``) it is
    ``(X - ȳ)ᵀ (X - ȳ) + S_y - N s sᵀ`` with ``s = z̄ - ȳ``, and the reference's share is not
    recomputed. Every term is about ``ȳ``, not the origin: ``Xᵀ X + Yᵀ Y - N z̄ z̄ᵀ`` lost the
    spread of a column with an offset of 10⁸ to cancellation (an analytic p-value of 0.63 where
    the direct computation gives 0.83).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(30, 4)), rng.normal(size=(50, 4))
    >>> pooled = PooledScatter(x, y)
    >>> bool(np.allclose(pooled.scatter / (pooled.size - 1), np.cov(np.r_[x, y].T)))
    True
    >>> spectrum = pooled.covariance_spectrum(2)
    >>> bool(np.isclose(spectrum.top.sum() + spectrum.rest_sum, np.trace(np.cov(np.r_[x, y].T))))
    True
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, reference: ReferenceCache | None = None):
        x = np.asarray(x, dtype=np.float64)
        self.size = len(x) + len(y)
        if reference is None:
            data = np.concatenate([x, np.asarray(y, dtype=np.float64)])
            self.mean = data.mean(axis=0)
            centred = data - self.mean
            self.scatter = centred.T @ centred
        else:
            shifted = x - reference.mean
            shift = shifted.sum(axis=0) / self.size
            self.mean = reference.mean + shift
            self.scatter = shifted.T @ shifted + reference.scatter - self.size * np.outer(shift, shift)
        self._top: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # (rows x, rows y, width) -> their coordinates; the rows are kept so their ids stay theirs
        self._projected: list[tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray]] = []

    def top(self, components: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`sketched_eigenpairs` of the scatter, computed once per ``components``."""
        found = self._top.get(components)
        if found is None:
            found = self._top[components] = sketched_eigenpairs(self.scatter, components)
        return found

    def leading_axes(self, components: int) -> np.ndarray:
        """The top ``components`` eigenvectors (d, p): the leading columns of a larger top already
        computed this cycle (the KS basis's), else :meth:`top` of ``components``."""
        wider = [k for k in self._top if k >= components]
        return self.top(min(wider) if wider else components)[1][:, :components]

    def projected(self, x: np.ndarray, y: np.ndarray, components: int) -> tuple[np.ndarray, np.ndarray]:
        """The centred coordinates of ``x`` and ``y`` (float64) on the top ``components`` axes, ``(m, p)`` and
        ``(n, p)``: the leading columns of wider ones already computed for the same two arrays this cycle
        (the KS test's, which the scale screen reads), else ``x A - z̄ A`` (no centred copy of the rows)."""
        wider = [(k, xp, yp) for (a, b, k, xp, yp) in self._projected if a is x and b is y and k >= components]
        if wider:
            _, x_proj, y_proj = min(wider, key=lambda found: found[0])
            return x_proj[:, :components], y_proj[:, :components]
        axes = self.top(components)[1]
        centre = self.mean @ axes
        x_proj, y_proj = x @ axes - centre, y @ axes - centre
        self._projected.append((x, y, components, x_proj, y_proj))
        return x_proj, y_proj

    def covariance_spectrum(self, components: int) -> Spectrum:
        """The pooled sample covariance's (``N - 1`` divisor) top ``components`` eigenvalues and the rest's
        sum and sum of squares (the trace and the squared Frobenius norm less the top ones')."""
        if self.size < 2:
            raise ValueError(f"a covariance needs at least 2 rows, got {self.size}")
        values = np.clip(self.top(components)[0], 0.0, None) / (self.size - 1)
        if len(values) == len(self.scatter):  # every eigenvalue one by one: no rest
            return Spectrum(values, 0.0, 0.0)
        trace = float(np.trace(self.scatter)) / (self.size - 1)
        squares = float(np.sum(self.scatter * self.scatter)) / (self.size - 1) ** 2
        rest_sum, rest_squares = trace - float(values.sum()), squares - float(np.dot(values, values))
        return Spectrum(values, max(rest_sum, 0.0), max(rest_squares, 0.0))
