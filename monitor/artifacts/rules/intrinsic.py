"""Intrinsic-health alerts: isotropy, effective dimension, mean cosine, collapse.

They compare each model with its own past (the median of its own series over
``baseline_window``): absolute values from the literature misfire on real models
(all-MiniLM-L6-v2 on real text sits at an effective-dimension ratio near 0.29 and a mean cosine
near 0.15). The absolute "warning signs" are kept as opt-in alerts, disabled by default.
"""

from __future__ import annotations

from typing import Literal

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import MODEL_STREAM, PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.recording import recorded
from monitor.artifacts.rules.scenarios import TEST_MODEL, repeat, seq, steady_scenario, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.intrinsic"


def alerts(th: Thresholds) -> list[Alert]:
    job = th.job
    w = th.baseline_window
    iso = m("embmon_partition_isotropy")
    edr = m("embmon_effective_dimension_ratio")
    cos = m("embmon_mean_cosine_similarity")
    rank = m("embmon_effective_rank")
    collapse = m("embmon_collapse_detected")
    relative = [
        Alert(
            name=f"{PREFIX}IsotropyDegraded",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="Embedding isotropy fell well below the model's own baseline.",
            description=f"Partition isotropy of {MODEL_STREAM} is at $VALUE of its {w} median baseline.",
            value_format="percent",
            condition=Condition(recorded(iso, f"ratio_median{w}"), "<", 0.5),
            scenario_builder=_baseline_scenario(iso, "drop", 0.25, job),
        ),
        Alert(
            name=f"{PREFIX}EffectiveDimensionDropped",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="The embeddings use far fewer effective dimensions than they usually do.",
            description=f"Effective-dimension ratio of {MODEL_STREAM} is at $VALUE of its {w} median baseline.",
            value_format="percent",
            condition=Condition(recorded(edr, f"ratio_median{w}"), "<", 0.7),
            scenario_builder=_baseline_scenario(edr, "drop", 0.25, job),
        ),
        Alert(
            name=f"{PREFIX}MeanCosineRising",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="Embeddings are becoming more similar to each other than they usually are.",
            description=f"Mean pairwise cosine similarity of {MODEL_STREAM} is $VALUE above its {w} median baseline.",
            value_format="number",
            condition=Condition(recorded(cos, f"delta_median{w}"), ">", 0.2),
            scenario_builder=_baseline_scenario(cos, "rise", 0.125, job),
        ),
        Alert(
            name=f"{PREFIX}Collapse",
            group=GROUP,
            severity="critical",
            for_="10m",
            summary="The embedding space has collapsed: few dimensions carry the variance.",
            description=(
                f"The daemon flags dimensional collapse for {MODEL_STREAM}, and its effective rank is "
                f"at $VALUE of its {w} median baseline."
            ),
            value_format="percent",
            condition=Condition(recorded(rank, f"ratio_median{w}"), "<", 0.5),
            gate=Condition(f"max by (model, stream) ({collapse})", ">", 0),
            scenario_builder=_baseline_scenario(rank, "drop", 96.0, job, gate_metric=collapse),
        ),
    ]
    # the literature's absolute warning signs: opt in per alert
    absolute = [
        Alert(
            name=f"{PREFIX}{name}",
            group=GROUP,
            severity="warning",
            for_="1h",
            summary="An intrinsic embedding metric crossed its opt-in absolute threshold.",
            description=text.format(ms=MODEL_STREAM),
            value_format="number",
            condition=Condition(recorded(metric, "avg"), op, thr),  # type: ignore[arg-type]
            scenario_builder=steady_scenario(metric, {**target_labels(job), **TEST_MODEL}, bad, good, dict(TEST_MODEL)),
            enabled=False,
        )
        for name, metric, op, thr, bad, good, text in (
            ("MeanCosineAboveAbsolute", cos, ">", 0.3, 0.5, 0.15,
             "Mean pairwise cosine similarity of {ms} is $VALUE, above the absolute limit."),
            ("EffectiveDimensionBelowAbsolute", edr, "<", 0.2, 0.125, 0.5,
             "Effective-dimension ratio of {ms} is $VALUE, below the absolute floor."),
            ("TopVarianceAboveAbsolute", m("embmon_top10_variance_ratio"), ">", 0.5, 0.75, 0.25,
             "The top 10 principal directions of {ms} explain $VALUE of the variance."),
        )
    ]
    return relative + absolute


def _baseline_scenario(metric: str, kind: Literal["drop", "rise"], healthy: float, job: str,
                       gate_metric: str | None = None) -> ScenarioBuilder:
    """Hours at ``healthy`` (the median stays there), then a drop or rise past the threshold."""

    def build(alert: Alert) -> Scenario:
        step = 60
        before = max(7200, 2 * alert.for_seconds + 3600) // step  # healthy samples: median stays
        after = alert.for_seconds // step + 2
        thr = alert.condition.threshold
        if kind == "drop":
            bad, mild = healthy * thr / 2, healthy * (1 + thr) / 2
            value = bad / healthy
        else:
            bad, mild = healthy + 2 * thr, healthy + thr / 2
            value = bad - healthy
        labels = {**target_labels(job), **TEST_MODEL}
        firing = [Series(metric, labels, seq(repeat(healthy, before), repeat(bad, after)))]
        quiet = [Series(metric, labels, seq(repeat(healthy, before), repeat(mild, after)))]
        if gate_metric:
            firing.append(Series(gate_metric, labels, seq(repeat(0, before), repeat(1, after))))
            # the quiet history drops just as far but the daemon's detector never agrees
            quiet = [
                Series(metric, labels, firing[0].values),
                Series(gate_metric, labels, repeat(0, before + after)),
            ]
        return Scenario(step, tuple(firing), tuple(quiet), before * step, dict(TEST_MODEL), value)

    return build
