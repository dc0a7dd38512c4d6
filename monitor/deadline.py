"""A point in time after which no new work starts: the one deadline drift cycles and probe runs share.

Drift cycles: A cycle must end before the next one is due, or the scheduler skips runs and the verdict goes
stale exactly when it matters. So a cycle gets a deadline (``drift.cycle_budget`` of the
interval); each (model, stream) gets an equal share of what is left when its turn comes; no test
starts after its stream's deadline, and a permutation test stops drawing relabellings once it
passes (its p-value stays valid, with a higher floor: :mod:`monitor.drift.twosample.permutation`). Nothing
is pre-empted: a test that started runs to its end, which is why the budget is below the interval.

Probe runs: each run gets ``timeout_seconds``; its loops call :meth:`Deadline.check` between
queries, and :class:`~monitor.retrieval.probes.deadline.ProbeDeadline` raises ``ProbeTimeout``.

The clock is injected (the daemon's clock; tests use a fake one), so cut points are testable
without wall time. Standard library only: the probes' light modules and the drift budget import it.

Examples
--------
>>> now = [100.0]
>>> cycle = Deadline.after(8.0, clock=lambda: now[0])
>>> first = cycle.share(2)  # two parts: the first gets half of what is left
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


class DeadlinePassed(TimeoutError):
    """Raised by :meth:`Deadline.check` once the deadline has passed."""


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

    def check(self) -> None:
        """Raise once the deadline has passed (for loops that stop between steps)."""
        if self.expired():
            raise self.passed()

    def passed(self) -> Exception:
        """The error :meth:`check` raises; a subclass names its own."""
        return DeadlinePassed(f"deadline passed {-self.remaining():.3g}s ago")

    def share(self, parts: int) -> Deadline:
        """The deadline of the next of ``parts`` equal shares of the time left (at least one part)."""
        now = self.clock()
        return type(self)(now + max(0.0, self.at - now) / max(1, parts), self.clock)
