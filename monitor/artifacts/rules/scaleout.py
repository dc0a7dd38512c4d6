"""Scale-out alerts: replicas publishing their partial state, reducers merging it (docs/deployment.md).

A single daemon exports none of the series these read, so none of them can fire there. Replicas
export ``embmon_partials_*`` and the reducers ``embmon_reducer_*`` under the same ``job`` (the
shipped ServiceMonitor scrapes both), which is how ``EmbeddingMonitorReducerNotMerging`` tells
"replicas publish, and no reducer applies what they publish", with every reducer down or absent.
With a group of reducers each (model, stream) is exported by the one that owns it
(``embmon_reducer_stream_owned``): ``EmbeddingMonitorStreamNotMerged`` fires when replicas ingest a
stream no reducer exports (its reducer died and no other took its partition over), and
``EmbeddingMonitorStreamMergedTwice`` when two reducers export one stream (two single reducers, or
reducers in different groups: every gauge of it twice). The replica alerts read ``max by
(replica)`` over reducers: every reducer reads every replica's seals.
"""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import MODEL_STREAM, PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.scenarios import repeat, seq, target_labels
from monitor.artifacts.thresholds import Thresholds

GROUP = "embedding-monitor.scale-out"
# the reasons of embmon_reducer_partials_ignored_total that mean "refused": the publications are
# not merged and will not be (duplicate, superseded, missing, expired and clock_skew are harmless
# or repair themselves; docs/metrics.md)
REFUSED_REASONS = ("window_mismatch", "dim_mismatch", "replica_limit", "corrupt", "unsigned", "bad_signature",
                   "unknown_replica", "epoch_range", "oversize", "limit")
TEST_REPLICA = "embedding-monitor-replica-1"
REDUCER_INSTANCE = "reducer-0:9464"
OTHER_REDUCER_INSTANCE = "reducer-1:9464"


def alerts(th: Thresholds) -> list[Alert]:
    job = th.job
    stale, records = m("embmon_reducer_replica_stale"), m("embmon_reducer_replica_window_records")
    failures = m("embmon_partials_publish_failures_total")
    published, applied = m("embmon_partials_published_total"), m("embmon_reducer_partials_applied_total")
    ignored = m("embmon_reducer_partials_ignored_total")
    refused = "|".join(REFUSED_REASONS)
    records_in, owned = m("embmon_records_total"), m("embmon_reducer_stream_owned")
    partitions = m("embmon_reducer_partitions_owned")
    return [
        Alert(
            name=f"{PREFIX}ReplicaStale",
            group=GROUP,
            severity="warning",
            for_="15m",
            summary="A replica stopped publishing, and the reducer still merges its older state.",
            description=(
                "The reducer has applied no publication of replica {{ $labels.replica }} for longer than "
                "scale_out.stale_after_seconds (stale = $VALUE), and that replica's records are still in the "
                "merged windows."
            ),
            value_format="count",
            condition=Condition(f"max by (replica) ({stale})", ">", 0),
            # a replica that was scaled away stays listed: it matters only while its records are merged
            gate=Condition(f"max by (replica) ({records})", ">", 0),
            scenario_builder=_stale_scenario(job),
        ),
        Alert(
            name=f"{PREFIX}PartialsPublishFailing",
            group=GROUP,
            severity="warning",
            for_="15m",
            summary="A replica keeps failing to publish its partial state, so it commits no offsets.",
            description=(
                "Replica {{ $labels.instance }} failed $VALUE publications to the partials topic over the last "
                "10 minutes; until one succeeds it commits no offsets and the reducer does not see its records."
            ),
            value_format="count",
            condition=Condition(f"increase({failures}[10m])", ">", 0),
            scenario_builder=_publish_failing_scenario(job),
        ),
        Alert(
            name=f"{PREFIX}ReducerNotMerging",
            group=GROUP,
            severity="critical",
            for_="5m",
            summary="Replicas publish their partial state but no reducer merges it: no global gauges.",
            description=(
                "Replicas of job {{ $labels.job }} published $VALUE manifests to the partials topic over the last "
                "5 minutes and no reducer applied any: the window, drift and probe gauges are not computed."
            ),
            value_format="count",
            condition=Condition(
                f'(sum by (job) (increase({published}{{kind="manifest"}}[5m])) unless on (job) '
                f'sum by (job) (increase({applied}{{kind="manifest"}}[5m])) > 0)',
                ">", 0,
            ),
            scenario_builder=_not_merging_scenario(job),
            live_signals=(
                f'sum by (job) (increase({published}{{kind="manifest"}}[5m]))',
                f'sum by (job) (increase({applied}{{kind="manifest"}}[5m]))',
            ),
        ),
        Alert(
            name=f"{PREFIX}StreamNotMerged",
            group=GROUP,
            severity="critical",
            for_="10m",
            summary="Replicas ingest a stream that no reducer merges: its global gauges are missing.",
            description=(
                "Replicas of job {{ $labels.job }} ingest " + MODEL_STREAM + " ($VALUE records/s on the busiest "
                "replica) and no reducer exports it: its reducer is gone and no other took its partials partition over."
            ),
            value_format="number",
            condition=Condition(
                f"(max by (job, model, stream) (rate({records_in}[10m])) unless on (job, model, stream) "
                f"max by (job, model, stream) ({owned})) and on (job) max by (job) ({partitions})",
                ">", 0,
            ),
            scenario_builder=_not_merged_scenario(job),
            live_signals=(f"max by (job, model, stream) (rate({records_in}[10m]))",
                          f"max by (job, model, stream) ({owned})"),
        ),
        Alert(
            name=f"{PREFIX}StreamMergedTwice",
            group=GROUP,
            severity="warning",
            for_="15m",
            summary="Two reducers export the same stream: every global gauge of it is exported twice.",
            description=(
                "$VALUE reducers of job {{ $labels.job }} export " + MODEL_STREAM + ": they are not one "
                "consumer group (scale_out.reducer_group unset or different), so each merges it on its own."
            ),
            value_format="count",
            condition=Condition(f"count by (job, model, stream) ({owned})", ">", 1),
            scenario_builder=_merged_twice_scenario(job),
        ),
        Alert(
            name=f"{PREFIX}PartialsRefused",
            group=GROUP,
            severity="warning",
            for_="5m",
            summary="The reducer refuses a replica's publications: the global gauges miss its partitions.",
            description=(
                "The reducer refused $VALUE partial records over the last 15 minutes for reason "
                "{{ $labels.reason }}: they are not merged into the global windows."
            ),
            value_format="count",
            condition=Condition(f'sum by (reason) (increase({ignored}{{reason=~"{refused}"}}[15m]))', ">", 0),
            scenario_builder=_refused_scenario(job),
            live_signals=(f"sum by (reason) ({ignored})",),
        ),
    ]


def _reducer(job: str, **extra: str) -> dict[str, str]:
    return {**target_labels(job), "instance": REDUCER_INSTANCE, **extra}


def _stale_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        labels = _reducer(job, replica=TEST_REPLICA)
        stale, records = m("embmon_reducer_replica_stale"), m("embmon_reducer_replica_window_records")
        return Scenario(
            60,
            (Series(stale, labels, repeat(1, n)), Series(records, labels, repeat(5000, n))),
            # scaled away: still listed, and stale, but its records have left the window
            (Series(stale, labels, repeat(1, n)), Series(records, labels, repeat(0, n))),
            0,
            {"replica": TEST_REPLICA},
            1.0,
        )

    return build


def _publish_failing_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        onset = 60  # increase() needs two samples
        fire = onset + alert.for_seconds
        n = fire // 60 + 2
        labels = target_labels(job)
        failures = m("embmon_partials_publish_failures_total")
        return Scenario(
            60,
            # one failure a minute: the broker refuses every publication
            (Series(failures, labels, f"0+1x{n - 1}"),),
            # one failure, then publications succeed again: a blip
            (Series(failures, labels, seq("0", repeat(1, n - 1))),),
            onset,
            labels,
            10.0,  # ten failures in the 10 minutes before the boundary
        )

    return build


def _not_merging_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        onset = 60
        n = (onset + alert.for_seconds) // 60 + 2
        manifests = {"kind": "manifest"}
        published = Series(m("embmon_partials_published_total"), {**target_labels(job), **manifests}, f"0+2x{n - 1}")
        applied = m("embmon_reducer_partials_applied_total")
        return Scenario(
            60,
            # the reducer is up but applies nothing (its intake is stuck, or it reads another topic)
            (published, Series(applied, _reducer(job, **manifests), repeat(0, n))),
            (published, Series(applied, _reducer(job, **manifests), f"0+2x{n - 1}")),
            onset,
            {"job": job},
            10.0,  # two manifests a minute over 5 minutes
        )

    return build


def _refused_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        onset = 60
        n = (onset + alert.for_seconds) // 60 + 2
        ignored = m("embmon_reducer_partials_ignored_total")
        return Scenario(
            60,
            # a replica with another window: every publication refused (three records a minute)
            (Series(ignored, _reducer(job, reason="window_mismatch"), f"0+3x{n - 1}"),),
            # re-read duplicates after a reducer restart are harmless
            (Series(ignored, _reducer(job, reason="duplicate"), f"0+3x{n - 1}"),),
            onset,
            {"reason": "window_mismatch"},
            3.0 * (onset + alert.for_seconds) / 60,  # all of it, since the start, is inside the 15 minutes
        )

    return build


def _not_merged_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        onset = 60  # rate() needs two samples
        n = (onset + alert.for_seconds) // 60 + 2
        stream = {"model": "m", "stream": "s"}
        ingested = Series(m("embmon_records_total"), {**target_labels(job), **stream}, f"0+600x{n - 1}")
        partitions = Series(m("embmon_reducer_partitions_owned"), _reducer(job), repeat(1, n))
        owned = m("embmon_reducer_stream_owned")
        return Scenario(
            60,
            # the reducer left exports another stream only: nobody exports m/s
            (ingested, partitions, Series(owned, _reducer(job, model="m", stream="other"), repeat(1, n))),
            # the surviving reducer took m/s over
            (ingested, partitions, Series(owned, _reducer(job, **stream), repeat(1, n))),
            onset,
            {"job": job, **stream},
            10.0,  # 600 records a minute
        )

    return build


def _merged_twice_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        stream = {"model": "m", "stream": "s"}
        owned = m("embmon_reducer_stream_owned")
        first = Series(owned, _reducer(job, **stream), repeat(1, n))
        return Scenario(
            60,
            # two reducers outside one group both merge m/s
            (first, Series(owned, {**_reducer(job, **stream), "instance": OTHER_REDUCER_INSTANCE}, repeat(1, n))),
            # a group: the other reducer exports another stream
            (first, Series(owned, {**_reducer(job, model="m", stream="t"), "instance": OTHER_REDUCER_INSTANCE},
                           repeat(1, n))),
            0,
            {"job": job, **stream},
            2.0,
        )

    return build
