"""Drift alerts: the stream's verdict (the suite's, or an alarm of the accumulating detector), and a
suite verdict that holds for hours."""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import MODEL_STREAM, PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.scenarios import TEST_MODEL, repeat, seq, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.drift"


def alerts(th: Thresholds) -> list[Alert]:
    job = th.job
    detected = m("embmon_drift_detected")
    return [
        Alert(
            name=f"{PREFIX}DriftDetected",
            group=GROUP,
            severity="info",
            for_="15m",
            summary="The drift suite reports that embeddings moved away from the reference window.",
            description=f"The combined drift verdict for {MODEL_STREAM} is $VALUE (1 = drifted).",
            value_format="count",
            # the suite's verdict, or an alarm of the accumulating detector in the last hour (an alarm
            # flags one cycle and restarts the detector: its counter keeps it visible past `for`)
            condition=Condition(
                f'max by (model, stream) ({detected}{{test="suite"}} or '
                f'ceil(clamp_max(increase({m("embmon_drift_evidence_alarms_total")}[1h]), 1)))', ">", 0),
            scenario_builder=_detected_scenario(job),
        ),
        Alert(
            name=f"{PREFIX}DriftSustained",
            group=GROUP,
            severity="warning",
            for_="6h",
            summary="Embeddings have stayed drifted from the reference for hours.",
            description=f"The drift suite has flagged {MODEL_STREAM} for $VALUE of the last hour, "
            "and has kept doing so.",
            value_format="percent",
            condition=Condition(f'avg by (model, stream) (avg_over_time({detected}{{test="suite"}}[1h]))', ">", 0.5),
            scenario_builder=_sustained_scenario(job),
        ),
    ]


def _detected_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        labels = {**target_labels(job), **TEST_MODEL}
        return Scenario(
            60,
            (Series(m("embmon_drift_detected"), {**labels, "test": "suite"}, repeat(1, n)),),
            (
                # one test alone flagging drift is not the suite's verdict; an accumulating
                # detector that never alarmed adds nothing
                Series(m("embmon_drift_detected"), {**labels, "test": "mmd"}, repeat(1, n)),
                Series(m("embmon_drift_detected"), {**labels, "test": "suite"}, repeat(0, n)),
                Series(m("embmon_drift_evidence_alarms_total"), labels, repeat(0, n)),
            ),
            0,
            dict(TEST_MODEL),
            1.0,
        )

    return build


def _sustained_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        minutes = alert.for_seconds // 60
        labels = {**target_labels(job), **TEST_MODEL, "test": "suite"}
        metric = m("embmon_drift_detected")
        return Scenario(
            60,
            (Series(metric, labels, repeat(1, minutes + 2)),),
            # detected, then cleared well before the `for` boundary
            (Series(metric, labels, seq(repeat(1, max(minutes - 120, 1)), repeat(0, 200))),),
            0,
            dict(TEST_MODEL),
            1.0,
        )

    return build
