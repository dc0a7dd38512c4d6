"""Permutation p-values: relabel the pooled rows at random, drawn in chunks, stopped early.

Shared by the MMD (:mod:`monitor.drift.twosample.mmd`) and centroid (:mod:`monitor.drift.twosample.centroid`) tests:
each supplies the statistic of a batch of relabellings; :func:`sequential_permutation_test` draws
them (``rng.permuted`` of the observed labels, one chunk at a time) and applies the
Besag–Clifford stopping rule, so a test's p-value depends only on its seed and its statistic.

A cycle's deadline (:class:`~monitor.deadline.Deadline`) can end the draws early. The p-value
is then that of a test whose budget was the relabellings drawn so far: still valid, because when
the clock runs out does not depend on how the relabellings came out; only its floor, the smallest
p-value it could give (``1 / (1 + drawn)``), rises, and the outcome says so. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.deadline import Deadline


@dataclass(frozen=True)
class PermutationOutcome:
    """The p-value, how many relabellings it used, whether the stopping rule ended the draws, the
    null statistics of the used relabellings (in draw order), and whether the deadline cut the
    draws short (``truncated``) after ``drawn`` relabellings."""

    p_value: float
    used: int
    stopped: bool
    null: np.ndarray
    truncated: bool = False
    drawn: int = 0

    def floor(self, budget: int) -> float:
        """The smallest p-value this test could have given: ``1 / (1 + budget)``, or
        ``1 / (1 + drawn)`` when the deadline ended the draws."""
        return 1.0 / (1.0 + (self.drawn if self.truncated else budget))

    def diagnostics(self, budget: int) -> dict[str, Any]:
        """The test result's ``extra`` entries about the permutations; ``null_p95`` is what the
        statistic is compared with (the null's 95th percentile, for dashboards)."""
        return {
            "null": "permutation",
            "permutations": self.used,
            "max_permutations": budget,
            "stopped_early": self.stopped,
            "truncated": self.truncated,
            "p_value_floor": self.floor(budget),
            "null_p95": float(np.quantile(self.null, 0.95)),
        }


def check_permutation_budget(permutations: int, stop_after: int | None) -> None:
    """ValueError for a budget that could not give a valid p-value."""
    if permutations < 1:
        raise ValueError(f"permutations must be at least 1, got {permutations}")
    if stop_after is not None and stop_after < 1:
        raise ValueError(f"stop_after must be at least 1 or None, got {stop_after}")


def relabellings(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` uniform random permutations of the observed ``labels`` (N,), one per row: (count, N)."""
    return rng.permuted(np.tile(labels, (count, 1)), axis=1)


def sequential_permutation_test(
    observed: float,
    null_statistics: Callable[[np.ndarray], np.ndarray],
    labels: np.ndarray,
    rng: np.random.Generator,
    *,
    permutations: int,
    stop_after: int | None,
    chunk_sizes: Iterator[int],
    first_null: np.ndarray | None = None,
    deadline: Deadline | None = None,
) -> PermutationOutcome:
    """Draw relabellings in chunks until the stopping rule, the budget or the deadline ends it; the p-value.

    ``null_statistics`` maps a chunk of relabellings (count, N) to their statistics (count,);
    chunk ``i`` holds ``min(chunk_sizes[i], budget left)`` of them. ``first_null``: the
    statistics of a first chunk the caller drew itself with :func:`relabellings` and the same
    ``rng`` (MMD computes it in one pass with the observed statistic); the chunks then continue
    after it. See :func:`sequential_p_value` for the rule. ``deadline``: checked before each
    further chunk; once it has passed no more are drawn (``truncated``), and the p-value is the
    one a budget of the relabellings drawn so far gives (at least one chunk is always drawn).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = np.r_[np.ones(20), np.zeros(20)] + rng.normal(0, 0.5, 40)
    >>> labels = np.r_[np.ones(20), np.zeros(20)]
    >>> diff = lambda lab: (lab @ x) / 20 - ((1 - lab) @ x) / 20
    >>> outcome = sequential_permutation_test(
    ...     float(diff(labels)), diff, labels, rng, permutations=99, stop_after=5, chunk_sizes=iter([50, 50]))
    >>> outcome.p_value, outcome.used, outcome.stopped
    (0.01, 99, False)
    """
    null: list[np.ndarray] = []
    exceeded = np.zeros(0, dtype=bool)
    drawn, stopped, truncated = 0, False, False
    if first_null is not None:
        null.append(first_null)
        drawn = len(first_null)
        exceeded = exceedances(observed, first_null)
        p_value, used, stopped = sequential_p_value(exceeded, stop_after)
    while not stopped and drawn < permutations:
        if drawn and deadline is not None and deadline.expired():
            truncated = True
            break
        count = min(next(chunk_sizes), permutations - drawn)
        null.append(null_statistics(relabellings(labels, count, rng)))
        drawn += count
        exceeded = np.concatenate([exceeded, exceedances(observed, null[-1])])
        p_value, used, stopped = sequential_p_value(exceeded, stop_after)
    return PermutationOutcome(p_value, used, stopped, np.concatenate(null)[:used], truncated, drawn)


def exceedances(observed: float, null_statistics: np.ndarray) -> np.ndarray:
    """Which null statistics are at least the observed one (ties within a relative 1e-9 count:
    they are float noise from summation order)."""
    null = np.asarray(null_statistics, dtype=float)
    tol = 1e-9 * max(abs(observed), float(np.max(np.abs(null), initial=0.0)), 1e-300)
    return null >= observed - tol


def permutation_p_value(observed: float, null_statistics: np.ndarray) -> float:
    """``(1 + #{null >= observed}) / (1 + P)``: a p-value that is valid (never below its level).

    Counting the observed labelling among the permutations is what makes
    ``P(p <= alpha) <= alpha`` hold exactly under exchangeability.

    Examples
    --------
    >>> permutation_p_value(3.0, np.array([1.0, 2.0, 3.0, 4.0]))
    0.6
    """
    return sequential_p_value(exceedances(observed, null_statistics), None)[0]


def sequential_p_value(exceeded: np.ndarray, stop_after: int | None) -> tuple[float, int, bool]:
    """Besag–Clifford sequential Monte Carlo p-value from the permutations drawn so far, in order.

    Permutations are drawn until ``stop_after`` of them have reached the observed statistic, or
    until the budget runs out. Stopped at the ``L``-th permutation: ``p = stop_after / L``;
    otherwise ``p = (1 + G) / (1 + P)`` with ``G`` exceedances among all ``P``. The p-value is
    valid (Besag & Clifford 1991), and under no drift it stops after about
    ``stop_after / p`` permutations, so a large budget (needed to reach a tiny per-test alpha)
    is only spent when the data look drifted. Returns ``(p_value, permutations_used, stopped)``;
    the caller draws more while ``stopped`` is False and the budget lasts.

    Examples
    --------
    >>> sequential_p_value(np.array([False, True, True, False, True]), stop_after=2)
    (0.6666666666666666, 3, True)
    >>> sequential_p_value(np.array([False, True, False, False]), stop_after=2)
    (0.4, 4, False)
    """
    count = np.cumsum(np.asarray(exceeded, dtype=bool))
    if stop_after is not None and count.size and count[-1] >= stop_after:
        used = int(np.argmax(count >= stop_after)) + 1
        return stop_after / used, used, True
    total = int(count[-1]) if count.size else 0
    return (1.0 + total) / (1.0 + count.size), int(count.size), False
