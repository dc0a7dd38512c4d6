"""Builds the metric families of one scrape from what the daemon already computed.

Every family here is documented in docs/metrics.md; the HELP strings are the one-line version.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from monitor import __version__

if TYPE_CHECKING:
    from monitor.service import Monitor

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


class MonitorCollector(Collector):
    """Reads the monitor's published snapshot and live counters; never computes metrics."""

    def __init__(self, monitor: Monitor):
        self._monitor = monitor

    def collect(self) -> Iterable[Metric]:
        m = self._monitor
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
        for component in m.components:
            try:
                yield from component.collect()
            except Exception:  # noqa: BLE001 - one component's bug must not break the scrape
                m.count_internal_error(f"collect:{component.name}")

    def _ingest_families(self) -> Iterable[Metric]:
        m = self._monitor
        records = CounterMetricFamily("embmon_records", "Valid embedding records ingested.", labels=STREAM_LABELS)
        last = GaugeMetricFamily(
            "embmon_last_record_timestamp_seconds", "When the last valid record of the stream was ingested.",
            labels=STREAM_LABELS,
        )
        for state in m.registry:
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
        published = self._monitor.published
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
