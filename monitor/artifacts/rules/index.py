"""Index alerts: the vector store serves worse than its exact search, a scope under-returns, stale
vectors, an index probe that stopped measuring (docs/index.md).

Each fires on a bound, never on a point estimate alone: recall when even the upper bound of its
bootstrap interval is below the target, a stale index when the lower bound of the Wilson interval
is above the tolerated share (so an index with no stale vector, whose lower bound is exactly 0,
can never fire), an under-returning scope only with enough queries behind it. Each reads the
worst value over the instances that export the probe (``max by``), so it fires once per series.
"""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.scenarios import age_scenario, repeat, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.index"
TEST_INDEX = {"probe": "docs-pg", "model": "minilm"}
RECALL_TARGET = 0.9
UNDER_RETURN_SHARE = 0.1
MIN_SCOPE_QUERIES = 5
STALE_SHARE = 0.01
STALE_AFTER_SECONDS = 3 * 3600


def alerts(th: Thresholds) -> list[Alert]:
    job = th.job
    upper = m("embmon_index_recall_upper_ratio")
    under = m("embmon_index_under_return_ratio")
    queries = m("embmon_index_queries")
    stale_lower = m("embmon_index_stale_lower_ratio")
    last = m("embmon_index_probe_last_success_timestamp_seconds")
    where = "index probe {{ $labels.probe }} (model {{ $labels.model }})"
    return [
        Alert(
            name=f"{PREFIX}IndexRecallLow",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="The vector store's search misses too many of the exact nearest neighbours.",
            description=(
                f"Recall@k of the production search against the engine's exact search, {where}, is below "
                f"{RECALL_TARGET}: even the upper bound of its interval is $VALUE."
            ),
            value_format="number",
            condition=Condition(f'max by (probe, model, k) ({upper}{{scope="all"}})', "<", RECALL_TARGET),
            scenario_builder=_bound_scenario(upper, {**TEST_INDEX, "scope": "all", "k": "10"},
                                             {**TEST_INDEX, "k": "10"}, job, below=True),
        ),
        Alert(
            name=f"{PREFIX}IndexUnderReturn",
            group=GROUP,
            severity="warning",
            for_="10m",
            summary="Filtered searches of one scope return fewer rows than exist.",
            description=(
                "$VALUE of the queries of scope {{ $labels.scope }}, " + where + ", were served fewer rows "
                "than the exact search finds under the same filter."
            ),
            value_format="percent",
            condition=Condition(f'max by (probe, model, scope) ({under}{{scope!~"all|other"}})', ">",
                                UNDER_RETURN_SHARE),
            gate=Condition(f"max by (probe, model, scope) ({queries})", ">", MIN_SCOPE_QUERIES - 1),
            scenario_builder=_under_return_scenario(under, queries, job),
        ),
        Alert(
            name=f"{PREFIX}IndexStale",
            group=GROUP,
            severity="warning",
            for_="30m",
            summary="Part of the index holds vectors of another model or recipe.",
            description=(
                f"At least $VALUE of the sampled stored vectors of {where} differ from the latest vector of "
                "their id (the lower bound of the stale share's interval)."
            ),
            value_format="percent",
            condition=Condition(f"max by (probe, model) ({stale_lower})", ">", STALE_SHARE),
            scenario_builder=_bound_scenario(stale_lower, TEST_INDEX, TEST_INDEX, job, below=False),
        ),
        Alert(
            name=f"{PREFIX}IndexProbeStale",
            group=GROUP,
            severity="warning",
            for_="10m",
            summary="An index probe has not completed a cycle for too long.",
            description="Index probe {{ $labels.probe }} on {{ $labels.instance }} last completed a cycle $VALUE ago.",
            value_format="duration",
            condition=Condition(f"time() - {last}", ">", STALE_AFTER_SECONDS),
            scenario_builder=age_scenario(last, {"probe": TEST_INDEX["probe"]}, job),
        ),
    ]


def _bound_scenario(metric: str, series: dict[str, str], alert_labels: dict[str, str], job: str,
                    below: bool) -> ScenarioBuilder:
    """The bound past the threshold throughout (fires ``for`` after the start); quiet: just inside it."""

    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        n = alert.for_seconds // 60 + 2
        bad = round(thr * 0.8 if below else thr * 3, 6)
        good = round(thr + (1 - thr) / 2 if below else 0.0, 6)
        labels = {**target_labels(job), **series}
        return Scenario(60, (Series(metric, labels, repeat(bad, n)),), (Series(metric, labels, repeat(good, n)),),
                        0, alert_labels, bad)

    return build


def _under_return_scenario(under: str, queries: str, job: str) -> ScenarioBuilder:
    """A scope that under-returns on most of its queries; quiet: the same share on too few queries."""

    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        scope = {**TEST_INDEX, "scope": "tenant-7"}
        labels = {**target_labels(job), **scope}
        enough = alert.gate.threshold + 3 if alert.gate else MIN_SCOPE_QUERIES
        few = alert.gate.threshold if alert.gate else 1
        share = Series(under, {**labels, "k": "10"}, repeat(0.9, n))
        return Scenario(
            60,
            (share, Series(queries, labels, repeat(enough, n))),
            (share, Series(queries, labels, repeat(few, n))),
            0,
            scope,
            0.9,
        )

    return build
