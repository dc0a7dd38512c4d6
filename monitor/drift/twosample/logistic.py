"""L2-regularised logistic regression with balanced class weights: the classifier test's model.

The same objective and the same optimiser as scikit-learn's ``LogisticRegression(C=C,
class_weight="balanced", solver="lbfgs")``, so the same coefficients (to rounding; tested against
scikit-learn in ``tests/drift/test_logistic.py``), without scikit-learn: importing
``sklearn.linear_model`` cost the daemon 0.2-0.6 s of start-up and 22 MB, and its per-call
checks were about 30% of a fit on one cycle's rows (8.1 against 5.7 ms at 1,000 × 400).

The objective, with ``s_i`` the balanced weights (``N / (2 N_class)``) and ``S = Σ s_i``::

    f(w, b) = (1/S) Σ s_i [log(1 + exp(r_i)) - y_i r_i] + (1 / (2 C S)) |w|²,   r_i = x_i·w + b

minimised by L-BFGS-B from zero with scikit-learn's options (``gtol`` 1e-4, ``ftol`` 64 ε,
``maxls`` 50). It is strictly convex, so the minimiser does not depend on where it starts.

numpy and scipy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.special import expit

TOLERANCE = 1e-4  # the projected gradient's sup norm at which L-BFGS-B stops (scikit-learn's ``tol``)


@dataclass(frozen=True)
class LogisticFit:
    """A fitted model: ``coef`` (p,), ``intercept``, the L-BFGS iterations and whether it converged."""

    coef: np.ndarray
    intercept: float
    iterations: int
    converged: bool

    def decision_function(self, features: np.ndarray) -> np.ndarray:
        """The log-odds of the positive class for each row of ``features`` (n, p)."""
        return features @ self.coef + self.intercept


def fit_balanced_logistic(features: np.ndarray, labels: np.ndarray, *, c: float, max_iter: int = 500) -> LogisticFit:
    """Fit the model to ``features`` (n, p, float64) and 0/1 ``labels`` (n,); ``c`` is scikit-learn's ``C``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = np.r_[rng.normal(size=(100, 2)) + [1.0, 0.0], rng.normal(size=(300, 2))]
    >>> fit = fit_balanced_logistic(x, np.r_[np.ones(100), np.zeros(300)], c=1.0)
    >>> fit.converged, bool(fit.coef[0] > 0.5), bool(abs(fit.coef[1]) < 0.3)
    (True, True, True)
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if x.ndim != 2 or y.shape != (len(x),):
        raise ValueError(f"features must be (n, p) and labels (n,); got {x.shape} and {y.shape}")
    positives = float(y.sum())
    if not 0 < positives < len(y):
        raise ValueError("labels must hold both classes")
    if not c > 0:
        raise ValueError(f"c must be positive, got {c}")
    n, p = x.shape
    weights = np.where(y > 0, n / (2.0 * positives), n / (2.0 * (n - positives)))
    total = float(weights.sum())
    weights /= total  # folded in once: each row's share of the mean loss
    l2 = 1.0 / (c * total)
    xt = np.ascontiguousarray(x.T)
    gradient = np.empty(p + 1)

    def loss_and_gradient(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w = theta[:p]
        raw = x @ w + theta[p]
        loss = float(weights @ (np.logaddexp(0.0, raw) - y * raw)) + 0.5 * l2 * float(w @ w)
        pointwise = (expit(raw) - y) * weights
        np.matmul(xt, pointwise, out=gradient[:p])
        gradient[:p] += l2 * w
        gradient[p] = pointwise.sum()
        return loss, gradient.copy()

    result = optimize.minimize(
        loss_and_gradient, np.zeros(p + 1), method="L-BFGS-B", jac=True,
        options={"maxiter": max_iter, "maxls": 50, "gtol": TOLERANCE, "ftol": 64 * np.finfo(float).eps},
    )
    theta = np.asarray(result.x, dtype=np.float64)
    return LogisticFit(theta[:p].copy(), float(theta[p]), int(result.nit), result.status == 0)
