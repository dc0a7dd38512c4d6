"""Reservoir: a uniform sample without replacement, whatever the batching; checkpointable."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from monitor.state.reservoir import Reservoir, generator_from_state, uniform_sample


def _rows(start: int, stop: int) -> np.ndarray:
    """Row i is (i, -i), so a stored row tells which input it was."""
    index = np.arange(start, stop, dtype=np.float32)
    return np.stack([index, -index], axis=1)


def _ids(start: int, stop: int) -> list[str]:
    return [f"r{i}" for i in range(start, stop)]


def test_fills_in_order_then_stays_at_capacity() -> None:
    res = Reservoir(capacity=5, dim=2, rng=np.random.default_rng(0))
    assert res.add(_rows(0, 3), _ids(0, 3)) == 3
    np.testing.assert_array_equal(res.vectors, _rows(0, 3))
    assert res.ids == ("r0", "r1", "r2") and res.seen == 3 and res.size == 3
    res.add(_rows(3, 200), _ids(3, 200))
    assert res.seen == 200 and res.vectors.shape == (5, 2) and len(res.ids) == 5
    # Each kept row still carries its own id, and no input row is kept twice.
    assert [f"r{int(v)}" for v in res.vectors[:, 0]] == list(res.ids)
    assert len(set(res.ids)) == 5
    assert res.vectors.dtype == np.float32


def test_rows_without_ids_get_none() -> None:
    res = Reservoir(capacity=3, dim=2, rng=np.random.default_rng(1))
    res.add(_rows(0, 2), _ids(0, 2))
    res.add(_rows(2, 50))
    kept = [int(v) for v in res.vectors[:, 0]]
    assert [None if i >= 2 else f"r{i}" for i in kept] == list(res.ids)


def test_zero_capacity_keeps_nothing() -> None:
    res = Reservoir(capacity=0, dim=2, rng=np.random.default_rng(0))
    assert res.add(_rows(0, 10)) == 0
    assert res.seen == 10 and res.vectors.shape == (0, 2) and res.ids == ()


def test_invalid_use_fails_early() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Reservoir(-1, 2, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        Reservoir(1, 2, np.random.RandomState(0))  # type: ignore[arg-type]
    res = Reservoir(2, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        res.add(np.ones((3, 4)))
    with pytest.raises(ValueError, match="ids"):
        res.add(np.ones((3, 2)), ids=["a"])


def _inclusion_counts(batch_sizes: list[int], capacity: int, runs: int) -> np.ndarray:
    total = sum(batch_sizes)
    counts = np.zeros(total, dtype=np.int64)
    for run in range(runs):
        res = Reservoir(capacity, dim=2, rng=np.random.default_rng(run))
        start = 0
        for size in batch_sizes:
            res.add(_rows(start, start + size))
            start += size
        counts[res.vectors[:, 0].astype(np.int64)] += 1
    return counts


@pytest.mark.parametrize(
    "batch_sizes",
    [[60], pytest.param([1] * 60, marks=pytest.mark.slow), [7, 3, 20, 1, 29], [10, 50]],  # row by row: 3 s of CPU
    ids=["one-batch", "row-by-row", "ragged", "fill-then-bulk"],
)
def test_every_row_is_equally_likely_whatever_the_batching(batch_sizes: list[int]) -> None:
    capacity, runs = 12, 1500
    counts = _inclusion_counts(batch_sizes, capacity, runs)
    assert counts.sum() == capacity * runs  # always full, never a duplicate
    expected = np.full(counts.size, capacity * runs / counts.size)
    p_value = scipy_stats.chisquare(counts, expected).pvalue
    assert p_value > 1e-3, (p_value, counts)


def test_chi_square_catches_a_biased_sampler() -> None:
    """The uniformity test above has power: keeping only the first rows is rejected."""
    counts = np.zeros(60)
    counts[:12] = 1500
    expected = np.full(60, 12 * 1500 / 60)
    assert scipy_stats.chisquare(counts, expected).pvalue < 1e-10


def test_state_dict_round_trip_continues_identically() -> None:
    res = Reservoir(capacity=8, dim=2, rng=np.random.default_rng(42))
    res.add(_rows(0, 30), _ids(0, 30))
    restored = Reservoir.from_state_dict(res.state_dict())
    assert restored.seen == res.seen and restored.ids == res.ids
    np.testing.assert_array_equal(restored.vectors, res.vectors)
    for lo in range(30, 300, 45):
        assert res.add(_rows(lo, lo + 45), _ids(lo, lo + 45)) == restored.add(_rows(lo, lo + 45), _ids(lo, lo + 45))
    np.testing.assert_array_equal(restored.vectors, res.vectors)
    assert restored.ids == res.ids


def test_partially_filled_state_round_trip() -> None:
    res = Reservoir(capacity=8, dim=2, rng=np.random.default_rng(3))
    res.add(_rows(0, 3))
    restored = Reservoir.from_state_dict(res.state_dict())
    np.testing.assert_array_equal(restored.vectors, _rows(0, 3))
    assert restored.ids == (None, None, None)


def test_inconsistent_state_is_rejected() -> None:
    res = Reservoir(capacity=4, dim=2, rng=np.random.default_rng(3))
    res.add(_rows(0, 10))
    state = res.state_dict()
    state["vectors"] = state["vectors"][:2]
    with pytest.raises(ValueError, match="reservoir vectors has shape"):
        Reservoir.from_state_dict(state)
    with pytest.raises(ValueError, match="unknown bit generator"):
        generator_from_state({"bit_generator": "NoSuchGenerator"})


def test_shared_rows_read_the_same_and_are_copied_back_before_a_write() -> None:
    res = Reservoir(capacity=4, dim=2, rng=np.random.default_rng(0))
    res.add(_rows(0, 4), ids=_ids(0, 4))
    before = res.vectors.copy()
    storage = np.zeros((10, 2), dtype=np.float32)
    rows = np.array([7, 2, 9, 0])
    storage[rows] = before
    res.share(storage, rows)
    assert res.shared
    np.testing.assert_array_equal(res.vectors, before)
    np.testing.assert_array_equal(res.take(np.array([1, 3])), before[[1, 3]])
    res.add(_rows(4, 6), ids=_ids(4, 6))
    assert not res.shared and res.seen == 6
    np.testing.assert_array_equal(storage[rows], before)  # the shared array was never written
    with pytest.raises(ValueError, match="match"):
        res.share(storage, np.arange(3))


def test_a_sample_that_takes_part_of_a_closed_reservoir_shares_those_rows_and_changes_nothing_it_reads() -> None:
    """Sub-windows hold more rows than the window's sample limit takes (the drift tests'
    full samples): the taken rows live only in the sample, the rest in the reservoir's own array, and
    every later read (rows, gathers, the next sample, the checkpoint) is what it was unshared."""

    def filled(seed: int) -> list[Reservoir]:
        pieces = []
        for j in range(3):
            res = Reservoir(capacity=50, dim=2, rng=np.random.default_rng(seed + j))
            res.add(_rows(1000 * j, 1000 * j + 200), ids=_ids(1000 * j, 1000 * j + 200))
            pieces.append(res)
        return pieces

    shared, plain = filled(0), filled(0)
    first = uniform_sample(shared, 2, np.random.default_rng(9), share=[True, True, False], limit=60)
    again = uniform_sample(plain, 2, np.random.default_rng(9), limit=60)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1] == again[1] and len(first[0]) < 150  # a subsample of the 150 rows held
    for a, b in zip(shared[:2], plain[:2], strict=True):
        assert a.shared and 0 < a._rest.shape[0] < a.size  # part in the sample, part its own
        np.testing.assert_array_equal(a.vectors, b.vectors)
        np.testing.assert_array_equal(a.take(np.array([0, 7, 49])), b.vectors[[0, 7, 49]])
        np.testing.assert_array_equal(a.state_dict()["vectors"], b.state_dict()["vectors"])
    assert not shared[2].shared  # still taking records: never shared
    second = uniform_sample(shared, 2, np.random.default_rng(10), share=[True, True, False], limit=60)
    np.testing.assert_array_equal(second[0], uniform_sample(plain, 2, np.random.default_rng(10), limit=60)[0])
    assert all(r._shared is second[0] for r in shared[:2])  # the older sample is no longer held
