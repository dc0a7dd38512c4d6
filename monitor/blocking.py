"""Work that may block, in a thread of its own that the caller waits for with a bound.

kafka-python's bootstrap and close, a checkpoint restore or write: the daemon's lifecycle, the
Kafka sources and the shutdown checkpoint all hand such work to :class:`BlockingCall`, so it lives
below all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class BlockingCall(Generic[T]):
    """``work()`` in a daemon thread named ``name``, which callers wait for with a bound.

    For work that must not hold the thread that stops the daemon. kafka-python's bootstrap (the
    ``KafkaConsumer`` constructor) waits up to ``bootstrap_timeout_ms`` (30 s) for a broker, and a
    connection to an address that accepts but never answers holds it all that time; ``close`` may
    wait for the group coordinator; a restore or a checkpoint write may be slow. A caller that
    stops waiting abandons the call, which ends with the process (a daemon thread) or by itself later.
    """

    def __init__(self, name: str, work: Callable[[], T]):
        self._done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], T]) -> None:
        try:
            self.result = work()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            self.error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """True once the call has ended (returned or raised) within ``timeout`` seconds."""
        return self._done.wait(timeout)
