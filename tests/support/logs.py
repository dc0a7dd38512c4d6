"""Reading a daemon's log file in tests: the tracebacks that are ours to fix."""

from __future__ import annotations

import re

_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ (\S+): ", re.MULTILINE)

# kafka-python 3.0 logs this itself when its IO loop reads a socket that close() already dropped
# (a race inside the client while the consumer shuts down); nothing is lost and nothing of ours ran.
KNOWN_CLIENT_NOISE = ("kafka.net.transport",)
# The same race seen from the client's selector: the transport's read task (`_read_from_sock`)
# wakes after close() and finds its socket gone (fd -1) or its protocol already dropped (None).
# The connection is closed by then and its requests already failed over; only these exact forms
# pass, any other traceback from the selector still fails a test.
_READ_TASK = "in _read_from_sock"
_READ_AFTER_CLOSE = ("Invalid file descriptor: -1",
                     "AttributeError: 'NoneType' object has no attribute 'data_received'")


def _client_noise(logger: str, record: str) -> bool:
    if logger in KNOWN_CLIENT_NOISE:
        return True
    return (logger == "kafka.net.selector" and _READ_TASK in record
            and any(error in record for error in _READ_AFTER_CLOSE))


def tracebacks(text: str) -> list[str]:
    """The log records carrying a traceback, except kafka-python's own socket-close race."""
    starts = [(m.start(), m.group(1)) for m in _RECORD.finditer(text)]
    found = []
    for i, (start, logger) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        record = text[start:end]
        if "Traceback (most recent call last)" in record and not _client_noise(logger, record):
            found.append(record)
    if not starts and "Traceback" in text:
        found.append(text)
    return found
