"""Centroid test: the cosine distance between means, its permutation null, what it cannot see."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.drift.twosample.centroid import centroid_test, cosine_distance


def _embeddings(rng: np.random.Generator, n: int, d: int, pull: np.ndarray, noise: float = 0.5) -> np.ndarray:
    rows = rng.normal(0.0, noise, size=(n, d)) + pull
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_cosine_distance_is_one_minus_cosine_and_stays_accurate_near_zero() -> None:
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([1.0, 2.0, 3.0 + 1e-7])
    naive = 1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    assert cosine_distance(a, -a) == pytest.approx(2.0)
    assert cosine_distance(a, np.array([3.0, -1.5, 0.0])) == pytest.approx(1.0)
    assert cosine_distance(a, b) > 0  # the naive formula rounds to zero or below here
    assert naive <= 1e-15


def test_statistic_is_the_distance_between_the_means() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(1.0, 1.0, size=(50, 4)), rng.normal(1.0, 1.0, size=(70, 4))
    result = centroid_test(x, y, permutations=20, stop_after=None)
    assert result.statistic == pytest.approx(cosine_distance(x.mean(axis=0), y.mean(axis=0)))
    assert result.extra["permutations"] == 20


def test_flags_a_turned_mean_and_stays_quiet_on_the_null() -> None:
    rng = np.random.default_rng(1)
    pull = np.r_[1.0, np.zeros(31)]
    turned = np.r_[np.cos(0.2), np.sin(0.2), np.zeros(30)]  # the mean direction turned by ~11 degrees
    reference = _embeddings(rng, 500, 32, pull)
    quiet = centroid_test(_embeddings(rng, 500, 32, pull), reference, alpha=0.01, permutations=500)
    moved = centroid_test(_embeddings(rng, 500, 32, turned), reference, alpha=0.01, permutations=500)
    assert not quiet.detected and quiet.p_value > 0.05
    assert moved.detected and moved.p_value == pytest.approx(1 / 501)
    assert moved.statistic > moved.extra["null_p95"]


def test_blind_to_a_change_of_spread_around_the_same_mean() -> None:
    """Documented limitation: more or less spread around an unchanged mean direction."""
    rng = np.random.default_rng(2)
    pull = np.r_[1.0, np.zeros(15)]
    reference = _embeddings(rng, 400, 16, pull, noise=0.3)
    wider = _embeddings(rng, 400, 16, pull, noise=0.6)
    assert not centroid_test(wider, reference, alpha=0.01, permutations=300).detected


def test_deterministic_and_sequential_stopping() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.5, 1.0, size=(100, 8)), rng.normal(0.5, 1.0, size=(100, 8))
    first = centroid_test(x, y, permutations=1000, seed=4)
    again = centroid_test(x, y, permutations=1000, seed=4)
    assert (first.p_value, first.extra["permutations"]) == (again.p_value, again.extra["permutations"])
    assert first.extra["stopped_early"] and first.extra["permutations"] < 1000
    assert first.p_value == pytest.approx(10 / first.extra["permutations"])


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="same dimension"):
        centroid_test(np.ones((4, 2)), np.ones((4, 3)))
    with pytest.raises(ValueError, match="zero vector"):
        centroid_test(np.r_[[[1.0, 0.0]], [[-1.0, 0.0]]], np.ones((4, 2)))
    with pytest.raises(ValueError, match="permutations"):
        centroid_test(np.ones((4, 2)), np.ones((4, 2)), permutations=0)
