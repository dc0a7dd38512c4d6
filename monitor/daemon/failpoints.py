"""Crash and stall points for fault-injection tests (as etcd's gofail or TiKV's fail-rs, minus the DSL).

``EMBMON_FAILPOINT=<name>`` (or ``<name>@<n>``: the n-th time) makes the process exit at once,
without cleanup, when it reaches :func:`reach` with that name: the only way to test a crash
between two durable steps that are microseconds apart. ``<name>=sleep(<seconds>)`` (also with
``@<n>``) makes the thread that reaches it sleep instead, every time from the n-th on: a restore or
a checkpoint write as slow as a huge state or a stalled disk would make it, to test what a signal
does meanwhile. Unset (always, in production) a reach costs one comparison.
"""

from __future__ import annotations

import logging
import os
import re
import time

EXIT_STATUS = 86
_spec = os.environ.get("EMBMON_FAILPOINT") or ""
_point, _, _action = _spec.partition("=")
_name, _, _nth = _point.partition("@")
_left = int(_nth or 1)
_sleep = re.fullmatch(r"sleep\((\d+(?:\.\d+)?)\)", _action)
if _action and _sleep is None:
    raise ValueError(f"EMBMON_FAILPOINT: {_action!r} is not sleep(<seconds>)")


def reach(name: str) -> None:
    global _left
    if name == _name:
        _left -= 1
        if _left > 0:
            return
        if _sleep is not None:
            logging.getLogger(__name__).warning("fail point %s: sleeping %ss", name, _sleep.group(1))
            time.sleep(float(_sleep.group(1)))
        elif _left == 0:
            os._exit(EXIT_STATUS)
