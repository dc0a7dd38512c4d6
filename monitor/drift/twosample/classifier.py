"""Domain-classifier test: can a small model tell window rows from reference rows?

A classifier is trained on one half of both samples and scored on the other half. Under no drift
the held-out scores of window and reference rows are exchangeable, so the held-out AUC has the
Mann–Whitney null (``AUC = U / (m n)``), which gives a valid p-value at any level without
permutations (:mod:`monitor.drift.twosample.heldout`, which the MMD and centroid tests share).
The AUC itself is an interpretable effect size: 0.5 is "indistinguishable", 1.0 "a different
population".

Model: L2-regularised logistic regression with balanced class weights, fitted by L-BFGS
(:mod:`monitor.drift.twosample.logistic`: scikit-learn's ``LogisticRegression`` objective and
solver, without scikit-learn) on standardised features, plus the squares of the top principal
components (of the training rows; in the suite, of the cycle's pooled rows, the KS test's axes).
Why not an MLP: logistic regression is
convex, so its result does not depend on an initialisation seed; it trains in well under a
second on a few thousand 1024-d rows on two cores; and it needs no tuning. The squared
components give it what a linear model lacks, sensitivity to a change of spread along the main
directions (an anisotropy change), at the cost of a few extra features. Nonlinear differences
are MMD's job.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.heldout import rank_test, split_indices
from monitor.drift.twosample.logistic import fit_balanced_logistic
from monitor.drift.twosample.spectrum import PooledScatter, sketched_eigenvectors

logger = logging.getLogger(__name__)

DEFAULT_SQUARED_COMPONENTS = 16


def classifier_test(
    x: np.ndarray,
    y: np.ndarray,
    *,
    alpha: float = 0.05,
    train_fraction: float = 0.5,
    regularization: float = 0.1,
    squared_components: int = DEFAULT_SQUARED_COMPONENTS,
    max_iter: int = 500,
    seed: int | np.random.SeedSequence | None = 0,
    pooled: PooledScatter | None = None,
) -> TestResult:
    """Held-out AUC of a logistic-regression classifier separating ``x`` (window) from ``y`` (reference).

    ``regularization`` is scikit-learn's ``C`` (smaller is stronger; the same objective). p-value: one-sided
    Mann–Whitney U test that window rows score higher than reference rows on the held-out half.
    Deterministic given ``seed`` (it fixes the split; the fit itself is deterministic).
    ``pooled``: the cycle's pooled scatter of ``x`` and ``y``; the squared components are then its
    leading axes (shared with the KS basis, no decomposition of their own) instead of the training
    rows'. Either way they are blind to the labels of the held-out rows, which is what the
    Mann–Whitney null needs: the pooled axes are a symmetric function of all rows, so given the
    pooled rows and the training labels the held-out labels are still a uniform relabelling.

    Examples
    --------
    >>> rng = np.random.default_rng(11)
    >>> ref = rng.normal(size=(400, 10))
    >>> classifier_test(rng.normal(size=(400, 10)), ref).detected
    False
    >>> r = classifier_test(rng.normal(size=(400, 10)) + 0.3, ref)
    >>> r.detected, round(r.statistic, 2)
    (True, 0.69)
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"samples must be 2-D with the same dimension; got {x.shape} and {y.shape}")
    started = time.perf_counter()
    m, n = len(x), len(y)
    x_order, y_order = split_indices(m, n, np.random.default_rng(seed), train_fraction)
    m_train, n_train = int(m * train_fraction), int(n * train_fraction)
    # one feature matrix for fit and scores, [rows, squared components], built in place: the
    # training rows first (window, reference), the held-out ones after
    d = x.shape[1]
    components = min(squared_components, d)
    features = np.empty((m + n, d + components))
    rows = features[:, :d]
    cut = m_train + n_train
    np.take(x, x_order[:m_train], axis=0, out=rows[:m_train])
    np.take(y, y_order[:n_train], axis=0, out=rows[m_train:cut])
    np.take(x, x_order[m_train:], axis=0, out=rows[cut : cut + m - m_train])
    np.take(y, y_order[n_train:], axis=0, out=rows[cut + m - m_train :])
    train = rows[:cut]
    if components > 0:
        if pooled is not None:
            mean, axes = pooled.mean, pooled.leading_axes(components)
        else:
            mean = train.mean(axis=0)
            axes = sketched_eigenvectors(train.T @ train - cut * np.outer(mean, mean), components)
        squares = features[:, d:]
        np.matmul(rows, axes, out=squares)
        squares -= mean @ axes
        np.square(squares, out=squares)
    fitted = features[:cut]
    centre = fitted.mean(axis=0)
    scale = fitted.std(axis=0)
    scale[~(scale > 0)] = 1.0  # a constant feature: left as it is, as StandardScaler does
    features -= centre
    features /= scale
    labels = np.r_[np.ones(m_train), np.zeros(n_train)]
    model = fit_balanced_logistic(fitted, labels, c=regularization, max_iter=max_iter)
    converged = model.converged
    if not converged:
        logger.info("classifier: lbfgs did not converge in %d iterations; the test stays valid", max_iter)

    scores = model.decision_function(features[cut:])
    ranked = rank_test(scores[: m - m_train], scores[m - m_train :])
    auc, p_value = ranked.auc, ranked.p_value
    elapsed = time.perf_counter() - started
    logger.debug("classifier: auc=%.3f p=%.3g in %.2fs", auc, p_value, elapsed)
    return TestResult.at_level(
        "classifier", auc, p_value, alpha,
        extra={
            "auc": auc,
            "train_rows": m_train + n_train,
            "null": "heldout",
            "p_value_floor": 0.0,
            "test_rows": ranked.test_rows,
            "converged": converged,
            "squared_components": components,
            "window_size": len(x),
            "reference_size": len(y),
            "seconds": elapsed,
        },
    )
