"""Start-up, the main wait and shutdown of a long-running daemon, and its signal handling.

The shape follows uvicorn's ``Server``: signal handlers go in first (a context manager that puts
the originals back), then start-up brings the parts up in order inside one exception-safe block
(a part that fails to start stops the ones already running, in reverse), then the main thread
waits for a stop request, then shutdown runs within a bounded time. A second SIGINT or SIGTERM
during shutdown ends the process at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Set by :meth:`request` (a signal, a test, the end of a finite run); the main thread waits on it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signals = 0  # stop signals received so far

    def request(self) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)


@contextlib.contextmanager
def capture_signals(stop: StopRequest, force_exit: Callable[[int], None] = os._exit) -> Iterator[None]:
    """SIGINT/SIGTERM request a clean stop; a second one calls ``force_exit(128 + signum)``.

    Only the main thread may install handlers; elsewhere (a daemon embedded in a test's thread)
    this does nothing. The previous handlers come back on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        stop.signals += 1
        name = signal.Signals(signum).name
        if stop.signals > 1:
            logger.warning("received %s again: exiting now, without a clean shutdown", name)
            logging.shutdown()
            force_exit(128 + signum)
            return
        logger.info("received %s; shutting down (send it again to exit at once)", name)
        stop.request()

    previous = {sig: signal.signal(sig, handle) for sig in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class StartUp:
    """Brings parts up in order; if one fails, stops those already started (in reverse) and re-raises.

    >>> events = []
    >>> def broken(): raise OSError("port in use")
    >>> startup = StartUp()
    >>> try:
    ...     with startup:
    ...         startup.start("state", lambda: events.append("state up"), lambda: events.append("state down"))
    ...         startup.start("http", broken, lambda: events.append("http down"))
    ... except OSError as exc:
    ...     print(exc, events)
    port in use ['state up', 'state down']
    """

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def start(self, name: str, start: Callable[[], object], stop: Callable[[], object] | None = None) -> None:
        logger.debug("starting %s", name)
        start()
        if stop is not None:
            self._stack.callback(_quietly, name, stop)

    def __enter__(self) -> StartUp:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is not None:
            logger.error("start-up failed: %s; stopping what had started", exc)
            self._stack.close()
        else:
            self._stack.pop_all()


def _quietly(name: str, stop: Callable[[], object]) -> None:
    try:
        stop()
    except Exception:  # noqa: BLE001 - undoing a failed start-up must not hide its cause
        logger.warning("could not stop %s after a failed start-up", name, exc_info=True)
