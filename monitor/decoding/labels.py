"""What may be a Prometheus label value here: model, stream, slice and probe names from the outside world.

Label values come from producers, so they are checked before they can become series: a bounded
alphabet and length keeps exposition valid and dashboards readable.
"""

from __future__ import annotations

import re
from typing import Any

# \Z, not $: "$" also matches before a trailing newline, which would let "m1\n" become a label value.
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,64}\Z")


def is_label_value(value: Any) -> bool:
    """Whether ``value`` is a string that may be a label value.

    >>> is_label_value("minilm-v2"), is_label_value("has space"), is_label_value(7), is_label_value("m1\\n")
    (True, False, False, False)
    """
    return isinstance(value, str) and LABEL_VALUE_RE.match(value) is not None
