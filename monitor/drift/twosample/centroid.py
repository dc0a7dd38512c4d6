"""Centroid test: cosine distance between the window's and the reference's mean vectors.

The cheapest test and the easiest to explain ("the average embedding turned by x"); most real
drifts (new topics, a new model, a preprocessing change) move the mean. It is blind to changes
that keep the mean direction: a spread or anisotropy change, a rotation about the mean, a pure
rescaling of all vectors (cosine ignores length).

p-value, one of three nulls:

- ``permutation``: the pooled rows are relabelled at random ``permutations`` times, and the
  window/reference sums of all relabellings come from one matrix product
  (``labels (P+1, N) @ pooled (N, d)``), in chunks so memory stays ``O(chunk·N + chunk·d)``.
  Exact at any sample size, but a p-value never goes below ``1 / (1 + permutations)``.
- ``analytic``: the squared distance between the means, ``T = ‖x̄ - ȳ‖²``, against the normal
  approximation of its permutation distribution: a weighted sum of χ²₁ variables whose weights are
  the eigenvalues of the *pooled* rows' sample covariance times ``1/m + 1/n``
  (:mod:`monitor.drift.twosample.quadratic_null`). That is the covariance of ``x̄ - ȳ`` over every
  relabelling of the pooled rows, exactly, so the null is the permutation test's, read off its
  first two moments instead of drawn: no permutations, every row used, any alpha. The top
  eigenvalues come from the pooled scatter the KS test decomposes anyway
  (:class:`~monitor.drift.twosample.spectrum.PooledScatter`), the rest enter by their sum and sum
  of squares. The one approximation is the normal shape of the relabelled mean difference (the
  central limit theorem for sampling without replacement; rows are bounded or light-tailed and a
  window holds hundreds). docs/drift.md ("The centroid test's analytic null") has the measured
  false-alarm rates. Unlike the cosine distance, ``T`` sees a change of length too: it tests the
  mean vector itself.
- ``heldout`` (:mod:`monitor.drift.twosample.heldout`): the mean directions of one half of each
  sample give a witness, ``cos(z, window mean) - cos(z, reference mean)``, and the other halves
  are ranked by it. Exact at any alpha, but half the rows only fit and half only test.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Literal

import numpy as np

from monitor.deadline import Deadline
from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.heldout import direction_witness, heldout_rank_test, split_halves
from monitor.drift.twosample.permutation import check_permutation_budget, sequential_permutation_test
from monitor.drift.twosample.quadratic_null import weighted_chi2_sf
from monitor.drift.twosample.reference_cache import ReferenceCache
from monitor.drift.twosample.spectrum import PooledScatter

logger = logging.getLogger(__name__)

DEFAULT_PERMUTATIONS = 500
DEFAULT_STOP_AFTER = 10
SPECTRUM_COMPONENTS = 50  # analytic null: eigenvalues taken one by one (the KS test's default components)
_CHUNK = 256


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``1 - cos(a, b)`` row-wise, computed as ``|â - b̂|² / 2`` to stay accurate near 0.

    Examples
    --------
    >>> float(cosine_distance(np.array([1.0, 0.0]), np.array([0.0, 2.0])))
    1.0
    """
    a_unit = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b_unit = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return 0.5 * np.sum((a_unit - b_unit) ** 2, axis=-1)


def mean_distance_test(
    x_mean: np.ndarray, y_mean: np.ndarray, m: int, n: int, pooled: PooledScatter,
    spectrum_components: int = SPECTRUM_COMPONENTS,
) -> tuple[float, float, float]:
    """The analytic null's test of the squared distance between two sample means (module docstring):
    ``(|x̄ - ȳ|², its p-value, its null mean)``, from the top ``spectrum_components`` eigenvalues of
    ``pooled``, the pooled scatter of the ``m`` window and ``n`` reference rows."""
    spectrum = pooled.covariance_spectrum(min(spectrum_components, len(x_mean)))
    factor = 1.0 / m + 1.0 / n
    distance = float(np.sum((x_mean - y_mean) ** 2))
    p_value = weighted_chi2_sf(distance, spectrum.top * factor,
                               rest=(spectrum.rest_sum * factor, spectrum.rest_squares * factor**2))
    return distance, p_value, (float(spectrum.top.sum()) + spectrum.rest_sum) * factor


def centroid_test(
    x: np.ndarray,
    y: np.ndarray,
    *,
    alpha: float = 0.05,
    permutations: int = DEFAULT_PERMUTATIONS,
    stop_after: int | None = DEFAULT_STOP_AFTER,
    seed: int | np.random.SeedSequence | None = 0,
    null: Literal["permutation", "heldout", "analytic"] = "permutation",
    deadline: Deadline | None = None,
    reference: ReferenceCache | None = None,
    pooled: PooledScatter | None = None,
    spectrum_components: int = SPECTRUM_COMPONENTS,
) -> TestResult:
    """Test on the cosine distance between ``mean(x)`` (m, d) and ``mean(y)`` (n, d).

    At most ``permutations`` relabellings; with ``stop_after`` set, the Besag–Clifford sequential
    p-value stops once that many reached the observed distance (``None`` draws them all); none
    after ``deadline``. ``null="heldout"``: the held-out direction witness's p-value instead;
    ``null="analytic"``: the squared mean distance's p-value under the normal approximation of its
    permutation distribution (module docstring), from the top ``spectrum_components`` eigenvalues of
    ``pooled`` (the cycle's pooled scatter, shared with the KS test; built here, with ``reference``'s
    cached pieces, when not given).

    Examples
    --------
    >>> rng = np.random.default_rng(5)
    >>> ref = rng.normal(0.2, 1.0, size=(500, 16))
    >>> centroid_test(rng.normal(0.2, 1.0, size=(500, 16)), ref, permutations=200).detected
    False
    >>> turned = rng.normal(0.2, 1.0, size=(500, 16)) + np.r_[0.4, np.zeros(15)]
    >>> r = centroid_test(turned, ref, permutations=200)
    >>> r.detected, r.p_value
    (True, 0.004975124378109453)
    >>> centroid_test(turned, ref, null="heldout").p_value < 1e-4
    True
    >>> centroid_test(turned, ref, null="analytic").p_value < 1e-6  # every row: 25 times smaller here
    True
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"samples must be 2-D with the same dimension; got {x.shape} and {y.shape}")
    if len(x) < 1 or len(y) < 1:
        raise ValueError("both samples need at least one row")
    check_permutation_budget(permutations, stop_after)
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    m, n = len(x), len(y)
    x_mean, y_mean = x.mean(axis=0), y.mean(axis=0)
    if not (np.linalg.norm(x_mean) > 0 and np.linalg.norm(y_mean) > 0):
        raise ValueError("a sample mean is the zero vector; its direction is undefined")
    observed = float(cosine_distance(x_mean, y_mean))
    base_extra = {
        "window_mean_norm": float(np.linalg.norm(x_mean)),
        "reference_mean_norm": float(np.linalg.norm(y_mean)),
        "window_size": m,
        "reference_size": n,
    }
    if null == "heldout":
        ranked = heldout_rank_test(split_halves(x, y, rng), direction_witness)
        extra = {"null": "heldout", "auc": ranked.auc, "p_value_floor": 0.0, "test_rows": ranked.test_rows}
        return TestResult.at_level(
            "centroid", observed, ranked.p_value, alpha,
            extra={**extra, **base_extra, "seconds": time.perf_counter() - started},
        )
    if null == "analytic":
        pooled = pooled or PooledScatter(x, y, reference)
        distance, p_value, null_mean = mean_distance_test(x_mean, y_mean, m, n, pooled, spectrum_components)
        return TestResult.at_level(
            "centroid", observed, p_value, alpha,
            extra={"null": "analytic", "p_value_floor": 0.0, "mean_distance_squared": distance,
                   "null_mean": null_mean, **base_extra,
                   "seconds": time.perf_counter() - started},
        )
    if null != "permutation":
        raise ValueError(f"null must be 'permutation', 'heldout' or 'analytic', got {null!r}")

    rows = np.concatenate([x, y])
    total = rows.sum(axis=0)

    def null_statistics(labels: np.ndarray) -> np.ndarray:
        x_sums = labels @ rows
        return cosine_distance(x_sums, total - x_sums)

    base = np.zeros(m + n)
    base[:m] = 1.0
    outcome = sequential_permutation_test(
        observed, null_statistics, base, rng, permutations=permutations, stop_after=stop_after,
        chunk_sizes=itertools.repeat(_CHUNK), deadline=deadline,
    )
    p_value = outcome.p_value
    elapsed = time.perf_counter() - started
    logger.debug("centroid: distance=%.3g p=%.3g in %.2fs", observed, p_value, elapsed)
    return TestResult.at_level(
        "centroid", observed, p_value, alpha,
        extra={**outcome.diagnostics(permutations), **base_extra, "seconds": elapsed},
    )
