"""How numbers read in the rules: PromQL literals, and Prometheus' template functions redone in Python.

Alert descriptions show ``$value`` through a Prometheus template function (``humanize``,
``humanizePercentage``, ...). The generated promtool tests must state the exact text Prometheus
renders, so the same functions are reimplemented here, pinned by ``tests/artifacts/test_alerts.py`` and
checked against Go's by promtool itself.

Examples
--------
>>> format_number(10000.0), format_number(0.5)
('10000', '0.5')
>>> format_value("count", 30000), format_value("duration", 7860)
('30k', '2h 11m 0s')
"""

from __future__ import annotations

import math
from typing import Literal

ValueFormat = Literal["percent", "number", "count", "duration"]


def format_number(value: float) -> str:
    """Shortest exact text for a threshold (``0.5``, ``10000``)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _go_g4(value: float) -> str:
    """Go's ``fmt.Sprintf("%.4g", v)`` for finite values (what Prometheus' humanize uses)."""
    text = f"{value:.4g}"
    # Go writes exponents with at least two digits, as Python does: nothing to adapt
    return text


def humanize(value: float) -> str:
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix = p
            value /= 1000
        return _go_g4(value) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix = p
        value *= 1000
    return _go_g4(value) + prefix


def humanize_duration(value: float) -> str:
    if abs(value) >= 1:
        seconds = int(value)
        days, hours = seconds // 86400, seconds // 3600 % 24
        minutes, seconds = seconds // 60 % 60, seconds % 60
        if days:
            return f"{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{minutes}m {seconds}s"
        return f"{_go_g4(value)}s"
    raise ValueError("sub-second durations are not used by these alerts")


def format_value(kind: ValueFormat, value: float) -> str:
    """What Prometheus shows for ``value`` through the template function of ``kind``."""
    if kind == "percent":
        return _go_g4(value * 100) + "%"
    if kind == "number":
        return f"{value:.3f}"
    if kind == "count":
        return humanize(value)
    return humanize_duration(value)


_TEMPLATE_FUNC = {
    "percent": "humanizePercentage",
    "number": 'printf "%.3f"',
    "count": "humanize",
    "duration": "humanizeDuration",
}


def value_template(kind: ValueFormat, ref: str) -> str:
    """The template that shows ``ref`` (``$value``, or Grafana's reference) as ``kind``."""
    return "{{ " + ref + " | " + _TEMPLATE_FUNC[kind] + " }}"
