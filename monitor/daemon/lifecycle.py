"""Start-up, the main wait and shutdown of a long-running daemon, and its signal handling.

The shape follows uvicorn's ``Server``: signal handlers go in first (a context manager that puts
the originals back), then start-up brings the parts up in order inside one exception-safe block
(a part that fails to start stops the ones already running, in reverse), then the main thread
waits for a stop request, then shutdown runs within a bounded time. A second SIGINT or SIGTERM
during shutdown ends the process at once.

A stop request is honoured in every phase (docs/operations.md, "Stopping"): start-up checks it
before each part, and a part that may take long (restoring a large checkpoint) runs in a thread
that start-up stops waiting for when a stop is requested (:class:`StartInterrupted`); once a stop
is requested, :class:`ShutdownWatchdog` ends the process when the main thread has finished (work
still running in other threads is abandoned, and named in the log) or, at the latest, when the
shutdown bound has passed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from monitor.blocking import BlockingCall

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
LEFTOVER_GRACE_SECONDS = 2.0  # after the shutdown, for the process to exit by itself
SIGNAL_CHECK_SECONDS = 0.2  # the main thread's wait returns to Python this often (see StopRequest.wait)


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
        """True once a stop is requested; False when ``timeout`` passes first.

        In the main thread the wait is cut into slices of :data:`SIGNAL_CHECK_SECONDS`. CPython runs a
        signal's Python handler only in the main thread, between bytecodes, and a signal the kernel
        hands to another thread does not wake a main thread blocked on a lock: a bare
        ``Event.wait()`` there would never see that SIGTERM (measured on a loaded machine, where
        one went unanswered for over a minute until a second one came).
        """
        if threading.current_thread() is not threading.main_thread():
            return self._event.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SIGNAL_CHECK_SECONDS if deadline is None else min(SIGNAL_CHECK_SECONDS, deadline - time.monotonic())
            if left <= 0:
                return self._event.is_set()
            if self._event.wait(left):
                return True


class SignalPipe:
    """Every signal with a Python handler, as one byte on a socket, in whatever thread the kernel handed it to.

    CPython's C-level handler writes the signal's number to the wake-up fd (``signal.set_wakeup_fd``)
    at once, in the thread that received it; the Python handler runs later, in the main thread,
    and only when that thread next runs bytecode: not while it is blocked in a join or a lock
    (a shutdown stuck in a close). :class:`ShutdownWatchdog` reads this pipe, so that a second stop
    signal cuts such a shutdown short. ``before``: the stop signals already counted when it was
    installed. Made and closed in the main thread; the previous wake-up fd comes back on close.
    """

    def __init__(self, before: int) -> None:
        self.before = before
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)

    def read(self, timeout: float) -> list[int]:
        """The signal numbers received since the last read, waiting up to ``timeout`` for one."""
        try:
            ready, _, _ = select.select([self._reader], [], [], timeout)
            return list(self._reader.recv(512)) if ready else []
        except (OSError, ValueError):  # closed meanwhile (the daemon returned): nothing more to read
            return []

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._writer.close()
        self._reader.close()


@contextlib.contextmanager
def capture_signals(
    stop: StopRequest, force_exit: Callable[[int], None] = os._exit, pipe: bool = False
) -> Iterator[SignalPipe | None]:
    """SIGINT/SIGTERM request a clean stop; a second one calls ``force_exit(128 + signum)``.

    Only the main thread may install handlers; elsewhere (a daemon embedded in a test's thread)
    this does nothing and yields None. The previous handlers come back on exit. ``pipe``: also
    yield a :class:`SignalPipe` (closed on exit), for a watchdog to see signals the main thread
    cannot handle yet.
    """
    if threading.current_thread() is not threading.main_thread():
        yield None
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
    wakeup = None
    try:
        wakeup = SignalPipe(stop.signals) if pipe else None
        yield wakeup
    finally:
        if wakeup is not None:
            wakeup.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stop_signals(stop: StopRequest) -> Iterator[None]:
    """:func:`capture_signals` for a whole command, its build included: a second stop signal ends the
    process at once with ``128 + signum``, whichever thread the kernel handed it to, even while the main
    thread is still busy building (Python's handlers would run only after the build). A signal-only
    :class:`ShutdownWatchdog` (no bound) reads the wake-up pipe; it is retired, its thread ended, on exit.
    """
    with capture_signals(stop, pipe=True) as signals:
        guard = None if signals is None else ShutdownWatchdog(stop, math.inf, signals=signals).start()
        try:
            yield
        finally:
            if guard is not None:
                guard.retire()


class StartInterrupted(Exception):
    """A stop was requested while the daemon was starting; raised instead of starting ``part``."""

    def __init__(self, part: str):
        super().__init__(f"stop requested while starting {part}")
        self.part = part


class StartUp:
    """Brings parts up in order; if one fails, stops those already started (in reverse) and re-raises.

    With a :class:`StopRequest`, a requested stop raises :class:`StartInterrupted` before the next
    part, and a part started with ``background=True`` runs in a daemon thread that is waited for
    only until a stop is requested (then abandoned: it must change nothing that outlives the process).

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

    def __init__(self, stop: StopRequest | None = None) -> None:
        self._stack = contextlib.ExitStack()
        self._stop = stop
        self.current: str | None = None  # the part being started

    def start(
        self, name: str, start: Callable[[], object], stop: Callable[[], object] | None = None, background: bool = False
    ) -> None:
        self._check(name)
        logger.debug("starting %s", name)
        self.current = name
        if background and self._stop is not None:
            self._in_thread(name, start)
        else:
            start()
        self.current = None
        if stop is not None:
            self._stack.callback(_quietly, name, stop)

    def _check(self, name: str) -> None:
        if self._stop is not None and self._stop.requested:
            raise StartInterrupted(name)

    def _in_thread(self, name: str, start: Callable[[], object]) -> None:
        call = BlockingCall(f"embmon-start-{name.replace(' ', '-')}", start)
        while not call.wait(0.05):
            if self._stop is not None and self._stop.requested:
                logger.warning("stop requested while %s was under way: abandoning it", name)
                raise StartInterrupted(name)
        if call.error is not None:
            raise call.error

    def __enter__(self) -> StartUp:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if isinstance(exc, StartInterrupted):
            logger.info("%s; stopping what had started", exc)
            self._stack.close()
        elif exc is not None:
            logger.error("start-up failed: %s; stopping what had started", exc)
            self._stack.close()
        else:
            self._stack.pop_all()


def _quietly(name: str, stop: Callable[[], object]) -> None:
    try:
        stop()
    except Exception:  # undoing a failed start-up must not hide its cause
        logger.warning("could not stop %s after a failed start-up", name, exc_info=True)


class ShutdownWatchdog:
    """Once a stop is requested, ends the process within ``bound`` seconds whatever still runs.

    A daemon thread: it waits for the stop request, then for the shutdown to be done
    (:meth:`finished`, or the main thread ended) or for ``bound`` seconds to pass, whichever comes
    first. Past the bound it calls ``force_exit(exit_status())`` (0 unless a part failed) at once;
    after the shutdown it leaves the process a moment (``LEFTOVER_GRACE_SECONDS``) to exit by itself
    and then calls ``force_exit(exit_status())``, logging what it abandoned: the interpreter would
    otherwise wait for a scheduled job still writing to a stalled disk. A process that exits by itself takes the
    watchdog with it. Only for a daemon that owns its process (``Daemon.serve``).

    With ``signals`` (:class:`SignalPipe`), a stop signal requests the stop and a second one during
    the shutdown calls ``force_exit(128 + signum)`` at once, whichever thread received them and
    whatever the main thread is blocked in. A daemon that returns without a stop request (a finite run) ends the
    watchdog's thread with it: :meth:`retire` before its ``stop()``, which requests the stop too
    (else the watchdog would end the process, an in-process caller's included, after its grace).
    """

    def __init__(self, stop: StopRequest, bound: float, force_exit: Callable[[int], None] = os._exit,
                 main: threading.Thread | None = None, exit_status: Callable[[], int] = lambda: 0,
                 signals: SignalPipe | None = None):
        self._stop, self.bound, self._force_exit, self._exit_status = stop, bound, force_exit, exit_status
        self._main = main or threading.main_thread()
        self._signals = signals
        self._received = signals.before if signals is not None else 0
        self._finished = threading.Event()
        self._retired = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="embmon-shutdown-watchdog", daemon=True)

    def start(self) -> ShutdownWatchdog:
        self._thread.start()
        return self

    def finished(self) -> None:
        """The shutdown is done: what still runs in other threads is abandoned work."""
        self._finished.set()

    def retire(self, timeout: float = 1.0) -> None:
        """The daemon served out without a stop request (a finite run): end the watchdog's thread, so that
        the stop that follows neither ends the process nor leaves the thread running; waits up to ``timeout``."""
        self._retired.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _watch(self) -> None:
        while not self._stop.requested:
            if self._retired.is_set() or self._finished.is_set() or not self._main.is_alive():
                return  # served out without a stop request: nothing to watch
            if self._signals is None:
                self._stop.wait(0.1)
            else:
                self._pause(0.1)  # a stop signal requests the stop here too, before the main thread can
        deadline = time.monotonic() + self.bound
        while (self._main.is_alive() and not self._finished.is_set() and not self._retired.is_set()
               and time.monotonic() < deadline):
            self._pause(0.05)
        if self._retired.is_set():
            return  # a finite run's own stop, or the end of a command (see retire, stop_signals)
        if self._main.is_alive() and not self._finished.is_set():
            left = self._others()
            logger.error("shutdown did not finish within %.1fs of the stop request: exiting now (%s)", self.bound,
                         "still running: " + ", ".join(left) if left else "the main thread is stuck")
        else:
            # The interpreter now waits for what still runs: non-daemon threads, thread-pool workers
            # (even daemon ones: a scheduled job still writing), atexit handlers. A moment for them.
            time.sleep(max(0.0, min(deadline, time.monotonic() + LEFTOVER_GRACE_SECONDS) - time.monotonic()))
            left = self._others()
            logger.warning("exiting without waiting for %s (work abandoned at shutdown)",
                           ", ".join(left) if left else "the interpreter's exit handlers")
        logging.shutdown()
        self._force_exit(self._exit_status())

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or end the process at a second stop signal (class docstring)."""
        if self._signals is None:
            time.sleep(seconds)
            return
        for signum in self._signals.read(seconds):
            if signum not in HANDLED_SIGNALS:
                continue
            self._received += 1
            if self._received == 1:
                self._stop.request()
            else:
                logger.warning("received %s again during the shutdown: exiting now, without waiting for it",
                               signal.Signals(signum).name)
                logging.shutdown()
                self._force_exit(128 + signum)
                return

    def _others(self) -> list[str]:
        """The threads besides the main one and this one that still run."""
        me = threading.current_thread()
        return sorted(t.name for t in threading.enumerate() if t.is_alive() and t is not self._main and t is not me)
