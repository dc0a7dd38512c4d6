"""Operations alerts: the monitor itself (scraped, present, fresh, reading its source) and its ingest.

``EmbeddingMonitorAbsent`` is the ``absent()`` alert for the case where Prometheus knows no
monitor target at all, which ``EmbeddingMonitorDown`` (``up < 1``) cannot see. Per-stream ages
take the newest time over instances, so each fires once per stream: scaled out, several replicas
export the same stream's last record; in a central deployment a stream's old and new owner both
export it for a window after a rebalance.
"""

from __future__ import annotations

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import MODEL_STREAM, PREFIX, Alert, Condition, Scenario, ScenarioBuilder, Series
from monitor.artifacts.rules.recording import INVALID_RECORDS_RATIO
from monitor.artifacts.rules.scenarios import (
    TEST_MODEL,
    age_scenario,
    ratio_counter_scenario,
    repeat,
    steady_scenario,
    target_labels,
)
from monitor.artifacts.rules.values import format_number
from monitor.artifacts.thresholds import Thresholds

SELF_GROUP = "embedding-monitor.self"
INGEST_GROUP = "embedding-monitor.ingest"


def alerts(th: Thresholds) -> list[Alert]:
    return [*_monitor(th), *_ingest(th), *_state(th)]


def _monitor(th: Thresholds) -> list[Alert]:
    job = th.job
    refreshed = m("embmon_metrics_last_update_timestamp_seconds")
    last_record = m("embmon_last_record_timestamp_seconds")
    source_up = m("embmon_source_up")
    return [
        Alert(
            name=f"{PREFIX}Down",
            group=SELF_GROUP,
            severity="warning",
            for_="10m",
            summary="Prometheus cannot scrape an embedding-monitor instance.",
            description="Scrapes of {{ $labels.instance }} (job {{ $labels.job }}) fail: up is $VALUE.",
            value_format="count",
            condition=Condition(f'up{{job="{job}"}}', "<", 1),
            scenario_builder=steady_scenario("up", target_labels(job), 0, 1, target_labels(job)),
        ),
        Alert(
            name=f"{PREFIX}Absent",
            group=SELF_GROUP,
            severity="critical",
            for_="15m",
            summary="No embedding-monitor target is known to Prometheus: embedding quality is unwatched.",
            description="Prometheus has no scrape target for job {{ $labels.job }} (absent = $VALUE).",
            value_format="count",
            condition=Condition(f'absent(up{{job="{job}"}})', ">", 0),
            scenario_builder=_absent_scenario(job),
            live_signals=(f'up{{job="{job}"}}',),
        ),
        Alert(
            name=f"{PREFIX}MetricsStale",
            group=SELF_GROUP,
            severity="warning",
            for_="10m",
            summary="The monitor is scraped but its quality metrics are no longer refreshed.",
            description=f"Intrinsic metrics of {MODEL_STREAM} were last refreshed $VALUE ago.",
            value_format="duration",
            # the newest refresh any instance published (the panel "Metrics age" shows the same)
            condition=Condition(f"time() - max by (model, stream) ({refreshed})", ">", 900),
            scenario_builder=_newest_over_instances_scenario(refreshed, job),
        ),
        Alert(
            name=f"{PREFIX}NoRecentRecords",
            group=SELF_GROUP,
            severity="warning",
            for_="15m",
            summary="No embeddings have arrived for a model and stream for too long.",
            description=f"The last record of {MODEL_STREAM} arrived $VALUE ago.",
            value_format="duration",
            # the newest record any instance saw: replicas that no longer own a stream's partitions
            # keep exporting the time of its last record they applied
            condition=Condition(f"time() - max by (model, stream) ({last_record})", ">", 3600),
            scenario_builder=_newest_over_instances_scenario(last_record, job),
        ),
        Alert(
            name=f"{PREFIX}SourceDown",
            group=SELF_GROUP,
            severity="warning",
            for_="10m",
            summary="The monitor cannot read from its source (Kafka, file).",
            description="The source of {{ $labels.instance }} is down (source_up = $VALUE).",
            value_format="count",
            condition=Condition(source_up, "<", 1),
            scenario_builder=steady_scenario(source_up, target_labels(job), 0, 1, target_labels(job)),
        ),
    ]


def _ingest(th: Thresholds) -> list[Alert]:
    job = th.job
    lag = m("embmon_consumer_lag_records")
    progress = m("embmon_source_last_progress_timestamp_seconds")
    return [
        Alert(
            name=f"{PREFIX}InvalidRecordsHigh",
            group=INGEST_GROUP,
            severity="warning",
            for_="15m",
            summary="A large share of the records on a stream is rejected as invalid.",
            description="$VALUE of the records on stream {{ $labels.stream }} were rejected over the last 10 minutes.",
            value_format="percent",
            condition=Condition(INVALID_RECORDS_RATIO, ">", 0.05),
            scenario_builder=ratio_counter_scenario(
                m("embmon_records_invalid_total"),
                [{"stream": "queries", "reason": "bad_dimension"}],
                m("embmon_records_total"),
                TEST_MODEL,
                {"stream": "queries"},
                job,
            ),
            live_signals=(f"sum by (stream) (rate({m('embmon_records_total')}[10m]))",),
        ),
        Alert(
            name=f"{PREFIX}ConsumerLagGrowing",
            group=INGEST_GROUP,
            severity="warning",
            for_="15m",
            summary="The monitor falls further and further behind its Kafka topic.",
            description="Consumer lag of {{ $labels.instance }} on topic {{ $labels.topic }} is $VALUE records "
            "and growing.",
            value_format="count",
            condition=Condition(lag, ">", 10000),
            gate=Condition(f"deriv({lag}[15m])", ">", 0),
            scenario_builder=_lag_scenario(job),
        ),
        Alert(
            name=f"{PREFIX}SourceStalled",
            group=INGEST_GROUP,
            severity="warning",
            for_="5m",
            summary="The monitor has records to read on a topic but applies none.",
            description="{{ $labels.instance }} was last caught up on topic {{ $labels.topic }}, or last applied "
                        "a record from it, $VALUE ago.",
            value_format="duration",
            # the time stays behind only while records wait and none are applied (caught up: it follows the clock)
            condition=Condition(f"time() - {progress}", ">", 600),
            scenario_builder=age_scenario(progress, {"topic": "embeddings"}, job),
        ),
    ]


def _newest_over_instances_scenario(metric: str, job: str) -> ScenarioBuilder:
    """Two instances export the stream's timestamp; the quiet history has one of them still
    advancing it (the stream's partitions moved to it, or it is the one that computes it)."""

    def build(alert: Alert) -> Scenario:
        sc = age_scenario(metric, TEST_MODEL, job)(alert)
        (frozen,) = sc.firing
        (fresh,) = sc.quiet
        other = {**frozen.labels, "instance": "monitor-1:9464"}
        return Scenario(
            sc.step,
            (frozen, Series(metric, other, frozen.values)),
            (frozen, Series(metric, other, fresh.values)),
            sc.onset,
            dict(TEST_MODEL),
            sc.value,
        )

    return build


def _absent_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        return Scenario(
            60,
            (Series("up", {"job": "some-other-job", "instance": "x:1"}, repeat(1, n)),),
            # a monitor that is scraped but down is EmbeddingMonitorDown's business, not this one's
            (Series("up", target_labels(job), repeat(0, n)),),
            0,
            {"job": job},
            1.0,
        )

    return build


def _lag_scenario(job: str) -> ScenarioBuilder:
    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        step_value = thr / 8  # exact in binary: crosses the threshold after the 8th minute
        onset = 9 * 60
        fire = onset + alert.for_seconds
        n = fire // 60 + 2
        labels = {**target_labels(job), "topic": "embeddings"}
        metric = m("embmon_consumer_lag_records")
        return Scenario(
            60,
            (Series(metric, labels, f"0+{format_number(step_value)}x{n - 1}"),),
            # far above the threshold but shrinking: the consumer is catching up
            (Series(metric, labels, f"{format_number(thr * 4)}-{format_number(step_value)}x{min(n - 1, 31)}"),),
            onset,
            labels,
            step_value * (fire // 60),
        )

    return build


def _state(th: Thresholds) -> list[Alert]:
    """The state directory: checkpoints that stop being written, and files found unusable at start-up.

    Commits follow checkpoints, so a daemon that cannot checkpoint also stops committing: a restart
    would re-read everything since its last checkpoint, and a lost volume would lose it all. A file
    set aside at start-up (a checkpoint, a stored reference, the canary pins) means the daemon runs
    on older or rebuilt state; it starts anyway, so without an alert nobody would look.
    """
    job = th.job
    restore = m("embmon_checkpoint_restore_failures_total")
    rejected = m("embmon_state_files_rejected_total")
    return [
        # 40 default periods; per instance, with or without streams (MetricsStale is per stream)
        _too_old(
            "RefreshStale", m("embmon_refresh_age_seconds"), 600, job,
            summary="The monitor has not refreshed its window metrics for too long: every quality gauge is old.",
            description="The last refresh of {{ $labels.instance }} ended $VALUE ago "
                        "(embmon_job_runs_total{job=\"refresh\"} says whether it fails, times out or no longer runs).",
        ),
        # 30 default intervals; exported only where checkpoints are on (the Kafka source)
        _too_old(
            "CheckpointStale", m("embmon_checkpoint_age_seconds"), 900, job,
            summary="The monitor has not written a checkpoint for too long (and so commits no offsets).",
            description="The last checkpoint of {{ $labels.instance }} was written $VALUE ago "
                        "(embmon_checkpoint_write_failures_total says at which stage writes fail).",
        ),
        _set_aside(
            "CheckpointRejected", restore, ("reason", "corrupt"), job,
            summary="At start-up the monitor refused a checkpoint file: it runs on an older state, or an empty one.",
            description="{{ $labels.instance }} moved $VALUE checkpoint file(s) aside at start-up "
                        "(reason {{ $labels.reason }}).",
        ),
        _set_aside(
            "StateFileRejected", rejected, ("file", "reference"), job,
            summary="At start-up the monitor set aside an unreadable stored reference or canary pins file.",
            description="{{ $labels.instance }} moved $VALUE {{ $labels.file }} file(s) aside at start-up; "
                        "drift or the canaries started again from their configured sources.",
        ),
    ]


def _too_old(name: str, age: str, threshold: float, job: str, *, summary: str, description: str) -> Alert:
    """An instance's age gauge (seconds since its job last succeeded) above ``threshold`` for 5 minutes."""
    return Alert(
        name=f"{PREFIX}{name}",
        group=SELF_GROUP,
        severity="warning",
        for_="5m",
        summary=summary,
        description=description,
        value_format="duration",
        condition=Condition(age, ">", threshold),
        scenario_builder=steady_scenario(age, target_labels(job), 2 * threshold, 20, target_labels(job)),
    )


def _set_aside(name: str, counter: str, label: tuple[str, str], job: str, *, summary: str, description: str) -> Alert:
    """A counter of files set aside at start-up, above 0 (until the next restart), by its one label."""
    key, example = label
    labels = {**target_labels(job), key: example}
    return Alert(
        name=f"{PREFIX}{name}",
        group=SELF_GROUP,
        severity="warning",
        for_="1m",
        summary=summary,
        description=description,
        value_format="count",
        condition=Condition(f"sum by (job, instance, {key}) ({counter})", ">", 0),
        scenario_builder=steady_scenario(counter, labels, 1, 0, labels),
        live_signals=(counter,),
    )
