"""MMD² permutation test: the statistic, the blocked computation, the p-value, the verdicts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.mmd import (
    kernel_label_products,
    median_bandwidth,
    mmd2_unbiased,
    mmd_test,
)


def _sample(rng: np.random.Generator, n: int, d: int, shift: float = 0.0) -> np.ndarray:
    return (rng.normal(size=(n, d)) + shift).astype(np.float32)


def _without_timing(result: TestResult) -> TestResult:
    return replace(result, extra={k: v for k, v in result.extra.items() if k != "seconds"})


def _naive_mmd2(x: np.ndarray, y: np.ndarray, sigma: float) -> float:
    """Gretton et al. (2012) eq. 3, written out with full kernel matrices in float64."""
    def k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        d2 = ((a[:, None, :].astype(float) - b[None, :, :].astype(float)) ** 2).sum(-1)
        return np.exp(-d2 / (2 * sigma**2))

    m, n = len(x), len(y)
    kxx, kyy, kxy = k(x, x), k(y, y), k(x, y)
    return float(
        (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
        + (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
        - 2 * kxy.mean()
    )


def test_statistic_matches_the_textbook_formula() -> None:
    rng = np.random.default_rng(0)
    x, y = _sample(rng, 120, 6), _sample(rng, 90, 6, shift=0.2)
    assert mmd2_unbiased(x, y, 1.7) == pytest.approx(_naive_mmd2(x, y, 1.7), rel=1e-5, abs=1e-9)


def test_blocked_products_do_not_depend_on_the_block_size() -> None:
    rng = np.random.default_rng(1)
    pooled = _sample(rng, 300, 5)
    labels = rng.integers(0, 2, size=(300, 7)).astype(np.float64)
    whole = kernel_label_products(pooled, labels, 2.0, block_size=1000)
    tiled = kernel_label_products(pooled, labels, 2.0, block_size=64)
    ragged = kernel_label_products(pooled, labels, 2.0, block_size=77)
    rows = pooled.astype(np.float64)
    kernel = np.exp(-((rows[:, None] - rows[None]) ** 2).sum(-1) / 8.0)
    np.fill_diagonal(kernel, 0.0)
    np.testing.assert_allclose(whole, kernel @ labels, rtol=1e-5)
    # the float64 accumulation adds nothing; a float32 kernel entry may round one ulp apart when
    # the BLAS blocks a tile of another shape differently (measured: 1e-8 relative on the products)
    np.testing.assert_allclose(whole, tiled, rtol=1e-7, atol=0.0)
    np.testing.assert_allclose(whole, ragged, rtol=1e-7, atol=0.0)


def test_observed_statistic_and_permutations_are_consistent() -> None:
    rng = np.random.default_rng(2)
    x, y = _sample(rng, 150, 4), _sample(rng, 100, 4, shift=0.5)
    result = mmd_test(x, y, permutations=50, stop_after=None, bandwidth=2.5, device="cpu")
    assert result.statistic == pytest.approx(_naive_mmd2(x, y, 2.5), rel=1e-5)
    assert result.extra["permutations"] == 50
    # nothing among 50 relabellings beats a 0.5-sd shift at n=100: the smallest p-value
    assert result.p_value == pytest.approx(1 / 51)


def test_median_heuristic_is_the_median_pairwise_distance() -> None:
    rng = np.random.default_rng(3)
    pooled = _sample(rng, 200, 3)
    distances = np.sqrt(((pooled[:, None].astype(float) - pooled[None].astype(float)) ** 2).sum(-1))
    # the median of an even count is the lower middle value
    expected = np.quantile(distances[np.triu_indices(200, 1)], 0.5, method="lower")
    assert median_bandwidth(pooled, rng) == pytest.approx(expected, rel=1e-6)
    # subsampled above max_points: close to, not equal to, the full median
    subsampled = median_bandwidth(pooled, np.random.default_rng(0), max_points=100)
    assert subsampled != pytest.approx(expected, rel=1e-9)
    assert subsampled == pytest.approx(expected, rel=0.05)


def test_flags_a_shift_and_stays_quiet_on_the_null() -> None:
    rng = np.random.default_rng(4)
    reference = _sample(rng, 400, 16)
    quiet = mmd_test(_sample(rng, 400, 16), reference, alpha=0.01, permutations=200, device="cpu", seed=1)
    shifted = mmd_test(_sample(rng, 400, 16, 0.15), reference, alpha=0.01, permutations=200, device="cpu", seed=1)
    assert not quiet.detected and quiet.p_value > 0.1
    assert shifted.detected and shifted.p_value <= 0.01
    assert shifted.statistic > shifted.extra["null_p95"] > quiet.statistic


def test_detects_a_change_of_spread_with_the_same_mean() -> None:
    rng = np.random.default_rng(5)
    reference = _sample(rng, 300, 8)
    wider = (rng.normal(size=(300, 8)) * 1.3).astype(np.float32)
    assert mmd_test(wider, reference, alpha=0.01, permutations=200, device="cpu").detected


def test_deterministic_given_a_seed_and_chunking_does_not_change_the_answer() -> None:
    rng = np.random.default_rng(6)
    x, y = _sample(rng, 200, 8), _sample(rng, 200, 8, shift=0.05)
    first = mmd_test(x, y, permutations=300, stop_after=None, device="cpu", seed=9)
    again = mmd_test(x, y, permutations=300, stop_after=None, device="cpu", seed=9)
    chunked = mmd_test(x, y, permutations=300, stop_after=None, device="cpu", seed=9, label_budget_bytes=1)
    other = mmd_test(x, y, permutations=300, stop_after=None, device="cpu", seed=10)
    assert _without_timing(first) == _without_timing(again)
    assert (chunked.p_value, chunked.statistic) == (first.p_value, first.statistic)
    assert other.p_value != first.p_value


def test_sequential_stopping_saves_permutations_only_when_the_data_look_alike() -> None:
    rng = np.random.default_rng(7)
    reference = _sample(rng, 200, 8)
    null = mmd_test(_sample(rng, 200, 8), reference, permutations=5000, stop_after=10, device="cpu",
                    label_budget_bytes=1)
    drifted = mmd_test(_sample(rng, 200, 8, 0.5), reference, permutations=2000, stop_after=10, device="cpu")
    assert null.extra["stopped_early"] and null.extra["permutations"] < 200
    assert null.p_value == pytest.approx(10 / null.extra["permutations"])
    assert not drifted.extra["stopped_early"] and drifted.extra["permutations"] == 2000
    assert drifted.p_value == pytest.approx(1 / 2001)


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "kwargs", "message"),
    [
        ((10, 3), (10, 4), {}, "different dimensions"),
        ((1, 3), (10, 3), {}, "at least 2 rows"),
        ((10,), (10, 3), {}, "2-D"),
        ((10, 3), (10, 3), {"permutations": 0}, "permutations"),
        ((10, 3), (10, 3), {"stop_after": 0}, "stop_after"),
        ((10, 3), (10, 3), {"bandwidth": -1.0}, "bandwidth"),
    ],
)
def test_rejects_bad_input(x_shape: tuple, y_shape: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mmd_test(np.ones(x_shape, np.float32), np.ones(y_shape, np.float32), device="cpu", **kwargs)


# The CUDA path (monitor/drift/twosample/mmd_torch.py) run on torch's CPU backend against the numpy path:
# the same tiles in the same precisions, so they agree to float32 rounding of the kernel entries
# (measured: ~1e-7 relative on the products and the statistic) and give the same p-values.
TORCH_RTOL = 1e-6


@pytest.mark.slow  # torch: its import costs each worker 3 s of CPU (the CPU path is numpy's)
@pytest.mark.parametrize("block_size", [1024, 128, 77])
def test_the_torch_kernel_products_equal_the_numpy_ones(block_size: int) -> None:
    from monitor.drift.twosample.mmd_torch import TorchKernel

    rng = np.random.default_rng(11)
    pooled = _sample(rng, 600, 48)
    labels = rng.integers(0, 2, size=(600, 9)).astype(np.float64)
    on_torch = TorchKernel(pooled, 9.0, block_size, "cpu")(labels)
    np.testing.assert_allclose(on_torch, kernel_label_products(pooled, labels, 9.0, block_size), rtol=TORCH_RTOL)


@pytest.mark.slow  # torch
@pytest.mark.parametrize(("shift", "null"), [(0.0, "permutation"), (0.2, "permutation"), (0.2, "heldout")])
def test_an_mmd_test_on_the_torch_kernel_gives_the_numpy_answer(
    monkeypatch: pytest.MonkeyPatch, shift: float, null: str
) -> None:
    from monitor.drift.twosample import mmd, mmd_torch

    rng = np.random.default_rng(12)
    x, y = _sample(rng, 300, 32, shift), _sample(rng, 250, 32)
    kwargs = {"permutations": 300, "seed": 4, "null": null, "block_size": 128}
    on_numpy = mmd_test(x, y, device="cpu", **kwargs)
    monkeypatch.setattr(mmd, "label_products",
                        lambda pooled, bandwidth, block, device: mmd_torch.TorchKernel(pooled, bandwidth, block, "cpu"))
    on_torch = mmd_test(x, y, device="cpu", **kwargs)
    assert on_torch.statistic == pytest.approx(on_numpy.statistic, rel=TORCH_RTOL)
    assert (on_torch.p_value, on_torch.detected, on_torch.extra["bandwidth"]) == (
        on_numpy.p_value, on_numpy.detected, on_numpy.extra["bandwidth"])
