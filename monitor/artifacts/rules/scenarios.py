"""What the generated promtool tests are written from: series notation, test labels, shared histories.

A scenario builder turns an alert (with its possibly overridden threshold and ``for``) into a
:class:`~monitor.artifacts.rules.model.Scenario`. Builders used by one area live with that area's
alerts; the two used by several areas (an age that grows, counters that rise at fixed rates) live
here with the helpers every builder uses.
"""

from __future__ import annotations

from monitor.artifacts.rules.model import Alert, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.values import format_number

# Labels of the synthetic series in the generated unit tests.
TEST_INSTANCE = "monitor-0:9464"
TEST_MODEL = {"model": "minilm", "stream": "queries"}
TEST_PROBE = {"probe": "golden", "model": "minilm", "slice": "all", "k": "10"}


def repeat(value: float, count: int) -> str:
    """``count`` samples of ``value`` in promtool's expanding notation.

    >>> repeat(0.5, 3), repeat(1, 1), repeat(1, 0)
    ('0.5x2', '1', '')
    """
    if count <= 0:
        return ""
    return f"{format_number(value)}x{count - 1}" if count > 1 else format_number(value)


def seq(*parts: str) -> str:
    """Expanding-notation parts one after the other (empty parts skipped)."""
    return " ".join(p for p in parts if p)


def target_labels(job: str) -> dict[str, str]:
    """The labels Prometheus gives every series scraped from the monitor."""
    return {"job": job, "instance": TEST_INSTANCE}


def steady_scenario(
    metric: str, labels: dict[str, str], bad: float, good: float, alert_labels: dict[str, str]
) -> ScenarioBuilder:
    """``metric`` at ``bad`` throughout (fires ``for`` after the start); the quiet history holds ``good``."""

    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        return Scenario(
            60,
            (Series(metric, labels, repeat(bad, n)),),
            (Series(metric, labels, repeat(good, n)),),
            0,
            alert_labels,
            bad,
        )

    return build


def age_scenario(metric: str, extra: dict[str, str], job: str) -> ScenarioBuilder:
    """A timestamp gauge frozen at 0: its age is the evaluation time."""

    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        onset = (int(thr) // 60 + 1) * 60
        fire = onset + alert.for_seconds
        n = fire // 60 + 2
        labels = {**target_labels(job), **extra}
        return Scenario(
            60,
            (Series(metric, labels, repeat(0, n)),),
            (Series(metric, labels, f"0+60x{n - 1}"),),
            onset,
            labels,
            float(fire),
        )

    return build


def ratio_counter_scenario(
    bad_metric: str, bad_labels: list[dict[str, str]], good_metric: str, good_labels: dict[str, str],
    out_labels: dict[str, str], job: str,
) -> ScenarioBuilder:
    """Counters rising at fixed rates: the bad share is 75 % (or 95 % for high thresholds)."""

    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        if thr >= 0.95:
            raise ValueError(f"{alert.name}: threshold {thr} leaves no room for a test scenario")
        bad_rate, good_rate = (3, 1) if thr < 0.75 else (19, 1)
        n = (60 + alert.for_seconds) // 60 + 2
        shares = [bad_rate - (len(bad_labels) - 1)] + [1] * (len(bad_labels) - 1)
        firing = [
            Series(bad_metric, {**target_labels(job), **labels}, f"0+{share}x{n - 1}")
            for labels, share in zip(bad_labels, shares, strict=True)
        ]
        good = Series(good_metric, {**target_labels(job), **good_labels}, f"0+{good_rate}x{n - 1}")
        quiet = [Series(s.metric, s.labels, repeat(0, n)) for s in firing]
        return Scenario(
            60,
            (*firing, good),
            (*quiet, good),
            60,  # rate() needs two samples
            out_labels,
            bad_rate / (bad_rate + good_rate),
        )

    return build
