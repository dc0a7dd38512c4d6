"""Builds the metric families of one scrape from what the daemon already computed.

Collectors read a :class:`~monitor.status.DaemonStatus` (or a component's published snapshot) and
never compute: the refresh and the jobs did that. Every family here is documented in
docs/metrics.md; the HELP strings are the one-line version.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor import __version__
from monitor.checkpoint import RESTORE_FAILURE_REASONS

if TYPE_CHECKING:
    from monitor.checkpointer import CheckpointStatus
    from monitor.component import Component
    from monitor.counters import InternalErrors
    from monitor.status import DaemonStatus

INTRINSIC_HELP = {
    "partition_isotropy": "d * smallest / sum of covariance eigenvalues over the window (1 = isotropic).",
    "effective_dimension": "Participation ratio (sum lambda)^2 / sum lambda^2 of covariance eigenvalues.",
    "effective_dimension_ratio": "Effective dimension divided by the vector dimension.",
    "top10_variance_ratio": "Share of total variance in the 10 largest covariance eigenvalues.",
    "mean_cosine_similarity": "Exact mean cosine similarity over all distinct pairs in the window.",
    "vector_norm_mean": "Mean L2 norm of the vectors in the window.",
    "vector_norm_stddev": "Standard deviation of the L2 norms in the window.",
    "dead_dimensions": "Dimensions whose variance is below dead_dimension_ratio x the mean per-dimension variance.",
    "effective_rank": "exp(entropy of normalised singular values of the centred window) (Roy & Bhattacharya).",
    "stable_rank": "sum sigma^2 / sigma_max^2 of the centred window.",
    "collapse_detected": "1 when the collapse rule fires for the window (see docs/metrics.md), else 0.",
    "uniformity": "Wang & Isola uniformity (t=2) over pairs of the window sample; lower is more spread.",
    "alignment": "Wang & Isola alignment (alpha=2): mean distance^alpha between declared positive pairs.",
    "dimension": "Dimension of the model's vectors.",
    "window_records": "Records in the current sliding window.",
    "sample_records": "Rows in the window's uniform sample (used by pair-based metrics and probes).",
}

STREAM_LABELS = ["model", "stream"]


class CoreCollector(Collector):
    """Ingest counters, source health and the published intrinsic metrics of every stream."""

    def __init__(self, status: DaemonStatus):
        self._status = status

    def collect(self) -> Iterable[Metric]:
        m = self._status
        yield InfoMetricFamily("embmon_build", "embedding-monitor build information.", value={"version": __version__})
        yield from self._ingest_families()
        yield from self._intrinsic_families()
        source_up = GaugeMetricFamily("embmon_source_up", "1 when the record source is connected and readable.")
        source_up.add_metric([], 1.0 if m.source_up() else 0.0)
        yield source_up
        lag = m.source_lag()
        if lag is not None:
            family = GaugeMetricFamily(
                "embmon_consumer_lag_records", "Records behind the end of the topic, summed over assigned partitions.",
                labels=["topic"],
            )
            for topic, value in sorted(lag.items()):
                family.add_metric([topic], float(value))
            yield family

    def _ingest_families(self) -> Iterable[Metric]:
        m = self._status
        records = CounterMetricFamily("embmon_records", "Valid embedding records ingested.", labels=STREAM_LABELS)
        last = GaugeMetricFamily(
            "embmon_last_record_timestamp_seconds", "When the last valid record of the stream was ingested.",
            labels=STREAM_LABELS,
        )
        for state in m.streams():
            records.add_metric([state.model, state.stream], float(state.records_total))
            if state.last_record_time is not None:
                last.add_metric([state.model, state.stream], state.last_record_time)
        yield records
        yield last
        invalid = CounterMetricFamily(
            "embmon_records_invalid", "Records rejected by decoding or the label budget, by reason.",
            labels=["stream", "reason"],
        )
        for (stream, reason), count in sorted(m.invalid_counts().items()):
            invalid.add_metric([stream, reason], float(count))
        yield invalid
        interactions = CounterMetricFamily("embmon_interactions", "Valid interaction events ingested.", labels=["model"])
        for model, count in sorted(m.interaction_counts().items()):
            interactions.add_metric([model], float(count))
        yield interactions
        errors = CounterMetricFamily(
            "embmon_internal_errors", "Unexpected exceptions caught inside the daemon, by stage (a bug: report it).",
            labels=["stage"],
        )
        for stage, count in sorted(m.internal_error_counts().items()):
            errors.add_metric([stage], float(count))
        yield errors
        runs = CounterMetricFamily(
            "embmon_job_runs", "Runs of scheduled jobs (refresh, drift, probes) by outcome.", labels=["job", "outcome"]
        )
        for (job, outcome), count in sorted(m.job_run_counts().items()):
            runs.add_metric([job, outcome], float(count))
        yield runs

    def _intrinsic_families(self) -> Iterable[Metric]:
        published = self._status.published
        families = {
            name: GaugeMetricFamily(f"embmon_{name}", help_text, labels=STREAM_LABELS)
            for name, help_text in INTRINSIC_HELP.items()
        }
        updated = GaugeMetricFamily(
            "embmon_metrics_last_update_timestamp_seconds",
            "When the window metrics of the stream were last recomputed.",
            labels=STREAM_LABELS,
        )
        for (model, stream), entry in sorted(published.reports.items()):
            labels = [model, stream]
            for field in dataclasses.fields(entry.report):
                family = families.get(field.name)
                value = getattr(entry.report, field.name)
                if family is None or value is None:
                    continue
                value = float(value)
                if not math.isnan(value):
                    family.add_metric(labels, value)
            updated.add_metric(labels, entry.computed_at)
        yield from families.values()
        yield updated


class OperationsCollector(Collector):
    """Checkpoint, backpressure and access-control metrics (docs/metrics.md, "Operations")."""

    def __init__(self, status: DaemonStatus):
        self._status = status

    def collect(self) -> Iterable[Metric]:
        m = self._status
        checkpoint = m.checkpoint()
        if checkpoint is not None:
            yield from _checkpoint_families(m, checkpoint)
        depth = GaugeMetricFamily(
            "embmon_ingest_queue_polls", "Decoded polls waiting to be applied (queue plus backlog)."
        )
        depth.add_metric([], float(m.queue_depth()))
        yield depth
        paused = GaugeMetricFamily(
            "embmon_ingest_paused", "1 while fetching is paused because the apply queue is full (backpressure)."
        )
        paused.add_metric([], 1.0 if m.ingest_paused() else 0.0)
        yield paused
        pressure = CounterMetricFamily(
            "embmon_ingest_backpressure_seconds", "Time fetching was paused because applying could not keep up."
        )
        pressure.add_metric([], m.backpressure_seconds())
        yield pressure
        lag_updated = m.lag_updated()
        if lag_updated is not None:
            fresh = GaugeMetricFamily(
                "embmon_consumer_lag_timestamp_seconds", "When embmon_consumer_lag_records was last measured."
            )
            fresh.add_metric([], lag_updated)
            yield fresh
        auth = CounterMetricFamily(
            "embmon_http_auth_failures", "HTTP requests rejected for missing or wrong credentials, by endpoint kind.",
            labels=["endpoint"],
        )
        counts = m.auth_failure_counts()
        for kind in ("metrics", "admin", "other"):
            auth.add_metric([kind], float(counts.get(kind, 0)))
        yield auth


def _checkpoint_families(m: DaemonStatus, status: CheckpointStatus) -> Iterable[Metric]:
    when = GaugeMetricFamily(
        "embmon_checkpoint_last_success_timestamp_seconds", "When the last checkpoint was written."
    )
    age = GaugeMetricFamily(
        "embmon_checkpoint_age_seconds", "Seconds since the last checkpoint was written (since start-up if none)."
    )
    size = GaugeMetricFamily("embmon_checkpoint_size_bytes", "Size of the last checkpoint file.")
    now = m.wall_clock()
    if status.last_success is not None:
        when.add_metric([], status.last_success)
        age.add_metric([], max(0.0, now - status.last_success))
        size.add_metric([], status.size_bytes or 0.0)
    else:
        age.add_metric([], max(0.0, now - m.started_at))
    yield when
    yield age
    yield size
    failures = CounterMetricFamily(
        "embmon_checkpoint_write_failures", "Checkpoints that could not be taken or written, by stage.",
        labels=["stage"],
    )
    for stage in ("capture", "write"):
        failures.add_metric([stage], float(status.write_failures.get(stage, 0)))
    yield failures
    restore = CounterMetricFamily(
        "embmon_checkpoint_restore_failures",
        "Checkpoint files rejected at start-up (the previous one, or empty state, was used), by reason.",
        labels=["reason"],
    )
    for reason in RESTORE_FAILURE_REASONS:
        restore.add_metric([reason], float(status.restore_failures.get(reason, 0)))
    yield restore


class ComponentCollector(Collector):
    """Each component's own families; one component's bug is counted and must not break the scrape."""

    def __init__(self, components: Sequence[Component], errors: InternalErrors):
        self._components = components
        self._errors = errors

    def collect(self) -> Iterable[Metric]:
        for component in self._components:
            try:
                yield from component.collect()
            except Exception:  # noqa: BLE001 - one component's bug must not break the scrape
                self._errors.count(f"collect:{component.name}")
