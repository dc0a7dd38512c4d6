"""Retrieval alerts: quality below its objective or down week over week, ANN recall, failing probes.

Quality alerts fire on the probe's confidence interval, not its point estimate: below the
objective means even the interval's upper bound is below it, and a week-over-week drop counts only
when the upper bound is below last week's average. Each reads the highest upper bound over the
instances that export the probe (``max by (probe, model, slice, k)``), so it fires once per probe
series, and only when every instance running the probe agrees.
"""

from __future__ import annotations

from monitor.artifacts.catalog import RETRIEVAL_TITLES, m
from monitor.artifacts.rules.model import PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.recording import PROBE_FAILED_RATIO, recorded
from monitor.artifacts.rules.scenarios import (
    TEST_PROBE,
    age_scenario,
    ratio_counter_scenario,
    repeat,
    seq,
    target_labels,
)
from monitor.artifacts.rules.values import format_number
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.retrieval"
PROBES_GROUP = "embedding-monitor.probes"
WHERE = "model {{ $labels.model }} (probe {{ $labels.probe }}, slice {{ $labels.slice }}, k={{ $labels.k }})"
# one series per probe result, over the instances that run the probe
PROBE_SERIES = "max by (probe, model, slice, k)"


def alerts(th: Thresholds) -> list[Alert]:
    return [*_quality(th), *_probes(th)]


def _quality(th: Thresholds) -> list[Alert]:
    job = th.job
    out: list[Alert] = []
    for metric, objective in th.retrieval_objectives.items():
        base = m(f"embmon_retrieval_{metric}")
        upper = m(f"{base}_ci_upper")
        title = RETRIEVAL_TITLES[metric]
        avg1h = recorded(base, "avg1h", "probe_model_slice_k")
        out += [
            Alert(
                name=f"{PREFIX}Retrieval{_camel(metric)}BelowObjective",
                group=GROUP,
                severity="critical",
                for_="30m",
                summary=f"{title} is below its objective, beyond the probe's confidence interval.",
                description=(
                    f"{title}@k of {WHERE} is below its objective {format_number(objective.min)}: "
                    "even the upper bound of its confidence interval is $VALUE."
                ),
                value_format="number",
                condition=Condition(f'{PROBE_SERIES} ({upper}{{k="{objective.k}"}})', "<", objective.min),
                anchor=f"{PREFIX}RetrievalBelowObjective".lower(),
                scenario_builder=_ci_scenario(base, objective.k, job),
            ),
            Alert(
                name=f"{PREFIX}Retrieval{_camel(metric)}DroppedWeekOverWeek",
                group=GROUP,
                severity="warning",
                for_="1h",
                summary=f"{title} dropped against the same probe a week earlier.",
                description=f"{title} of {WHERE} is $VALUE lower than a week ago, beyond its confidence interval.",
                value_format="percent",
                condition=Condition(f"1 - {avg1h} / {avg1h} offset 1w", ">", 0.1),
                gate=Condition(
                    f"{PROBE_SERIES} ({upper}) - {avg1h} offset 1w", "<", 0
                ),
                anchor=f"{PREFIX}RetrievalDroppedWeekOverWeek".lower(),
                scenario_builder=_week_over_week_scenario(base, job),
            ),
        ]
    ann = m("embmon_retrieval_ann_recall")
    out.append(
        Alert(
            name=f"{PREFIX}AnnRecallBelowTarget",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="The ANN index returns too few of the exact nearest neighbours.",
            description=(
                f"ANN recall of {WHERE} is below target: even the upper bound of its confidence "
                "interval is $VALUE."
            ),
            value_format="number",
            condition=Condition(f'{PROBE_SERIES} ({m(f"{ann}_ci_upper")})', "<", 0.9),
            scenario_builder=_ci_scenario(ann, None, job),
        )
    )
    return out


def _probes(th: Thresholds) -> list[Alert]:
    job = th.job
    runs = m("embmon_probe_runs_total")
    last_success = m("embmon_probe_last_success_timestamp_seconds")
    return [
        Alert(
            name=f"{PREFIX}ProbeFailing",
            group=PROBES_GROUP,
            severity="warning",
            for_="15m",
            summary="A retrieval probe keeps failing or timing out.",
            description="$VALUE of the runs of probe {{ $labels.probe }} failed or timed out over the last 30 minutes.",
            value_format="percent",
            condition=Condition(PROBE_FAILED_RATIO, ">", 0.5),
            scenario_builder=ratio_counter_scenario(
                runs,
                [{"probe": "golden", "outcome": "failure"}, {"probe": "golden", "outcome": "timeout"}],
                runs,
                {"probe": "golden", "outcome": "success"},
                {"probe": "golden"},
                job,
            ),
            live_signals=(f"sum by (probe) (rate({runs}[30m]))",),
        ),
        Alert(
            name=f"{PREFIX}ProbeStale",
            group=PROBES_GROUP,
            severity="warning",
            for_="10m",
            summary="A retrieval probe has not succeeded for too long.",
            description="Probe {{ $labels.probe }} on {{ $labels.instance }} last succeeded $VALUE ago.",
            value_format="duration",
            condition=Condition(f"time() - {last_success}", ">", 7200),
            scenario_builder=age_scenario(last_success, {"probe": "golden"}, job),
        ),
    ]


def _camel(metric: str) -> str:
    return "".join(part.capitalize() for part in metric.split("_"))


def _ci_scenario(metric: str, k: str | None, job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        n = alert.for_seconds // 60 + 2
        probe = {**TEST_PROBE, **({"k": k} if k else {})}
        labels = {**target_labels(job), **probe}
        upper_bad = round(thr * 0.8, 6)
        point_bad = round(thr * 0.7, 6)
        upper_noisy = round(thr + (1 - thr) / 2, 6)
        return Scenario(
            60,
            (
                Series(metric, labels, repeat(point_bad, n)),
                Series(f"{metric}_ci_upper", labels, repeat(upper_bad, n)),
            ),
            # the point estimate is below the objective, but the interval still reaches above it
            (
                Series(metric, labels, repeat(point_bad, n)),
                Series(f"{metric}_ci_upper", labels, repeat(upper_noisy, n)),
            ),
            0,
            probe,
            upper_bad,
        )

    return build


def _week_over_week_scenario(metric: str, job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        step = 600 if alert.for_seconds % 600 == 0 else 60
        drop = alert.condition.threshold
        healthy = 0.6
        bad = healthy * (1 - 2 * drop)
        start = (7 * 86400 + 7200) // step  # healthy samples: a week of history and then some
        per_hour = 3600 // step + 1  # samples in a closed 1h range
        onset = start * step + (per_hour // 2) * step  # most of the hour's samples are bad
        after = (onset + alert.for_seconds) // step - start + 2
        labels = {**target_labels(job), **TEST_PROBE}
        point = Series(metric, labels, seq(repeat(healthy, start), repeat(bad, after)))
        upper = seq(repeat(healthy + 0.05, start), repeat(bad + healthy * drop, after))
        noisy = seq(repeat(healthy + 0.05, start), repeat(healthy + 0.05, after))
        return Scenario(
            step,
            (point, Series(f"{metric}_ci_upper", labels, upper)),
            # the same drop of the point estimate, but the interval still covers last week's value
            (point, Series(f"{metric}_ci_upper", labels, noisy)),
            onset,
            dict(TEST_PROBE),
            1 - bad / healthy,
        )

    return build
