"""A test cycle's time budget: a deadline the cycle's work checks between steps.

A cycle must end before the next one is due, or the scheduler skips runs and the verdict goes
stale exactly when it matters. So a cycle gets a deadline (``drift.cycle_budget`` of the
interval); each (model, stream) gets an equal share of what is left when its turn comes; no test
starts after its stream's deadline, and a permutation test stops drawing relabellings once it
passes (its p-value stays valid, with a higher floor: :mod:`monitor.drift.permutation`). Nothing
is pre-empted: a test that started runs to its end, which is why the budget is below the interval.

The clock is injected (the daemon's clock; tests use a fake one), so cut points are testable
without wall time. Standard library only.

Examples
--------
>>> now = [100.0]
>>> cycle = Deadline.after(8.0, clock=lambda: now[0])
>>> first = cycle.share(2)  # two streams: the first gets half of what is left
>>> first.at, first.expired()
(104.0, False)
>>> now[0] = 105.0
>>> first.expired(), cycle.share(1).at
(True, 108.0)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Deadline:
    """A point in time on ``clock`` after which no new work starts."""

    at: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return cls(clock() + seconds, clock)

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf)

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - self.clock()

    def expired(self) -> bool:
        return self.remaining() <= 0

    def share(self, parts: int) -> Deadline:
        """The deadline of the next of ``parts`` equal shares of the time left (at least one part)."""
        now = self.clock()
        return Deadline(now + max(0.0, self.at - now) / max(1, parts), self.clock)
