"""Reading a daemon's log file in tests: the tracebacks that are ours to fix."""

from __future__ import annotations

import re

_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ (\S+): ", re.MULTILINE)

# kafka-python 3.0's own socket-close race: its I/O thread reads a connection that close() has
# just dropped (at shutdown, a rebalance, a killed peer). The connection is closed by then and its
# requests already failed over; nothing of ours ran. Each form: the logger, and what the record
# must all contain. Any other traceback (from the selector too) is ours to fix.
KNOWN_CLIENT_RACES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kafka.net.transport", ()),  # "Error receiving network data": the socket already None
    # the transport's read task wakes after close() and finds its socket gone (fd -1) ...
    ("kafka.net.selector", ("in _read_from_sock", "Invalid file descriptor: -1")),
    # ... or its protocol already dropped
    ("kafka.net.selector", ("in _read_from_sock",
                            "AttributeError: 'NoneType' object has no attribute 'data_received'")),
)


def _client_race(logger: str, record: str) -> bool:
    return any(logger == known and all(part in record for part in parts) for known, parts in KNOWN_CLIENT_RACES)


def tracebacks(text: str) -> list[str]:
    """The log records carrying a traceback, except kafka-python's own socket-close race."""
    starts = [(m.start(), m.group(1)) for m in _RECORD.finditer(text)]
    found = []
    for i, (start, logger) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        record = text[start:end]
        if "Traceback (most recent call last)" in record and not _client_race(logger, record):
            found.append(record)
    if not starts and "Traceback" in text:
        found.append(text)
    return found
