"""From "one false alarm a month" to a p-value threshold per test, and the shared test result.

The operator states how often a false drift alarm is tolerable (``false_alarm_every``). The
drift tests run once per cycle (``interval_seconds``); if cycles were independent and each raised a
false alarm with probability ``alpha``, false alarms would arrive on average every
``interval / alpha``. So the per-cycle budget is ``alpha_cycle = interval / false_alarm_every``.

Several tests run per cycle, and the cycle's verdict is "drift" when any of them rejects, so the
budget is split across them: Bonferroni (each test at ``alpha_cycle / k``) or Holm's step-down
procedure. Both keep the family-wise error rate (the chance that the cycle's verdict is a false
alarm) at most ``alpha_cycle`` under any dependence between the tests, and both reject the global
null in exactly the same cycles (Holm's first step *is* Bonferroni's test of the smallest
p-value); Holm only names more of the tests as detected once one has. The procedures are in
:mod:`monitor.multiple_testing`; the suite applies them (:func:`monitor.drift.twosample.suite.apply_multiplicity`).
Arithmetic only (no numpy), so the settings that use it load fast.

A *sustained* alert (drift in at least ``n`` of the last ``m`` cycles) fires much less often than
single cycles do; :func:`sustained_onset_probability` gives the exact rate of new sustained false
alerts for independent cycles, and :func:`cycle_alpha_for_sustained` inverts it.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

Multiplicity = Literal["bonferroni", "holm"]

_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_DURATION_FULL = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*[smhdw]\s*)+\Z")


@dataclass(frozen=True)
class TestResult:
    """The outcome of one two-sample test: window sample vs reference sample.

    ``threshold`` is the p-value threshold the decision used (after any multiplicity correction);
    ``detected`` is ``p_value <= threshold``. ``extra`` holds test-specific diagnostics.
    """

    __test__ = False  # not a pytest test class

    test: str
    statistic: float
    p_value: float
    threshold: float
    detected: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def at_level(cls, test: str, statistic: float, p_value: float, alpha: float, extra: dict[str, Any]) -> TestResult:
        """A test's own verdict at ``alpha`` (before any multiplicity correction): detected when ``p <= alpha``."""
        return cls(test, statistic, p_value, alpha, p_value <= alpha, extra)


def parse_duration(text: str) -> float:
    """Seconds in a human duration such as ``"30d"``, ``"12h"``, ``"1w 2d"`` or ``"90m"``.

    Units: ``s``, ``m`` (minutes), ``h``, ``d``, ``w``. A bare number is rejected on purpose:
    "30" could mean seconds or days.

    Examples
    --------
    >>> parse_duration("30d")
    2592000.0
    >>> parse_duration("1h30m")
    5400.0
    """
    if not isinstance(text, str) or not _DURATION_FULL.match(text):
        raise ValueError(
            f"{text!r} is not a duration: use a number with a unit s, m, h, d or w, e.g. '30d' or '12h'"
        )
    seconds = sum(float(value) * _UNIT_SECONDS[unit] for value, unit in _DURATION_PART.findall(text))
    if not math.isfinite(seconds):  # 400 digits parse to inf
        raise ValueError(f"{text[:40]!r}... is not a finite duration")
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def cycle_alpha(interval_seconds: float, false_alarm_every_seconds: float) -> float:
    """Per-cycle false-alarm probability giving one false alarm every ``false_alarm_every`` on average.

    Examples
    --------
    >>> cycle_alpha(300, parse_duration("30d"))  # a 5-minute cycle, one false alarm a month
    0.00011574074074074075
    """
    if interval_seconds <= 0:
        raise ValueError(f"interval_seconds must be positive, got {interval_seconds}")
    if false_alarm_every_seconds <= interval_seconds:
        raise ValueError(
            f"the mean time between false alarms ({false_alarm_every_seconds:g}s) must be longer than "
            f"the test interval ({interval_seconds:g}s); otherwise every cycle may alarm"
        )
    return interval_seconds / false_alarm_every_seconds


def largest_passing(alpha: float, total: float, weight: float) -> float:
    """The largest ``t`` with ``t · total / weight <= alpha`` in floating point (about ``alpha · weight / total``):
    a weighted test's threshold. Rounding is monotone, so a p-value passes weighted Holm's step
    (decided as ``p · total / weight <= alpha``, the cycle p-value's arithmetic) exactly when it is at
    most ``t``: a threshold never disagrees with the decision, even one ulp from it.

    >>> largest_passing(0.1, 1.0, 1.0), largest_passing(0.1, 2.7, 0.3) * 2.7 / 0.3 <= 0.1
    (0.1, True)
    """
    t = alpha * weight / total
    while t > 0 and t * total / weight > alpha:
        t = math.nextafter(t, 0.0)
    while (up := math.nextafter(t, math.inf)) * total / weight <= alpha:
        t = up
    return t


def per_test_alpha(alpha: float, tests: int) -> float:
    """Bonferroni share of the cycle's budget for each of ``tests`` tests (Holm's strictest step)."""
    if tests < 1:
        raise ValueError(f"at least one test must run, got {tests}")
    return alpha / tests


def permutations_needed(alpha: float) -> int:
    """Fewest permutations whose smallest attainable p-value, ``1 / (1 + P)``, is below ``alpha``.

    Strictly below, so that float rounding in ``p <= alpha`` cannot decide the outcome.

    Examples
    --------
    >>> permutations_needed(0.05)
    20
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return math.ceil(1.0 / alpha)


def sustained_onset_probability(alpha: float, n: int, m: int) -> float:
    """Chance that a given cycle *starts* a sustained alert (≥ ``n`` detections in the last ``m``).

    For independent cycles each detecting with probability ``alpha``: the count in the window
    rises to ``n`` only when this cycle detects, the cycle leaving the window did not, and the
    ``m - 1`` cycles in between held exactly ``n - 1`` detections:
    ``alpha (1 - alpha) C(m-1, n-1) alpha^(n-1) (1 - alpha)^(m-n)``. With ``n = m = 1`` it is the
    chance that a cycle alarms after one that did not.

    Examples
    --------
    >>> sustained_onset_probability(0.01, 1, 1)  # a plain per-cycle alarm starting a new run
    0.0099
    >>> round(sustained_onset_probability(0.01, 3, 5), 12)
    5.821794e-06
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not 1 <= n <= m:
        raise ValueError(f"need 1 <= n <= m, got n={n}, m={m}")
    return alpha * (1 - alpha) * math.comb(m - 1, n - 1) * alpha ** (n - 1) * (1 - alpha) ** (m - n)


def sustained_false_alarm_every(alpha: float, n: int, m: int, interval_seconds: float) -> float:
    """Mean seconds between new sustained false alerts (infinite when ``alpha == 0``)."""
    q = sustained_onset_probability(alpha, n, m)
    return math.inf if q == 0 else interval_seconds / q


def cycle_alpha_for_sustained(
    interval_seconds: float, false_alarm_every_seconds: float, n: int, m: int
) -> float:
    """The largest per-cycle alpha whose sustained (``n`` of ``m``) alerts meet the target rate.

    Solves ``sustained_onset_probability(alpha, n, m) = interval / false_alarm_every`` by
    bisection on ``alpha`` in ``(0, n / (m + 1)]``, where the onset probability increases with
    alpha (beyond it, alarms are so frequent that runs merge and onsets become rarer).

    Examples
    --------
    >>> a = cycle_alpha_for_sustained(300, parse_duration("30d"), 3, 5)
    >>> round(a, 4)  # much larger than the 0.00012 a single-cycle alert could afford
    0.0276
    """
    target = cycle_alpha(interval_seconds, false_alarm_every_seconds)
    low, high = 0.0, n / (m + 1)
    if sustained_onset_probability(high, n, m) <= target:
        return high
    for _ in range(200):
        mid = (low + high) / 2
        if sustained_onset_probability(mid, n, m) > target:
            high = mid
        else:
            low = mid
    return low
