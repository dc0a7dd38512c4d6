"""The one way tests wait for what a server does in its own time: poll until true, or fail saying what."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    message: str = "",
    interval: float = 0.2,
    retry: tuple[type[BaseException], ...] = (OSError,),
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    An exception in ``retry`` counts as "not yet" (by default ``OSError``: a server not listening
    yet, a connection reset). After ``timeout`` seconds the test fails with ``message``, the last
    value or exception, and what ``on_timeout`` adds (a log's tail, say). The predicate runs at
    least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = predicate()
        except retry as exc:
            last = exc
        else:
            if last:
                return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            extra = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate}: last={last!r}{extra}")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
