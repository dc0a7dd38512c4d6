"""The classifier test's logistic regression against scikit-learn's, the model it replaces."""

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression

from monitor.drift.twosample.logistic import fit_balanced_logistic


@pytest.mark.parametrize(
    ("rows", "positives", "dim", "c", "shift"),
    [(1000, 500, 400, 0.1, 0.0), (1000, 500, 400, 0.1, 0.1), (700, 100, 30, 1.0, 0.5), (300, 250, 8, 10.0, 1.0)],
)
def test_the_same_coefficients_as_scikit_learns_balanced_lbfgs(rows: int, positives: int, dim: int, c: float,
                                                               shift: float) -> None:
    rng = np.random.default_rng(rows + dim)
    x = rng.normal(size=(rows, dim)) * rng.uniform(0.2, 3.0, size=dim)
    x[:positives] += shift
    labels = np.r_[np.ones(positives), np.zeros(rows - positives)]

    ours = fit_balanced_logistic(x, labels, c=c)
    theirs = LogisticRegression(C=c, class_weight="balanced", max_iter=500).fit(x, labels)

    assert ours.converged
    assert ours.iterations == theirs.n_iter_[0]
    np.testing.assert_allclose(ours.coef, theirs.coef_[0], rtol=0, atol=1e-9)
    assert ours.intercept == pytest.approx(theirs.intercept_[0], abs=1e-9)
    np.testing.assert_allclose(ours.decision_function(x), theirs.decision_function(x), rtol=0, atol=1e-8)


def test_a_capped_fit_says_it_did_not_converge_as_scikit_learn_warns() -> None:
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(size=(200, 20)) + 0.3, rng.normal(size=(200, 20))]
    labels = np.r_[np.ones(200), np.zeros(200)]

    with pytest.warns(ConvergenceWarning):
        LogisticRegression(C=0.1, class_weight="balanced", max_iter=2).fit(x, labels)
    assert not fit_balanced_logistic(x, labels, c=0.1, max_iter=2).converged
    assert fit_balanced_logistic(x, labels, c=0.1).converged


@pytest.mark.parametrize(
    ("labels", "c", "message"),
    [(np.ones(4), 1.0, "both classes"), (np.r_[1.0, 0, 1, 0], 0.0, "c must be positive"),
     (np.r_[1.0, 0, 1], 1.0, "labels")],
)
def test_bad_arguments_are_named(labels: np.ndarray, c: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_balanced_logistic(np.zeros((4, 2)), labels, c=c)
