"""Serving alerts: the embedding endpoint fails a conformance check (docs/canaries.md).

The serving probe's canaries page through ``EmbeddingMonitorModelChanged`` (canary.py). This
sibling pages on what the canaries cannot show: a statistic of a conformance check above its
tolerance (``drift`` below the canary tolerance, ``norm`` with every cosine unchanged, batch,
repeat and sensitivity failures). Its value is the worst check's statistic over its tolerance
(above 1 fails), gated by a counted violation in the last 10 minutes; it resolves at the first
cycle that passes the check.
"""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.scenarios import repeat, seq, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.serving"
VIOLATION_RANGE = "10m"
TEST_LABELS = {"model": "minilm", "check": "drift"}
TOLERANCE = 2.0 ** -10  # a power of two: the test's ratio is exact


def alerts(th: Thresholds) -> list[Alert]:
    deviation, tolerance = m("embmon_serving_deviation"), m("embmon_serving_tolerance")
    violations = m("embmon_serving_violations_total")
    return [
        Alert(
            name=f"{PREFIX}ServingNonconformant",
            group=GROUP,
            severity="critical",
            for_="1m",
            summary="The embedding endpoint fails a conformance check: its vectors changed or are served "
                    "inconsistently.",
            description=(
                "The serving probe of model {{ $labels.model }} finds the {{ $labels.check }} check at $VALUE times "
                f"its tolerance, with failed cycles in the last {VIOLATION_RANGE}."
            ),
            value_format="number",
            condition=Condition(f"max by (model, check) ({deviation} / {tolerance})", ">", 1),
            gate=Condition(f"sum by (model, check) (increase({violations}[{VIOLATION_RANGE}]))", ">", 0),
            scenario_builder=_scenario(th.job),
            live_signals=(f"max by (model, check) ({deviation} / {tolerance})",
                          f"sum by (model, check) ({violations})"),
        ),
    ]


def _scenario(job: str) -> ScenarioBuilder:
    """A conformant endpoint for 5 minutes, then one fine-tuning step: the drift check at 64 times its
    threshold and a violation every cycle, until the endpoint is rolled back at minute 12."""

    def build(alert: Alert) -> Scenario:
        labels = {**target_labels(job), **TEST_LABELS}
        thr = alert.condition.threshold
        before, during = 5, 7
        bad = 64 * thr * TOLERANCE  # exact: a product with a power of two
        good = 0.5 * thr * TOLERANCE
        deviation, tolerance = m("embmon_serving_deviation"), m("embmon_serving_tolerance")
        violations = m("embmon_serving_violations_total")
        n = before + during + 11
        return Scenario(
            60,
            (
                Series(deviation, labels, seq(repeat(good, before), repeat(bad, during), repeat(good, 11))),
                Series(tolerance, labels, repeat(TOLERANCE, n)),
                Series(violations, labels, seq(repeat(0, before), f"1+1x{during - 1}", repeat(during, 11))),
            ),
            # float noise: below the tolerance, never counted
            (
                Series(deviation, labels, repeat(good, n)),
                Series(tolerance, labels, repeat(TOLERANCE, n)),
                Series(violations, labels, repeat(0, n)),
            ),
            before * 60,
            dict(TEST_LABELS),
            64 * thr,
            resolves_at=(before + during) * 60,
        )

    return build
