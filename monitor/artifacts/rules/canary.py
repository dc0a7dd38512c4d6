"""Canary alerts: the model behind the embeddings changed (docs/canaries.md).

The daemon decides what a mismatch is (cosine to the pin below ``1 - canaries.tolerance``) and
counts it; the alert pages on any counted mismatch of the last 10 minutes and shows the lowest
canary cosine of the window. Its threshold is that cosine: the default, 1, pages on every
mismatch the daemon counts; a lower one pages only on larger changes. A re-pin drops the
window's cosines, so the alert resolves at once after an intended upgrade is re-pinned.
"""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.scenarios import repeat, seq, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.canary"
MISMATCH_RANGE = "10m"
TEST_CANARY_MODEL = {"model": "minilm"}


def alerts(th: Thresholds) -> list[Alert]:
    cosine, mismatches = m("embmon_canary_cosine_min"), m("embmon_canary_mismatches_total")
    return [
        Alert(
            name=f"{PREFIX}ModelChanged",
            group=GROUP,
            severity="critical",
            for_="1m",
            summary="The embedding model changed: canary items no longer embed to their pinned vectors.",
            description=(
                "Canary records of model {{ $labels.model }} no longer match their pinned vectors: the lowest "
                "canary cosine over the window is $VALUE (1 = unchanged), "
                f"with mismatches in the last {MISMATCH_RANGE}."
            ),
            value_format="number",
            condition=Condition(f"min by (model) ({cosine})", "<", 1),
            gate=Condition(f"sum by (model) (increase({mismatches}[{MISMATCH_RANGE}]))", ">", 0),
            scenario_builder=_model_changed_scenario(th.job),
            # on a healthy daemon: canaries compared (the cosine) and counted (the counter)
            live_signals=(f"min by (model) ({cosine})", f"sum by (model) ({mismatches})"),
        ),
    ]


def _model_changed_scenario(job: str) -> ScenarioBuilder:
    """Canaries match (cosine 1) for 5 minutes, then a swapped model: mismatches and a low cosine
    until an operator re-pins at minute 12 (the daemon drops the window's cosines)."""

    def build(alert: Alert) -> Scenario:
        labels = {**target_labels(job), **TEST_CANARY_MODEL}
        thr = alert.condition.threshold
        low = round(thr / 4, 6)  # far below any threshold: a rotated space
        before, during = 5, 7
        repinned = (before + during) * 60
        cosine = m("embmon_canary_cosine_min")
        mismatches = m("embmon_canary_mismatches_total")
        cosines = seq(repeat(1, before), repeat(low, during), "stale", repeat(1, 10))
        # scaled out, the reducer exports the canaries; while a reducer hands its models over (or
        # two reducers are told to own one) two instances export the same model, each with its own counter
        scaled = tuple(
            series
            for instance, offset in (("reducer-0:9464", 0), ("reducer-1:9464", 3))
            for series in (
                Series(cosine, {**labels, "instance": instance}, cosines),
                Series(mismatches, {**labels, "instance": instance},
                       seq(repeat(offset, before), f"{offset + 1}+1x{during - 1}", repeat(offset + during, 11))),
            )
        )
        return Scenario(
            60,
            (
                Series(cosine, labels, cosines),
                Series(mismatches, labels, seq(repeat(0, before), f"1+1x{during - 1}", repeat(during, 11))),
            ),
            # float noise across hardware: a cosine a hair below 1 that the daemon does not count
            (
                Series(cosine, labels, repeat(round(thr - 1e-7, 9), before + during + 11)),
                Series(mismatches, labels, repeat(0, before + during + 11)),
            ),
            before * 60,
            dict(TEST_CANARY_MODEL),
            low,
            resolves_at=repinned,
            scaled=scaled,
        )

    return build
