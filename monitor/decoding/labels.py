"""What may be a Prometheus label value here: model, stream, slice, probe, index probe and replica names.

The one rule, for what producers send (the decoder) and for what the settings name (every settings
module takes :data:`LabelValue` or calls :func:`check_label_value`): 1 to 64 ASCII letters, digits and
``_.:/@+-``. Label values come from the outside world, so they are checked before they can become
series: a bounded alphabet and length keeps exposition valid and dashboards readable.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator

# \Z, not $: "$" also matches before a trailing newline, which would let "m1\n" become a label value.
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:/@+-]{1,64}\Z")


def is_label_value(value: Any) -> bool:
    """Whether ``value`` is a string that may be a label value.

    >>> is_label_value("minilm-v2"), is_label_value("has space"), is_label_value(7), is_label_value("m1\\n")
    (True, False, False, False)
    """
    return isinstance(value, str) and LABEL_VALUE_RE.match(value) is not None


def check_label_value(value: str, what: str = "label") -> str:
    """``value`` when it may be a label value, else a ``ValueError`` naming ``what`` and the rule.

    >>> check_label_value("probe\\n", "probe name")
    Traceback (most recent call last):
    ValueError: probe name 'probe\\n' is not a valid label value (^[A-Za-z0-9_.:/@+-]{1,64}\\Z)
    """
    if not is_label_value(value):
        raise ValueError(f"{what} {value!r} is not a valid label value ({LABEL_VALUE_RE.pattern})")
    return value


# A settings field that becomes a label value.
LabelValue = Annotated[str, AfterValidator(check_label_value)]
