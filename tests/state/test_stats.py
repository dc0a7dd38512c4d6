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
    assert all(isinstance(v, (int, float, str, np.ndarray)) for v in state.values())
    restored = SufficientStats.from_state_dict(state)
    _assert_same(restored, stats, rtol=0)
    more = _data(7, d, seed=seed + 1)
    restored.update(more)
    stats.update(more)
    _assert_same(restored, stats, rtol=1e-14)


@pytest.mark.parametrize("key", ["moment_packed", "centre", "shifted_sum"])
def test_state_dict_with_wrong_shapes_is_rejected(key: str) -> None:
    state = SufficientStats(3).state_dict()
    state[key] = np.zeros(5)
    with pytest.raises(ValueError, match=rf"{key} has shape \(5,\)"):
        SufficientStats.from_state_dict(state)


# -- the shifted second moment --------------------------------------------------------------


def _pre_shift_state(x: np.ndarray) -> dict:
    """What ``state_dict`` wrote before the second moment was shifted: the raw XᵀX, packed."""
    x64 = x.astype(np.float64)
    d = x.shape[1]
    norms = np.linalg.norm(x64, axis=1)
    return {
        "dim": d, "count": x.shape[0], "vector_sum": x64.sum(axis=0),
        "unit_sum": (x64 / norms[:, None]).sum(axis=0), "norm_sum": float(norms.sum()),
        "sq_norm_sum": float((norms**2).sum()), "gram_packed": (x64.T @ x64)[np.triu_indices(d)],
    }  # fmt: skip


def test_a_checkpoint_from_before_the_shift_loads_as_the_moment_about_zero() -> None:
    x = _data(40, 4)
    restored = SufficientStats.from_state_dict(_pre_shift_state(x))
    whole = SufficientStats(4)
    whole.update(x)
    _assert_same(restored, whole, rtol=1e-12)
    np.testing.assert_allclose(restored.covariance(), whole.covariance(), rtol=1e-9)


def test_the_centre_is_the_first_batch_mean_and_far_offsets_do_not_cancel() -> None:
    # Mean 1e4 times the spread: the raw XᵀX − n·μμᵀ would lose 8 of float64's 16 digits.
    rng = np.random.default_rng(3)
    x = 1e4 + rng.standard_normal((500, 3))
    stats = SufficientStats(3)
    stats.update(x[:100])
    stats.update(x[100:])
    np.testing.assert_array_equal(stats.centre, x[:100].mean(axis=0).astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(stats.covariance(), np.cov(x, rowvar=False), rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    d=st.integers(1, 5),
    offsets=st.lists(st.floats(-1e3, 1e3), min_size=6, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_parts_with_different_centres_merge_to_the_stats_of_the_union(
    sizes: list[int], d: int, offsets: list[float], seed: int
) -> None:
    # Each part is shifted by its own offset, so every part has its own centre.
    parts_x = [_data(size, d, seed=seed + i) + offsets[i] for i, size in enumerate(sizes)]
    x = np.concatenate(parts_x)
    parts = []
    for part_x in parts_x:
        part = SufficientStats(d)
        part.update(part_x)
        parts.append(part)
    pairwise = SufficientStats(d)
    for part in parts:
        pairwise += part
    at_once = SufficientStats.merged(parts)
    if x.shape[0] < 2:
        assert pairwise.count == at_once.count == x.shape[0]
        return
    expected = np.cov(x.astype(np.float64), rowvar=False, ddof=1).reshape(d, d)
    scale = float(np.abs(expected).max())
    for merged in (pairwise, at_once):
        assert merged.count == x.shape[0]
        np.testing.assert_allclose(merged.vector_sum, x.astype(np.float64).sum(axis=0), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(merged.covariance(), expected, rtol=1e-9, atol=1e-12 * scale)
        np.testing.assert_allclose(merged.gram, x.astype(np.float64).T @ x.astype(np.float64), rtol=1e-9, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4), d=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_merged_state_round_trips_bit_for_bit(sizes: list[int], d: int, seed: int) -> None:
    parts = []
    for i, size in enumerate(sizes):
        part = SufficientStats(d, "float32" if i % 2 else "float64")
        part.update(_data(size, d, seed=seed + i) + i)
        parts.append(part)
    merged = SufficientStats.merged(parts)
    restored = SufficientStats.from_state_dict(merged.state_dict())
    for key, value in merged.state_dict().items():
        np.testing.assert_array_equal(restored.state_dict()[key], value)


def test_merged_leaves_parts_unchanged_and_needs_one() -> None:
    a, b = SufficientStats(3), SufficientStats(3)
    a.update(_data(10, 3))
    b.update(_data(10, 3, seed=1) + 5)
    before = a.state_dict()
    SufficientStats.merged([a, b])
    for key, value in before.items():
        np.testing.assert_array_equal(a.state_dict()[key], value)
    with pytest.raises(ValueError, match="at least one"):
        SufficientStats.merged([])
    with pytest.raises(ValueError, match="precision"):
        SufficientStats(3, "float16")  # type: ignore[arg-type]


# -- float32 precision ------------------------------------------------------------------------


def test_float32_products_keep_every_spectral_ratio_within_its_bound() -> None:
    """The opt-in float32 product on shifted rows, against exact float64, on data with a large
    common offset and variances spread over three decades (docs/benchmarks.md states the bound)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((6000, 96)) * np.geomspace(1e-3, 1, 96) + 3.0).astype(np.float32)
    exact, fast = SufficientStats(96), SufficientStats(96, "float32")
    for start in range(0, 6000, 700):
        exact.update(x[start : start + 700])
        fast.update(x[start : start + 700])
    assert fast.count == exact.count
    np.testing.assert_array_equal(fast.vector_sum, exact.vector_sum)
    lam_exact = np.linalg.eigvalsh(exact.covariance())
    lam_fast = np.linalg.eigvalsh(fast.covariance())
    np.testing.assert_allclose(lam_fast, lam_exact, rtol=1e-5)
    # Without the shift, float32 would have cancelled the small variances away entirely.
    raw = (x.T @ x).astype(np.float64) - 6000 * np.outer(exact.mean, exact.mean)
    assert np.linalg.eigvalsh(raw / 5999)[0] < 0.5 * lam_exact[0]


def test_float32_blocks_bound_the_accumulation_length() -> None:
    from monitor.state import stats as stats_module

    x = _data(9000, 4)
    one, blocked = SufficientStats(4, "float32"), SufficientStats(4, "float32")
    one.update(x)
    for start in range(0, 9000, stats_module.FLOAT32_BLOCK_ROWS):
        blocked.update(x[start : start + stats_module.FLOAT32_BLOCK_ROWS])
    # One call spans three blocks, each summed in float32 and added in float64: no more rounding
    # than the same rows fed block by block (other centre, so equal to float32 rounding).
    assert one.count == blocked.count
    np.testing.assert_allclose(one.covariance(), blocked.covariance(), rtol=1e-6)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_the_device_product_equals_the_cpu_product(precision: str) -> None:
    """The torch path that large batches take on a configured CUDA device (run here on torch's
    CPU backend, so the suite covers it without a GPU; bench/cuda.py compares on a real one)."""
    from monitor.state import stats as stats_module

    x = _data(stats_module.DEVICE_MIN_ROWS + 300, 6)
    on_device, here = SufficientStats(6, precision, device="cpu"), SufficientStats(6, precision)
    for part in (x[:40], x[40:]):  # a small batch stays on the CPU, a large one goes to the device
        on_device.update(part)
        here.update(part)
    if precision == "float64":
        _assert_same(on_device, here, rtol=1e-12)
    else:  # float32 products: the same sums to float32 rounding of the largest entries
        scale = float(np.abs(here.covariance()).max())
        np.testing.assert_allclose(on_device.covariance(), here.covariance(), rtol=1e-5, atol=1e-6 * scale)
    assert on_device.copy().device == "cpu"


def _unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _norm_std_truth(x: np.ndarray) -> float:
    """Two-pass float64 standard deviation of the rows' norms (computed as the stats compute norms)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    return float(np.std(norms, ddof=1))


@pytest.mark.parametrize("d", [384, 768])
def test_the_norm_spread_of_unit_vectors_is_exact_however_batched_merged_or_restored(d: int) -> None:
    """float32 unit vectors' norms spread by ~1e-8 around 1: from raw sums (Σ‖x‖² − n·mean²) that
    cancels to noise; kept about the mean and merged by Chan's formula it equals the two-pass truth."""
    x = _unit_rows(12_000, d, seed=d)
    truth = _norm_std_truth(x)
    assert 1e-9 < truth < 1e-6

    rng = np.random.default_rng(1)
    cuts = np.sort(rng.choice(np.arange(1, len(x)), size=40, replace=False))
    parts = []
    single = SufficientStats(d, "float32")
    for chunk in np.split(x, cuts):
        single.update(chunk)
        part = SufficientStats(d, "float32")
        part.update(chunk)
        parts.append(part)
    in_turn = SufficientStats(d, "float32")
    for part in parts:
        in_turn.merge(part)
    merged = SufficientStats.merged(parts)
    restored = SufficientStats.from_state_dict(merged.state_dict())
    for stats in (single, in_turn, merged, restored):
        assert np.sqrt(stats.norm_variance) == pytest.approx(truth, rel=1e-9)

    old = np.sqrt(max(0.0, (single.sq_norm_sum - single.norm_sum**2 / len(x)) / (len(x) - 1)))
    assert abs(old - truth) > 1e-3 * truth  # what the raw sums gave: rounding noise


def test_a_state_from_before_the_norm_moment_loads_with_it_from_the_raw_sums() -> None:
    x = _data(50, 3)
    stats = SufficientStats(3)
    stats.update(x)
    state = stats.state_dict()
    del state["norm_m2"]
    restored = SufficientStats.from_state_dict(state)
    norms = np.linalg.norm(x.astype(np.float64), axis=1)
    assert restored.norm_variance == pytest.approx(np.var(norms, ddof=1), rel=1e-9)
