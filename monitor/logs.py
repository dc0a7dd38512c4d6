"""Logging set-up and a rate limiter for messages that bad input can trigger at line rate."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str = "INFO", path: Path | None = None) -> None:
    """One logging configuration for the process (idempotent): to stderr, or appended to ``path``."""
    root = logging.getLogger()
    if not any(getattr(h, "_embmon", False) for h in root.handlers):
        handler: logging.Handler = logging.StreamHandler() if path is None else logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler._embmon = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))


class RateLimitedLog:
    """Logs at most one message per key every ``interval`` seconds, then says how many it held back.

    A flood of malformed records must be visible in the log without drowning it.
    """

    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self.logger = logger  # where the traceback of a rate-limited failure goes (at debug: each_guarded)
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged less than ``interval`` ago. True if logged."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            held = self._suppressed.pop(key, 0)
            self._last[key] = now
            if len(self._last) > 1024:  # keys come from a bounded set; this is a safety valve
                self._last.clear()
        if held:
            self._logger.warning(msg + " (%d similar messages suppressed)", *args, held)
        else:
            self._logger.warning(msg, *args)
        return True


def each_guarded(targets: Iterable[Any], hook: str, args: tuple[Any, ...], log: RateLimitedLog, kind: str) -> None:
    """``target.<hook>(*args)`` for each target (each has a ``name``): one that raises is logged through
    ``log`` (its traceback at debug) and the others still run, since a hook on the ingest thread must
    not starve the rest (the retrieval and index probes' ``on_embeddings`` and ``on_interaction``)."""
    for target in targets:
        try:
            getattr(target, hook)(*args)
        except Exception:
            log.warning(f"hook:{target.name}", "%s %s: %s failed", kind, target.name, hook)
            log.logger.debug("%s %s %s", kind, target.name, hook, exc_info=True)
