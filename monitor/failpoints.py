"""Crash points for fault-injection tests (as etcd's gofail or TiKV's fail-rs, minus the DSL).

``EMBMON_FAILPOINT=<name>`` (or ``<name>@<n>``: the n-th time) makes the process exit at once,
without cleanup, when it reaches :func:`reach` with that name: the only way to test a crash
between two durable steps that are microseconds apart. Unset (always, in production) a reach
costs one comparison.
"""

from __future__ import annotations

import os

EXIT_STATUS = 86
_name, _, _nth = (os.environ.get("EMBMON_FAILPOINT") or "").partition("@")
_left = int(_nth or 1)


def reach(name: str) -> None:
    global _left
    if name == _name:
        _left -= 1
        if _left == 0:
            os._exit(EXIT_STATUS)
