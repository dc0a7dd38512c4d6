"""SufficientStats: exact against numpy, independent of batching, mergeable, checkpointable."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.state.stats import SufficientStats


def _data(n: int, d: int, seed: int = 0, dtype: type = np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.2, 3.0, d)  # anisotropic, so a wrong covariance cannot look right
    return (rng.standard_normal((n, d)) * scales + rng.standard_normal(d)).astype(dtype)


def _assert_same(a: SufficientStats, b: SufficientStats, rtol: float = 1e-12) -> None:
    assert a.dim == b.dim and a.count == b.count
    np.testing.assert_allclose(a.vector_sum, b.vector_sum, rtol=rtol, atol=1e-9)
    np.testing.assert_allclose(a.unit_sum, b.unit_sum, rtol=rtol, atol=1e-9)
    np.testing.assert_allclose(a.gram, b.gram, rtol=rtol, atol=1e-9)
    assert a.norm_sum == pytest.approx(b.norm_sum, rel=rtol)
    assert a.sq_norm_sum == pytest.approx(b.sq_norm_sum, rel=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_match_numpy(dtype: type) -> None:
    x = _data(300, 7, dtype=dtype)
    stats = SufficientStats(7)
    stats.update(x)
    x64 = x.astype(np.float64)
    norms = np.linalg.norm(x64, axis=1)
    assert stats.count == 300
    np.testing.assert_allclose(stats.vector_sum, x64.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.unit_sum, (x64 / norms[:, None]).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.gram, x64.T @ x64, rtol=1e-12)
    assert stats.norm_sum == pytest.approx(norms.sum(), rel=1e-12)
    assert stats.sq_norm_sum == pytest.approx((norms**2).sum(), rel=1e-12)
    np.testing.assert_allclose(stats.mean, x64.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.covariance(), np.cov(x64, rowvar=False), rtol=1e-10, atol=1e-12)


def test_gram_is_exactly_symmetric_and_refreshed_after_update() -> None:
    x = _data(50, 5)
    stats = SufficientStats(5)
    stats.update(x[:20])
    first = stats.gram.copy()
    assert np.array_equal(first, first.T)
    stats.update(x[20:])
    assert not np.allclose(stats.gram, first)
    np.testing.assert_allclose(stats.gram, x.astype(np.float64).T @ x.astype(np.float64), rtol=1e-12)
    assert np.array_equal(stats.gram, stats.gram.T)


def test_precomputed_norms_are_used() -> None:
    x = _data(10, 3)
    stats = SufficientStats(3)
    stats.update(x, norms=np.full(10, 2.0))
    assert stats.norm_sum == 20.0 and stats.sq_norm_sum == 40.0
    np.testing.assert_allclose(stats.unit_sum, x.astype(np.float64).sum(axis=0) / 2.0)


def test_empty_batch_changes_nothing() -> None:
    stats = SufficientStats(4)
    stats.update(np.empty((0, 4), dtype=np.float32))
    assert stats.count == 0 and not stats.gram.any()


@pytest.mark.parametrize(
    ("rows", "norms", "message"),
    [
        (np.ones((3, 5)), None, "shape"),
        (np.ones(4), None, "shape"),
        (np.array([[1.0, 0, 0, 0], [0, 0, 0, 0]]), None, "non-zero"),
        (np.array([[1.0, np.nan, 0, 0]]), None, "non-zero"),
        (np.ones((2, 4)), np.ones(3), "norms"),
    ],
)
def test_bad_input_is_rejected_before_any_sum_changes(rows: np.ndarray, norms: np.ndarray | None, message: str) -> None:
    stats = SufficientStats(4)
    with pytest.raises(ValueError, match=message):
        stats.update(rows, norms=norms)
    assert stats.count == 0 and not stats.gram.any() and not stats.unit_sum.any()


def test_undefined_moments_raise() -> None:
    stats = SufficientStats(3)
    with pytest.raises(ValueError, match="empty"):
        _ = stats.mean
    stats.update(np.ones((1, 3)))
    with pytest.raises(ValueError, match="at least 2"):
        stats.covariance()
    with pytest.raises(ValueError, match="positive"):
        SufficientStats(0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 60),
    d=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 60), max_size=8),
    seed=st.integers(0, 2**16),
)
def test_any_batching_equals_one_batch(n: int, d: int, cuts: list[int], seed: int) -> None:
    x = _data(n, d, seed=seed)
    whole = SufficientStats(d)
    whole.update(x)
    streamed = SufficientStats(d)
    bounds = [0, *sorted(c for c in cuts if c < n), n]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        streamed.update(x[lo:hi])
    _assert_same(streamed, whole)
    np.testing.assert_allclose(streamed.covariance(), np.cov(x.astype(np.float64), rowvar=False), rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_merging_parts_equals_stats_of_the_union(sizes: list[int], d: int, seed: int) -> None:
    x = _data(sum(sizes), d, seed=seed)
    whole = SufficientStats(d)
    whole.update(x)
    merged = SufficientStats(d)
    start = 0
    for size in sizes:
        part = SufficientStats(d)
        part.update(x[start : start + size])
        merged += part
        start += size
    _assert_same(merged, whole)


def test_merge_rejects_other_dim_and_copy_is_independent() -> None:
    a = SufficientStats(3)
    a.update(_data(5, 3))
    with pytest.raises(ValueError, match="dim"):
        a.merge(SufficientStats(4))
    clone = a.copy()
    a.update(_data(5, 3, seed=1))
    assert clone.count == 5 and a.count == 10
    fresh = SufficientStats(3)
    fresh.update(_data(5, 3))
    _assert_same(clone, fresh, rtol=0)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 40), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_state_dict_round_trip(n: int, d: int, seed: int) -> None:
    stats = SufficientStats(d)
    stats.update(_data(n, d, seed=seed))
    state = stats.state_dict()
    assert all(isinstance(v, (int, float, np.ndarray)) for v in state.values())
    restored = SufficientStats.from_state_dict(state)
    _assert_same(restored, stats, rtol=0)
    more = _data(7, d, seed=seed + 1)
    restored.update(more)
    stats.update(more)
    _assert_same(restored, stats, rtol=1e-14)


def test_state_dict_with_wrong_shapes_is_rejected() -> None:
    state = SufficientStats(3).state_dict()
    state["gram_packed"] = np.zeros(5)
    with pytest.raises(ValueError, match="dim 3"):
        SufficientStats.from_state_dict(state)
