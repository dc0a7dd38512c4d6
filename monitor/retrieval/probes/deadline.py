"""A probe run's time budget (the shared :class:`~monitor.deadline.Deadline`), and the errors that
end a run without a result.

Standard library only: the HTTP retriever and the ids-path reader raise these, and they must stay
importable without the probes' numpy and torch code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from monitor.deadline import Deadline


class ProbeError(RuntimeError):
    """A run that could not produce a trustworthy result (endpoint down, garbage, bad input)."""


class ProbeTimeout(ProbeError):
    """The run passed its deadline; what it computed so far is discarded."""


@dataclass(frozen=True)
class ProbeDeadline(Deadline):
    """A run's time budget on the monotonic clock; ``check()`` raises ``ProbeTimeout`` past it."""

    seconds: float = 0.0

    @classmethod
    def starting_now(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> ProbeDeadline:
        return cls(clock() + float(seconds), clock, float(seconds))

    def passed(self) -> Exception:
        return ProbeTimeout(f"over the {self.seconds:g}s timeout")
