"""The reference-only pieces a cycle reuses: the tests they feed give the same p-values as without them."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from monitor.drift.twosample import reference_cache as cache_module
from monitor.drift.twosample.ks import ks_test
from monitor.drift.twosample.mmd import mmd_test
from monitor.drift.twosample.reference_cache import ReferenceCache, reference_cache


def _cloud(rng: np.random.Generator, rows: int, dim: int, shift: float = 0.0) -> np.ndarray:
    x = 1.5 * rng.normal(size=(rows, dim)) + np.r_[shift, np.zeros(dim - 1)] + 3.0
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize(("rows", "ref_rows", "shift", "points"), [
    (300, 300, 0.0, 1000), (300, 400, 0.4, 1000), (301, 257, 0.2, 200), (60, 90, 0.0, 1000)])
def test_the_heldout_mmd_from_the_cached_gram_gives_the_plain_paths_p_value_and_statistic(
    rows: int, ref_rows: int, shift: float, points: int
) -> None:
    rng = np.random.default_rng(rows + ref_rows)
    window, reference = _cloud(rng, rows, 24, shift), _cloud(rng, ref_rows, 24)
    cached = ReferenceCache(reference)
    for seed in range(3):
        plain = mmd_test(window, reference, null="heldout", seed=seed, device="cpu", bandwidth_points=points)
        fast = mmd_test(window, reference, null="heldout", seed=seed, device="cpu", bandwidth_points=points,
                        reference=cached)
        assert fast.p_value == pytest.approx(plain.p_value, rel=1e-9, abs=1e-300)
        assert fast.extra["auc"] == plain.extra["auc"]
        assert fast.extra["bandwidth"] == pytest.approx(plain.extra["bandwidth"], rel=1e-12)
        assert fast.statistic == pytest.approx(plain.statistic, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("dim", [32, 96])  # LAPACK's top axes; the sketch's (d > 2 (10 + 16))
def test_the_ks_pooled_basis_from_the_cached_scatter_gives_the_same_p_values(dim: int) -> None:
    rng = np.random.default_rng(5)
    reference = _cloud(rng, 400, dim)
    cached = ReferenceCache(reference)
    for shift in (0.0, 0.3):
        window = _cloud(rng, 350, dim, shift)
        plain, fast = ks_test(window, reference, components=10), ks_test(window, reference, components=10,
                                                                           reference=cached)
        assert fast.p_value == pytest.approx(plain.p_value, rel=1e-9)
        assert fast.extra["component_statistics"] == plain.extra["component_statistics"]


def test_the_cache_serves_one_entry_per_reference_object_forgets_dead_ones_and_keeps_its_budget() -> None:
    cache_module.clear()
    rng = np.random.default_rng(1)
    first = _cloud(rng, 50, 8)
    assert reference_cache(first) is reference_cache(first)
    copy = first.copy()
    assert reference_cache(copy) is not reference_cache(first)  # keyed by the object, not its values
    key = id(first)
    del first
    gc.collect()
    assert key not in cache_module._cache  # a later object with the same id is not served its pieces
    kept = [_cloud(rng, 1000, 384) for _ in range(10)]  # 11 MB each: 22 fit in the 256 MB budget
    assert all(reference_cache(r) is not None for r in kept)
    big = np.zeros((2048, 3000), dtype=np.float32)  # 81 MB of pieces: over the budget beside the others
    used = sum(entry[2] for entry in cache_module._cache.values())
    assert ReferenceCache.bytes_for(*big.shape) > cache_module.CACHE_BYTES - used
    assert reference_cache(big) is None
    assert all(reference_cache(r) is not None for r in kept)  # nothing was evicted for it


def test_a_reference_above_the_gram_limit_keeps_no_gram_and_the_test_takes_the_plain_path() -> None:
    rng = np.random.default_rng(2)
    reference, window = _cloud(rng, 120, 8), _cloud(rng, 100, 8)
    small = ReferenceCache(reference, max_gram_rows=100)
    assert small.centred_gram is None
    plain = mmd_test(window, reference, null="heldout", seed=1, device="cpu")
    fast = mmd_test(window, reference, null="heldout", seed=1, device="cpu", reference=small)
    assert fast.p_value == plain.p_value and fast.statistic == plain.statistic
