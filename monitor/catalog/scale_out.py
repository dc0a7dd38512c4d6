"""Scale-out: replicas publishing partials, reducers merging them.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MS, MetricSpec

AREA = "scale_out"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_partials_published_total", "counter",
        "Records a replica published to the partials topic, by kind (subwindow chunk, tombstone, manifest).",
        labels=("kind",), code="monitor.scaleout.publisher:PartialsPublisher._deliver"),
    MetricSpec("embmon_partials_published_bytes_total", "counter",
        "Bytes of record values a replica published to the partials topic.",
        unit="bytes", code="monitor.scaleout.publisher:PartialsPublisher._deliver"),
    MetricSpec("embmon_partials_manifests_refused_total", "counter",
        "Manifests on the partials topic a replica refused to resume after (forged, unsigned, out of range), and "
        "published offsets capped at the log's end, by reason.",
        labels=("reason",), code="monitor.scaleout.resume:ManifestReader._manifest"),
    MetricSpec("embmon_partials_publish_failures_total", "counter",
        "Publications a replica could not send; its offsets are not committed until one is sent.",
        code="monitor.scaleout.publisher:PartialsPublisher.flush"),
    MetricSpec("embmon_partials_last_publish_timestamp_seconds", "gauge",
        "When the replica's newest publication reached the broker.",
        unit="seconds", code="monitor.scaleout.publisher:PartialsPublisher.flush"),
    MetricSpec("embmon_partials_signing_enabled", "gauge",
        "1 when the partials topic's records are signed and checked (scale_out.partials_key_file set), else 0.",
        code="monitor.scaleout.export:SigningCollector.collect"),
    MetricSpec("embmon_reducer_replicas", "gauge",
        "Replicas whose publications the reducer merges, by state (live, stale).",
        labels=("state",), code="monitor.scaleout.table:MergeTable.status"),
    MetricSpec("embmon_reducer_replica_stale", "gauge",
        "1 when the replica's newest publication is older than scale_out.stale_after_seconds, else 0.",
        labels=("replica",), code="monitor.scaleout.table:MergeTable.status"),
    MetricSpec("embmon_reducer_partial_age_seconds", "gauge",
        "Seconds since the replica captured the state of its newest publication the reducer applied.",
        labels=("replica",), unit="seconds", code="monitor.scaleout.table:MergeTable.status"),
    MetricSpec("embmon_reducer_replica_window_records", "gauge",
        "Records each replica contributes to the reducer's merged windows, over all streams.",
        labels=("replica",), unit="records", code="monitor.scaleout.table:MergeTable.status"),
    MetricSpec("embmon_reducer_partials_applied_total", "counter",
        "Partial records the reducer applied, by kind (subwindow, manifest).",
        labels=("kind",), code="monitor.scaleout.table:MergeTable.offer_manifest"),
    MetricSpec("embmon_reducer_partials_ignored_total", "counter",
        "Partial records the reducer did not merge, by reason (see docs/metrics.md).",
        labels=("reason",), code="monitor.scaleout.table:MergeTable.offer_record"),
    MetricSpec("embmon_reducer_stream_owned", "gauge",
        "1 for each (model, stream) this reducer merges and exports (exactly one reducer per stream).",
        labels=MS, code="monitor.scaleout.export:Ownership.streams"),
    MetricSpec("embmon_reducer_partitions_owned", "gauge",
        "Partitions of the partials topic this reducer merges (all of them for a single reducer).",
        code="monitor.scaleout.intake:PartialsReader.read_partitions"),
    MetricSpec("embmon_reducer_rebalances_total", "counter",
        "Changes of the partials partitions this reducer owns in its group (scale_out.reducer_group).",
        code="monitor.scaleout.intake:PartialsReader._follow_group"),
)
