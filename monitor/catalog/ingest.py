"""Records in: what the source delivered, decoded, rejected, and how far behind it is.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MS, MetricSpec

AREA = "ingest"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_build_info", "info",
        "embedding-monitor build information.",
        labels=("version",), code="monitor.daemon.export:CoreCollector.collect"),
    MetricSpec("embmon_records_total", "counter",
        "Valid embedding records ingested.",
        labels=MS, code="monitor.state.registry:StateRegistry.apply"),
    MetricSpec("embmon_last_record_timestamp_seconds", "gauge",
        "When the last valid record of the stream was ingested.",
        labels=MS, unit="seconds", code="monitor.state.registry:StateRegistry.apply"),
    MetricSpec("embmon_records_invalid_total", "counter",
        "Records rejected by decoding or the label budget, by reason.",
        labels=("stream", "reason"), code="monitor.daemon.ingest:IngestPipeline.apply"),
    MetricSpec("embmon_interactions_total", "counter",
        "Valid interaction events ingested.",
        labels=("model",), code="monitor.daemon.ingest:IngestPipeline.apply"),
    MetricSpec("embmon_internal_errors_total", "counter",
        "Unexpected exceptions caught inside the daemon, by stage (a bug: report it).",
        labels=("stage",), code="monitor.daemon.counters:InternalErrors.count"),
    MetricSpec("embmon_job_runs_total", "counter",
        "Runs of scheduled jobs (refresh, drift, probes) by outcome.",
        labels=("job", "outcome"), code="monitor.daemon.jobs:JobRunner.run"),
    MetricSpec("embmon_job_duration_seconds", "histogram",
        "Wall time of one run of a scheduled job.",
        labels=("job",), unit="seconds", code="monitor.daemon.jobs:JobRunner.run"),
    MetricSpec("embmon_refresh_duration_seconds", "histogram",
        "Wall time of one window-metric refresh over all streams.",
        unit="seconds", code="monitor.daemon.refresh:Refresher.refresh"),
    MetricSpec("embmon_metrics_last_update_timestamp_seconds", "gauge",
        "When the window metrics of the stream were last recomputed.",
        labels=MS, unit="seconds", code="monitor.daemon.refresh:Refresher.refresh"),
    MetricSpec("embmon_source_up", "gauge",
        "1 when the record source is connected and readable.",
        code="monitor.sources.base:Source.up"),
    MetricSpec("embmon_source_errors_total", "counter",
        "Failed reads from the record source, by reason (unsupported_codec: a compression library is missing).",
        labels=("reason",), code="monitor.sources.kafka.source:KafkaSource.poll"),
    MetricSpec("embmon_consumer_lag_records", "gauge",
        "Records behind the end of the topic, summed over assigned partitions.",
        labels=("topic",), unit="records", code="monitor.sources.kafka.policy:records_behind"),
    MetricSpec("embmon_source_last_progress_timestamp_seconds", "gauge",
        "When the consumer was last caught up on the topic (lag 0) or applied records from it; it falls behind while "
        "records wait and none are applied (a stalled poll or partition).",
        labels=("topic",), unit="seconds", code="monitor.sources.kafka.reconnect:ConsumerReadings._note_progress"),
    MetricSpec("embmon_source_offset_resets_total", "counter",
        "Partition positions found outside their log and reset by kafka.auto_offset_reset, by reason (past_end, "
        "before_start, topic_recreated, truncated). 0 when healthy.",
        labels=("reason",), code="monitor.sources.kafka.positions:PositionGuard.carry_out"),
)
