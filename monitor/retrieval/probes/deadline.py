"""A probe run's time budget, and the errors that end a run without a result.

Standard library only: the HTTP retriever and the ids-path reader raise these, and they must stay
importable without the probes' numpy and torch code.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ProbeError(RuntimeError):
    """A run that could not produce a trustworthy result (endpoint down, garbage, bad input)."""


class ProbeTimeout(ProbeError):
    """The run passed its deadline; what it computed so far is discarded."""


class Deadline:
    """A run's time budget on the monotonic clock; ``check()`` raises ``ProbeTimeout`` past it."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = float(seconds)
        self._clock = clock
        self._end = clock() + self.seconds

    def remaining(self) -> float:
        return self._end - self._clock()

    def check(self) -> None:
        if self.remaining() <= 0:
            raise ProbeTimeout(f"over the {self.seconds:g}s timeout")
