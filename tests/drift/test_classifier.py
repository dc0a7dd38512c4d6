"""Domain-classifier test: held-out AUC, its Mann–Whitney p-value, what the squared PCs add."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.drift.twosample.classifier import classifier_test
from monitor.drift.twosample.spectrum import PooledScatter


def test_flags_a_mean_shift_and_stays_quiet_on_the_null() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(600, 32))
    quiet = classifier_test(rng.normal(size=(600, 32)), reference, alpha=0.01)
    shifted = classifier_test(rng.normal(size=(600, 32)) + 0.2, reference, alpha=0.01)
    assert not quiet.detected and 0.4 < quiet.statistic < 0.6
    assert shifted.detected and shifted.statistic > 0.7
    assert quiet.extra["converged"] and shifted.extra["converged"]


def test_auc_is_u_over_the_number_of_pairs() -> None:
    rng = np.random.default_rng(1)
    result = classifier_test(rng.normal(size=(81, 5)) + 0.5, rng.normal(size=(60, 5)), train_fraction=0.5)
    # held out: 41 window rows and 30 reference rows, so the AUC is a multiple of 1/(41*30)
    assert result.extra["test_rows"] == 71 and result.extra["train_rows"] == 70
    pairs = result.statistic * 41 * 30
    assert pairs == pytest.approx(round(pairs), abs=1e-6)


def test_squared_components_catch_a_change_of_spread_a_linear_model_cannot() -> None:
    rng = np.random.default_rng(2)
    scales = np.r_[3.0, 2.0, np.ones(14)]
    reference = rng.normal(size=(800, 16)) * scales
    stretched = rng.normal(size=(800, 16)) * scales * np.r_[1.6, np.ones(15)]
    with_squares = classifier_test(stretched, reference, alpha=0.01)
    linear_only = classifier_test(stretched, reference, alpha=0.01, squared_components=0)
    assert with_squares.detected and with_squares.statistic > 0.55
    assert not linear_only.detected


@pytest.mark.parametrize("shared", [False, True], ids=["training-axes", "pooled-axes"])
def test_squared_components_from_either_basis_catch_the_stretch(shared: bool) -> None:
    rng = np.random.default_rng(2)
    scales = np.r_[3.0, 2.0, np.ones(14)]
    reference = rng.normal(size=(800, 16)) * scales
    stretched = rng.normal(size=(800, 16)) * scales * np.r_[1.6, np.ones(15)]
    pooled = PooledScatter(stretched, reference) if shared else None
    assert classifier_test(stretched, reference, alpha=0.01, pooled=pooled).detected


def test_the_pooled_axes_keep_the_held_out_null() -> None:
    """The pooled axes see the held-out rows but not their labels: under no drift the p-values stay
    uniform (200 null pairs of skewed, anisotropic rows; the share at 0.05 and 0.2 inside their
    99.9% binomial ranges)."""
    rng = np.random.default_rng(7)
    scales = np.geomspace(4.0, 0.2, 12)
    p_values = []
    for seed in range(200):
        x = rng.gamma(2.0, size=(100, 12)) * scales
        y = rng.gamma(2.0, size=(120, 12)) * scales
        p_values.append(classifier_test(x, y, seed=seed, squared_components=4, pooled=PooledScatter(x, y)).p_value)
    p = np.array(p_values)
    assert 2 <= (p <= 0.05).sum() <= 21  # expected 10
    assert 22 <= (p <= 0.2).sum() <= 59  # expected 40


def test_deterministic_given_a_seed() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(200, 8)) + 0.1, rng.normal(size=(200, 8))
    assert classifier_test(x, y, seed=5).p_value == classifier_test(x, y, seed=5).p_value
    assert classifier_test(x, y, seed=5).p_value != classifier_test(x, y, seed=6).p_value


def test_non_convergence_is_reported_not_raised() -> None:
    rng = np.random.default_rng(4)
    result = classifier_test(rng.normal(size=(200, 20)) + 0.3, rng.normal(size=(200, 20)), max_iter=2)
    assert result.extra["converged"] is False
    assert result.detected


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [(3, {}, "too small"), (100, {"train_fraction": 1.0}, "train_fraction")],
)
def test_rejects_bad_input(rows: int, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        classifier_test(np.ones((rows, 3)), np.ones((rows, 3)), **kwargs)
