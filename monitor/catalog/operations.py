"""The daemon itself: jobs, refresh, checkpoints, backpressure, the HTTP port, the state directory.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MetricSpec

AREA = "operations"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_refresh_last_success_timestamp_seconds", "gauge",
        "When the last refresh of the window metrics ended.",
        unit="seconds", code="monitor.daemon.refresh:Refresher.refresh"),
    MetricSpec("embmon_refresh_age_seconds", "gauge",
        "Seconds since the last refresh of the window metrics ended (since start-up if none).",
        unit="seconds", code="monitor.daemon.export:_refresh_families"),
    MetricSpec("embmon_checkpoint_last_success_timestamp_seconds", "gauge",
        "When the last checkpoint was written.",
        unit="seconds", code="monitor.daemon.checkpointing:Checkpointer.checkpoint"),
    MetricSpec("embmon_checkpoint_age_seconds", "gauge",
        "Seconds since the last checkpoint was written (since start-up if none).",
        unit="seconds", code="monitor.daemon.export:_checkpoint_families"),
    MetricSpec("embmon_checkpoint_size_bytes", "gauge",
        "Size of the last checkpoint file.",
        unit="bytes", code="monitor.daemon.checkpointing:Checkpointer.checkpoint"),
    MetricSpec("embmon_checkpoint_duration_seconds", "histogram",
        "Wall time of one checkpoint: capture between batches, encode, write, fsync, rename.",
        unit="seconds", code="monitor.daemon.checkpointing:Checkpointer.checkpoint"),
    MetricSpec("embmon_checkpoint_write_failures_total", "counter",
        "Checkpoints that could not be taken or written, by stage.",
        labels=("stage",), code="monitor.daemon.checkpointing:Checkpointer._failed"),
    MetricSpec("embmon_checkpoint_restore_failures_total", "counter",
        "Checkpoint files rejected at start-up (the previous one, or empty state, was used), by reason.",
        labels=("reason",), code="monitor.daemon.checkpointing:Checkpointer._unusable"),
    MetricSpec("embmon_ingest_queue_polls", "gauge",
        "Decoded polls waiting to be applied (queue plus backlog).",
        code="monitor.daemon.ingest:IngestPipeline.queue_depth"),
    MetricSpec("embmon_ingest_paused", "gauge",
        "1 while fetching is paused because the apply queue is full (backpressure).",
        code="monitor.daemon.ingest:IngestPipeline.paused"),
    MetricSpec("embmon_ingest_backpressure_seconds_total", "counter",
        "Time fetching was paused because applying could not keep up.",
        unit="seconds", code="monitor.daemon.ingest:IngestPipeline.backpressure_seconds"),
    MetricSpec("embmon_consumer_lag_timestamp_seconds", "gauge",
        "When embmon_consumer_lag_records was last measured.",
        unit="seconds", code="monitor.sources.kafka.reconnect:LagReading.record"),
    MetricSpec("embmon_http_auth_failures_total", "counter",
        "HTTP requests rejected for missing or wrong credentials, by endpoint kind.",
        labels=("endpoint",), code="monitor.server.exporter:HttpServer._deny"),
    MetricSpec("embmon_state_files_rejected_total", "counter",
        "Files of the state directory found unusable at start-up (a stored drift reference, the canary pins) and moved"
        " aside, by file. 0 when healthy.",
        labels=("file",), code="monitor.storage.durable_files:RejectedFiles.set_aside"),
)
