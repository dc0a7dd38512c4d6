"""The permutation loop the MMD and centroid tests share: draws, chunking, the stopping rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from monitor.drift.twosample.permutation import check_permutation_budget, relabellings, sequential_permutation_test

LABELS = np.r_[np.ones(30), np.zeros(40)]
VALUES = np.random.default_rng(0).normal(size=70)


def mean_difference(labels: np.ndarray) -> np.ndarray:
    return labels @ VALUES / 30 - (1 - labels) @ VALUES / 40


def test_a_first_chunk_drawn_by_the_caller_continues_the_same_draws() -> None:
    """MMD computes its first chunk with the observed statistic; the p-value must not notice."""
    observed = float(mean_difference(LABELS))
    by_loop = sequential_permutation_test(
        observed, mean_difference, LABELS, np.random.default_rng(5), permutations=500, stop_after=None,
        chunk_sizes=iter([64, 128, 256, 512]),
    )
    rng = np.random.default_rng(5)
    first = mean_difference(relabellings(LABELS, 64, rng))
    by_caller = sequential_permutation_test(
        observed, mean_difference, LABELS, rng, permutations=500, stop_after=None,
        chunk_sizes=iter([128, 256, 512]), first_null=first,
    )
    assert (by_caller.p_value, by_caller.used, by_caller.stopped) == (by_loop.p_value, 500, False)
    np.testing.assert_array_equal(by_caller.null, by_loop.null)


def test_draws_stop_at_the_rule_or_the_budget_in_chunks() -> None:
    drawn: list[int] = []

    def always_exceeds(labels: np.ndarray) -> np.ndarray:
        drawn.append(len(labels))
        assert sorted(labels[0]) == sorted(LABELS)  # a relabelling, not a resample
        return np.full(len(labels), 10.0)

    stopped = sequential_permutation_test(
        0.0, always_exceeds, LABELS, np.random.default_rng(1), permutations=1000, stop_after=3,
        chunk_sizes=itertools.repeat(50),
    )
    assert (stopped.p_value, stopped.used, stopped.stopped, drawn) == (1.0, 3, True, [50])
    assert len(stopped.null) == 3
    drawn.clear()
    full = sequential_permutation_test(
        20.0, always_exceeds, LABELS, np.random.default_rng(1), permutations=120, stop_after=3,
        chunk_sizes=itertools.repeat(50),
    )
    assert (full.p_value, full.used, full.stopped, drawn) == (1 / 121, 120, False, [50, 50, 20])
    assert full.diagnostics(120)["max_permutations"] == 120 and full.diagnostics(120)["null_p95"] == 10.0


@pytest.mark.parametrize(("permutations", "stop_after"), [(0, 10), (100, 0)])
def test_a_budget_that_cannot_give_a_valid_p_value_is_refused(permutations: int, stop_after: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        check_permutation_budget(permutations, stop_after)
