"""Every metric the daemon exports, declared once: name, type, HELP text, unit and label names.

The collectors build their families from here (:func:`gauge`, :func:`counter`, :func:`histogram`),
the alert and dashboard generators may only name metrics listed here, and the declaration line
under each heading of docs/metrics.md is generated from it (:mod:`monitor.artifacts.metric_docs`),
so a name, a HELP line or a label set cannot drift between what is scraped, what is alerted on and
what is documented. ``tests/artifacts/test_catalog.py`` scrapes a
daemon with every feature on and fails on any family that is not declared here exactly.

Names are as a scrape shows them: counters end in ``_total`` (prometheus-client appends it to
the family name), histograms are the base name of their ``_bucket``/``_sum``/``_count`` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

Kind = Literal["counter", "gauge", "histogram", "info"]
Area = Literal["ingest", "intrinsic", "operations", "drift", "retrieval", "canary", "scale_out", "serving"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""  # the base unit the name ends in (seconds, bytes, ratio, ...); "" when a count or score
    area: Area = "ingest"

    @property
    def family(self) -> str:
        """The name prometheus-client's family objects take (without ``_total`` / ``_info``)."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name

    def series(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this metric."""
        if self.kind == "histogram":
            return tuple(self.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)


MS = ("model", "stream")
PROBE_ESTIMATE_LABELS = ("probe", "model", "slice", "k")
RETRIEVAL_ESTIMATES = {
    "recall": "Recall@k: relevant documents in the top k over all relevant (trec_eval recall_k).",
    "precision": "Precision@k: relevant documents in the top k over k (trec_eval P_k).",
    "map": "Average precision cut at k, over all relevant documents (trec_eval map_cut_k).",
    "mrr": "Reciprocal rank of the first relevant (clicked) result within k.",
    "ndcg": "nDCG@k (trec_eval ndcg_cut_k; gain as configured).",
    "err": "Expected reciprocal rank at k (Chapelle; Elasticsearch rank-eval).",
    "hit_rate": "Share of queries with a relevant result within k (trec_eval success_k).",
    "ann_recall": "Share of the exact top k (over the documents the monitor holds) that the ANN index served.",
}


def _spec_rows() -> Iterable[MetricSpec]:
    ingest: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_build_info", "info", "embedding-monitor build information.", ("version",), ""),
        ("embmon_records_total", "counter", "Valid embedding records ingested.", MS, ""),
        ("embmon_last_record_timestamp_seconds", "gauge", "When the last valid record of the stream was ingested.",
         MS, "seconds"),
        ("embmon_records_invalid_total", "counter", "Records rejected by decoding or the label budget, by reason.",
         ("stream", "reason"), ""),
        ("embmon_interactions_total", "counter", "Valid interaction events ingested.", ("model",), ""),
        ("embmon_internal_errors_total", "counter",
         "Unexpected exceptions caught inside the daemon, by stage (a bug: report it).", ("stage",), ""),
        ("embmon_job_runs_total", "counter", "Runs of scheduled jobs (refresh, drift, probes) by outcome.",
         ("job", "outcome"), ""),
        ("embmon_job_duration_seconds", "histogram", "Wall time of one run of a scheduled job.", ("job",), "seconds"),
        ("embmon_refresh_duration_seconds", "histogram", "Wall time of one window-metric refresh over all streams.",
         (), "seconds"),
        ("embmon_metrics_last_update_timestamp_seconds", "gauge",
         "When the window metrics of the stream were last recomputed.", MS, "seconds"),
        ("embmon_source_up", "gauge", "1 when the record source is connected and readable.", (), ""),
        ("embmon_source_errors_total", "counter",
         "Failed reads from the record source, by reason (unsupported_codec: a compression library is missing).",
         ("reason",), ""),
        ("embmon_consumer_lag_records", "gauge",
         "Records behind the end of the topic, summed over assigned partitions.", ("topic",), "records"),
        ("embmon_source_last_progress_timestamp_seconds", "gauge",
         "When the consumer was last caught up on the topic (lag 0) or applied records from it; it falls "
         "behind while records wait and none are applied (a stalled poll or partition).", ("topic",), "seconds"),
        ("embmon_source_offset_resets_total", "counter",
         "Partition positions found outside their log and reset by kafka.auto_offset_reset, by reason "
         "(past_end, before_start, topic_recreated, truncated). 0 when healthy.", ("reason",), ""),
    ]
    for name, kind, help_text, labels, unit in ingest:
        yield MetricSpec(name, kind, help_text, labels, unit, "ingest")

    intrinsic = [
        ("partition_isotropy", "d * smallest / sum of covariance eigenvalues over the window (1 = isotropic).", ""),
        ("effective_dimension", "Participation ratio (sum lambda)^2 / sum lambda^2 of covariance eigenvalues.", ""),
        ("effective_dimension_ratio", "Effective dimension divided by the vector dimension.", "ratio"),
        ("top10_variance_ratio", "Share of total variance in the 10 largest covariance eigenvalues.", "ratio"),
        ("mean_cosine_similarity", "Exact mean cosine similarity over all distinct pairs in the window.", ""),
        ("vector_norm_mean", "Mean L2 norm of the vectors in the window.", ""),
        ("vector_norm_stddev", "Standard deviation of the L2 norms in the window.", ""),
        ("dead_dimensions",
         "Dimensions whose variance is below dead_dimension_ratio x the mean per-dimension variance.", ""),
        ("effective_rank",
         "exp(entropy of normalised singular values of the centred window) (Roy & Vetterli, 2007).", ""),
        ("stable_rank", "sum sigma^2 / sigma_max^2 of the centred window.", ""),
        ("collapse_detected", "1 when the collapse rule fires for the window (see docs/metrics.md), else 0.", ""),
        ("uniformity",
         "Wang & Isola uniformity (t=2) over pairs of the window sample; lower is more spread.", ""),
        ("alignment",
         "Wang & Isola alignment (alpha=2): mean distance^alpha between declared positive pairs.", ""),
        ("dimension", "Dimension of the model's vectors.", ""),
        ("window_records", "Records in the current sliding window.", "records"),
        ("sample_records", "Rows in the window's uniform sample (used by pair-based metrics and probes).", "records"),
    ]
    for short, help_text, unit in intrinsic:
        yield MetricSpec(f"embmon_{short}", "gauge", help_text, MS, unit, "intrinsic")

    operations: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_checkpoint_last_success_timestamp_seconds", "gauge", "When the last checkpoint was written.",
         (), "seconds"),
        ("embmon_checkpoint_age_seconds", "gauge",
         "Seconds since the last checkpoint was written (since start-up if none).", (), "seconds"),
        ("embmon_checkpoint_size_bytes", "gauge", "Size of the last checkpoint file.", (), "bytes"),
        ("embmon_checkpoint_duration_seconds", "histogram",
         "Wall time of one checkpoint: capture between batches, encode, write, fsync, rename.", (), "seconds"),
        ("embmon_checkpoint_write_failures_total", "counter",
         "Checkpoints that could not be taken or written, by stage.", ("stage",), ""),
        ("embmon_checkpoint_restore_failures_total", "counter",
         "Checkpoint files rejected at start-up (the previous one, or empty state, was used), by reason.",
         ("reason",), ""),
        ("embmon_ingest_queue_polls", "gauge", "Decoded polls waiting to be applied (queue plus backlog).", (), ""),
        ("embmon_ingest_paused", "gauge",
         "1 while fetching is paused because the apply queue is full (backpressure).", (), ""),
        ("embmon_ingest_backpressure_seconds_total", "counter",
         "Time fetching was paused because applying could not keep up.", (), "seconds"),
        ("embmon_consumer_lag_timestamp_seconds", "gauge", "When embmon_consumer_lag_records was last measured.",
         (), "seconds"),
        ("embmon_http_auth_failures_total", "counter",
         "HTTP requests rejected for missing or wrong credentials, by endpoint kind.", ("endpoint",), ""),
        ("embmon_state_files_rejected_total", "counter",
         "Files of the state directory found unusable at start-up (a stored drift reference, the canary pins) "
         "and moved aside, by file. 0 when healthy.", ("file",), ""),
    ]
    for name, kind, help_text, labels, unit in operations:
        yield MetricSpec(name, kind, help_text, labels, unit, "operations")

    drift: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_reference_records", "gauge",
         "Records the drift reference summarises (its centroid is exact over them).", MS, "records"),
        ("embmon_reference_timestamp_seconds", "gauge", "When the drift reference was captured (unix seconds).",
         MS, "seconds"),
        ("embmon_drift_mmd2", "gauge", "Unbiased MMD² (RBF kernel) between the window and reference samples.", MS, ""),
        ("embmon_drift_p_value", "gauge",
         "p-value of each drift test at the last cycle (suite: Bonferroni-adjusted minimum).", (*MS, "test"), ""),
        ("embmon_drift_threshold", "gauge",
         "p-value threshold each test was held to (multiplicity-corrected; suite: cycle alpha).", (*MS, "test"), ""),
        ("embmon_drift_detected", "gauge",
         "1 when the test flagged drift at the last cycle (suite: combined verdict; sustained: drift.sustained "
         "rule over the last cycles).", (*MS, "test"), ""),
        ("embmon_drift_drifted_components_ratio", "gauge",
         "Share of principal components whose KS test rejects after Benjamini-Hochberg.", MS, "ratio"),
        ("embmon_drift_centroid_cosine_distance", "gauge",
         "Cosine distance between the window and reference mean vectors.", MS, ""),
        ("embmon_drift_classifier_auc", "gauge",
         "Held-out ROC AUC of a classifier separating window from reference.", MS, ""),
        ("embmon_drift_p_value_floor", "gauge",
         "Smallest p-value each drift test could give at the last cycle: 1/(1 + permutations) for a permutation "
         "test, 0 for the others; above embmon_drift_threshold the test could not have detected.",
         (*MS, "test"), ""),
        ("embmon_drift_tests_cut_total", "counter",
         "Drift tests the cycle's time budget cut short: skipped (not started) or truncated (a permutation test "
         "stopped drawing). 0 when healthy.", (*MS, "test"), ""),
        ("embmon_drift_region_reference_ratio", "gauge",
         "Share of the held-out reference sample in each region of the reference (k-means, k <= 16).",
         (*MS, "region"), "ratio"),
        ("embmon_drift_region_window_ratio", "gauge",
         "Share of the window sample in each region of the reference at the last cycle.", (*MS, "region"), "ratio"),
        ("embmon_drift_region_p_value", "gauge",
         "Benjamini-Hochberg adjusted p-value of each region's share change (Fisher's exact test) at the last cycle.",
         (*MS, "region"), ""),
        ("embmon_drift_regions_shifted", "gauge",
         "Regions whose share changed at the last cycle (adjusted p-value at most the cycle alpha).", MS, ""),
        ("embmon_drift_novel_ratio", "gauge",
         "Share of the window sample farther from every reference row than 99% of held-out reference rows are "
         "(about 0.01 when nothing new arrived).", MS, "ratio"),
        ("embmon_drift_change_points_total", "counter",
         "Change points the online detectors flagged, by signal and detector.", (*MS, "signal", "detector"), ""),
        ("embmon_drift_last_change_timestamp_seconds", "gauge",
         "When the online detector last flagged a change (unix seconds).", (*MS, "signal", "detector"), "seconds"),
        ("embmon_drift_errors_total", "counter",
         "Failures the drift component caught, by stage: store (a reference could not be written to the state "
         "directory), cycle (a stream's test cycle failed), test (a drift test failed and was left out of the "
         "verdict). 0 when healthy.", ("stage",), ""),
    ]
    for name, kind, help_text, labels, unit in drift:
        yield MetricSpec(name, kind, help_text, labels, unit, "drift")

    for short, help_text in RETRIEVAL_ESTIMATES.items():
        base = f"embmon_retrieval_{short}"
        yield MetricSpec(base, "gauge", help_text, PROBE_ESTIMATE_LABELS, "", "retrieval")
        for side, word in (("lower", "Lower"), ("upper", "Upper")):
            yield MetricSpec(f"{base}_ci_{side}", "gauge", f"{word} bound of the bootstrap interval of {base}.",
                             PROBE_ESTIMATE_LABELS, "", "retrieval")
    retrieval: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_probe_runs_total", "counter", "Runs of each retrieval probe by outcome (success, failure, timeout).",
         ("probe", "outcome"), ""),
        ("embmon_probe_duration_seconds", "gauge", "Wall time of the last run of the probe.", ("probe",), "seconds"),
        ("embmon_probe_last_success_timestamp_seconds", "gauge",
         "When the probe last succeeded (the daemon's start until it first does).", ("probe",), "seconds"),
        ("embmon_probe_events_dropped_total", "counter",
         "Interaction events evicted from a probe's buffer while still inside its window.", ("probe",), ""),
        ("embmon_retrieval_queries", "gauge", "Queries behind the probe's last estimates.",
         ("probe", "model", "slice"), ""),
        ("embmon_retrieval_click_through_rate", "gauge", "Share of queries with at least one clicked result within k.",
         PROBE_ESTIMATE_LABELS, ""),
        ("embmon_retrieval_zero_result_ratio", "gauge", "Share of queries that returned no result.",
         ("probe", "model", "slice"), "ratio"),
        ("embmon_retrieval_catalog_coverage_ratio", "gauge",
         "Distinct recommended catalog items over the catalog size, over the probe window.", ("probe", "model"),
         "ratio"),
        ("embmon_retrieval_gini", "gauge",
         "Gini coefficient of recommendation counts over the catalog (0 = even exposure).", ("probe", "model"), ""),
        ("embmon_retrieval_popularity_bias", "gauge",
         "Mean click popularity of recommended items over the catalog mean (1 = unbiased).", ("probe", "model"), ""),
        ("embmon_retrieval_similarity_spearman", "gauge",
         "Spearman correlation of candidate and reference pairwise similarities.", ("probe", "model"), ""),
        ("embmon_retrieval_ann_known_results_ratio", "gauge",
         "Share of served results whose vectors the monitor held (what ANN recall could check).", ("probe", "model"),
         "ratio"),
        ("embmon_retrieval_slice_warnings", "gauge",
         "Slices flagged in the last run: small_slice (too few queries) or folded_slices (cap reached).",
         ("probe", "model", "kind"), ""),
    ]
    for name, kind, help_text, labels, unit in retrieval:
        yield MetricSpec(name, kind, help_text, labels, unit, "retrieval")

    scale_out: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        # a replica (scale_out.role replica)
        ("embmon_partials_published_total", "counter",
         "Records a replica published to the partials topic, by kind (subwindow chunk, tombstone, manifest).",
         ("kind",), ""),
        ("embmon_partials_published_bytes_total", "counter",
         "Bytes of record values a replica published to the partials topic.", (), "bytes"),
        ("embmon_partials_publish_failures_total", "counter",
         "Publications a replica could not send; its offsets are not committed until one is sent.", (), ""),
        ("embmon_partials_last_publish_timestamp_seconds", "gauge",
         "When the replica's newest publication reached the broker.", (), "seconds"),
        # the reducer (scale_out.role reducer)
        ("embmon_reducer_replicas", "gauge", "Replicas whose publications the reducer merges, by state (live, stale).",
         ("state",), ""),
        ("embmon_reducer_replica_stale", "gauge",
         "1 when the replica's newest publication is older than scale_out.stale_after_seconds, else 0.",
         ("replica",), ""),
        ("embmon_reducer_partial_age_seconds", "gauge",
         "Seconds since the replica captured the state of its newest publication the reducer applied.",
         ("replica",), "seconds"),
        ("embmon_reducer_replica_window_records", "gauge",
         "Records each replica contributes to the reducer's merged windows, over all streams.", ("replica",),
         "records"),
        ("embmon_reducer_partials_applied_total", "counter",
         "Partial records the reducer applied, by kind (subwindow, manifest).", ("kind",), ""),
        ("embmon_reducer_partials_ignored_total", "counter",
         "Partial records the reducer did not merge, by reason (see docs/metrics.md).", ("reason",), ""),
        ("embmon_reducer_stream_owned", "gauge",
         "1 for each (model, stream) this reducer merges and exports (exactly one reducer per stream).",
         ("model", "stream"), ""),
        ("embmon_reducer_partitions_owned", "gauge",
         "Partitions of the partials topic this reducer merges (all of them for a single reducer).", (), ""),
        ("embmon_reducer_rebalances_total", "counter",
         "Changes of the partials partitions this reducer owns in its group (scale_out.reducer_group).", (), ""),
    ]
    for name, kind, help_text, labels, unit in scale_out:
        yield MetricSpec(name, kind, help_text, labels, unit, "scale_out")


    canary: list[tuple[str, Kind, str, str]] = [
        ("embmon_canary_cosine_min", "gauge",
         "Lowest cosine between a canary's embedding and its pinned vector over the window (1 = unchanged).", ""),
        ("embmon_canary_mismatches_total", "counter",
         "Canary records whose cosine to their pin fell below 1 - canaries.tolerance (the model changed).", ""),
        ("embmon_canary_records_total", "counter", "Canary records compared with their pinned vector.", ""),
        ("embmon_canary_pins", "gauge", "Canary ids of the model with a pinned vector.", ""),
        ("embmon_canary_last_seen_timestamp_seconds", "gauge", "When a canary record of the model last arrived.",
         "seconds"),
    ]
    for name, kind, help_text, unit in canary:
        yield MetricSpec(name, kind, help_text, ("model",), unit, "canary")
    yield from _serving_rows()


def _serving_rows() -> Iterable[MetricSpec]:
    """The serving probe (monitor/serving/, docs/canaries.md): its canaries are counted above."""
    serving: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_serving_requests_total", "counter", "Embedding requests the serving probe sent to the endpoint.",
         ("model",), ""),
        ("embmon_serving_errors_total", "counter",
         "Serving-probe requests that failed, by reason (connect, timeout, rate_limited, auth, http_error, html, "
         "not_json, bad_response, ragged, oversized, encoder). 0 when healthy.", ("model", "reason"), ""),
        ("embmon_serving_invalid_vectors_total", "counter",
         "Vectors the endpoint returned that cannot be used, by reason (empty, zero, non_finite, "
         "wrong_dimension). 0 when healthy.", ("model", "reason"), ""),
        ("embmon_serving_cycles_total", "counter",
         "Serving-probe cycles by outcome (ok; failed: a request failed; skipped: backing off).",
         ("model", "outcome"), ""),
        ("embmon_serving_deviation", "gauge",
         "The last cycle's statistic of each conformance check: 1 - cos (repeat, batch, neighbour), its change "
         "from the pins (case, whitespace, prefix), or a relative norm change (norm). 0 = conformant.",
         ("model", "check"), ""),
        ("embmon_serving_tolerance", "gauge", "The tolerance each conformance check's deviation is compared with.",
         ("model", "check"), ""),
        ("embmon_serving_violations_total", "counter",
         "Serving-probe cycles in which a conformance check failed, by check. 0 when healthy.",
         ("model", "check"), ""),
        ("embmon_serving_collisions", "gauge",
         "Pairs of distinct canary texts (or of their upper-cased forms) with identical vectors in the last "
         "cycle. 0 when healthy.", ("model",), ""),
        ("embmon_serving_latency_median_seconds", "gauge", "Median latency of the last cycle's requests.",
         ("model",), "seconds"),
        ("embmon_serving_latency_max_seconds", "gauge", "Slowest request of the last cycle.", ("model",), "seconds"),
        ("embmon_serving_last_success_timestamp_seconds", "gauge",
         "When a serving-probe cycle of the model last completed without a failed request.", ("model",), "seconds"),
        ("embmon_serving_backoff_seconds", "gauge",
         "How much longer than its interval the probe waits before it tries the endpoint again (0 when healthy).",
         ("model",), "seconds"),
    ]
    for name, kind, help_text, labels, unit in serving:
        yield MetricSpec(name, kind, help_text, labels, unit, "serving")


def _build() -> dict[str, MetricSpec]:
    specs: dict[str, MetricSpec] = {}
    for spec in _spec_rows():
        if spec.name in specs:
            raise ValueError(f"metric {spec.name} is declared twice")
        if spec.unit and spec.unit not in spec.name:
            raise ValueError(f"metric {spec.name} must name its unit {spec.unit!r}")
        if (spec.kind == "counter") != spec.name.endswith("_total"):
            raise ValueError(f"metric {spec.name}: counters, and only counters, end in _total")
        specs[spec.name] = spec
    return specs


CATALOG: dict[str, MetricSpec] = _build()


def spec(name: str) -> MetricSpec:
    """The declaration of ``name``; a name nobody declared is a bug caught at first use."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not declared in monitor/catalog.py") from None


def gauge(name: str) -> GaugeMetricFamily:
    from prometheus_client.metrics_core import GaugeMetricFamily

    s = _of_kind(name, "gauge")
    return GaugeMetricFamily(s.family, s.help, labels=list(s.labels))


def counter(name: str) -> CounterMetricFamily:
    from prometheus_client.metrics_core import CounterMetricFamily

    s = _of_kind(name, "counter")
    return CounterMetricFamily(s.family, s.help, labels=list(s.labels))


def info(name: str, value: dict[str, str]) -> InfoMetricFamily:
    from prometheus_client.metrics_core import InfoMetricFamily

    s = _of_kind(name, "info")
    return InfoMetricFamily(s.family, s.help, value=value)


def histogram(name: str, registry: CollectorRegistry, buckets: Sequence[float]) -> Histogram:
    """A live histogram (observed by the daemon) registered on ``registry``."""
    from prometheus_client import Histogram

    s = _of_kind(name, "histogram")
    return Histogram(s.name, s.help, list(s.labels), buckets=buckets, registry=registry)


def _of_kind(name: str, kind: Kind) -> MetricSpec:
    s = spec(name)
    if s.kind != kind:
        raise TypeError(f"metric {name} is declared as a {s.kind}, not a {kind}")
    return s
