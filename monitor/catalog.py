"""Every metric the daemon exports, declared once: name, type, HELP text, unit, label names, and the
code that computes the number (``module:qualname``, one hop from a metric to its formula).

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

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

_CODE = re.compile(r"monitor(\.\w+)+:\w+(\.\w+)*")
Kind = Literal["counter", "gauge", "histogram", "info"]
Area = Literal["ingest", "intrinsic", "operations", "drift", "retrieval", "canary", "scale_out", "index",
               "serving"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""  # the base unit the name ends in (seconds, bytes, ratio, ...); "" when a count or score
    area: Area = "ingest"
    # the code that computes the number, as ``module:qualname`` (docs/metrics.md shows it under the
    # metric's heading; tests/artifacts/test_catalog.py imports every one)
    code: str = ""  # required: __post_init__ refuses one that is not module:qualname

    def __post_init__(self) -> None:
        if self.unit and self.unit not in self.name:
            raise ValueError(f"metric {self.name} must name its unit {self.unit!r}")
        if not _CODE.fullmatch(self.code):
            raise ValueError(f"metric {self.name} must name the code that computes it as module:qualname, "
                             f"not {self.code!r}")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name}: counters, and only counters, end in _total")

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
# what computes each estimate's per-query values (the mean and its interval: retrieval/stats.py)
RETRIEVAL_ESTIMATE_CODE = {
    "recall": "monitor.retrieval.metrics:_recall",
    "precision": "monitor.retrieval.metrics:_precision",
    "map": "monitor.retrieval.metrics:_average_precision",
    "mrr": "monitor.retrieval.metrics:_reciprocal_rank",
    "ndcg": "monitor.retrieval.metrics:_ndcg",
    "err": "monitor.retrieval.metrics:_err",
    "hit_rate": "monitor.retrieval.metrics:_hit_rate",
    "ann_recall": "monitor.retrieval.probes.ann_recall:recall_against_pool",
}


_INDEX_CODE = {  # the function that computes each index metric (module:qualname)
    "embmon_index_recall_ratio": "monitor.index.estimators:summarise",
    "embmon_index_recall_lower_ratio": "monitor.index.estimators:summarise",
    "embmon_index_recall_upper_ratio": "monitor.index.estimators:summarise",
    "embmon_index_recall_p5_ratio": "monitor.index.estimators:summarise",
    "embmon_index_recall_p10_ratio": "monitor.index.estimators:summarise",
    "embmon_index_epsilon_recall_ratio": "monitor.index.estimators:outcome",
    "embmon_index_distance_inflation": "monitor.index.estimators:outcome",
    "embmon_index_under_return_ratio": "monitor.index.estimators:outcome",
    "embmon_index_queries": "monitor.index.estimators:summarise",
    "embmon_index_scope_flagged": "monitor.index.scopes:scope_summary",
    "embmon_index_scopes_hidden": "monitor.index.scopes:scope_summary",
    "embmon_index_recall_loss_ratio": "monitor.index.estimators:recall_loss",
    "embmon_index_stale_ratio": "monitor.index.probe:IndexProbe._census",
    "embmon_index_stale_lower_ratio": "monitor.index.estimators:wilson",
    "embmon_index_stale_upper_ratio": "monitor.index.estimators:wilson",
    "embmon_index_census_ids": "monitor.index.probe:IndexProbe._census",
    "embmon_index_generation_share_ratio": "monitor.index.estimators:generations",
    "embmon_index_missing_ratio": "monitor.index.probe:IndexProbe._census",
    "embmon_index_orphan_ratio": "monitor.index.probe:IndexProbe._census",
    "embmon_index_degenerate_ratio": "monitor.index.probe:IndexProbe._census",
    "embmon_index_hubness_skewness": "monitor.index.estimators:k_occurrence_skewness",
    "embmon_index_hub_occurrence_ratio": "monitor.index.probe:IndexProbe._hubs",
    "embmon_index_rows": "monitor.index.probe:IndexProbe._census",
    "embmon_index_probe_runs_total": "monitor.index.component:IndexComponent.run_probe",
    "embmon_index_errors_total": "monitor.index.component:IndexComponent._failed",
    "embmon_index_census_errors_total": "monitor.index.component:IndexComponent._publish",
    "embmon_index_queries_skipped_total": "monitor.index.probe:IndexProbe._probe_query",
    "embmon_index_searches_total": "monitor.index.probe:IndexProbe._search",
    "embmon_index_rows_read_total": "monitor.index.probe:IndexProbe.run",
    "embmon_index_probe_cpu_seconds_total": "monitor.index.probe:IndexProbe.run",
    "embmon_index_probe_duration_seconds": "monitor.index.component:IndexComponent.run_probe",
    "embmon_index_probe_last_success_timestamp_seconds": "monitor.index.component:IndexComponent._publish",
}


_SERVING_CODE = {  # the function that computes each serving-probe metric (module:qualname)
    "embmon_serving_requests_total": "monitor.serving.component:ServingComponent._cycle",
    "embmon_serving_errors_total": "monitor.serving.component:ServingComponent._cycle",
    "embmon_serving_invalid_vectors_total": "monitor.serving.responses:check_rows",
    "embmon_serving_cycles_total": "monitor.serving.component:ServingComponent._cycle",
    "embmon_serving_deviation": "monitor.serving.probe:run_cycle",
    "embmon_serving_tolerance": "monitor.serving.probe:tolerance",
    "embmon_serving_violations_total": "monitor.serving.probe:violations",
    "embmon_serving_collisions": "monitor.serving.probe:collisions",
    "embmon_serving_latency_median_seconds": "monitor.serving.probe:run_cycle",
    "embmon_serving_latency_max_seconds": "monitor.serving.probe:run_cycle",
    "embmon_serving_request_duration_seconds": "monitor.serving.component:ServingComponent._cycle",
    "embmon_serving_last_success_timestamp_seconds": "monitor.serving.component:ServingComponent._cycle",
    "embmon_serving_backoff_seconds": "monitor.serving.component:ServingComponent._cycle",
}


def _spec_rows() -> Iterable[MetricSpec]:
    ingest: list[tuple[str, Kind, str, tuple[str, ...], str, str]] = [
        ("embmon_build_info", "info", "embedding-monitor build information.", ("version",), "",
         "monitor.daemon.export:CoreCollector.collect"),
        ("embmon_records_total", "counter", "Valid embedding records ingested.", MS, "",
         "monitor.state.registry:StateRegistry.apply"),
        ("embmon_last_record_timestamp_seconds", "gauge", "When the last valid record of the stream was ingested.",
         MS, "seconds", "monitor.state.registry:StateRegistry.apply"),
        ("embmon_records_invalid_total", "counter", "Records rejected by decoding or the label budget, by reason.",
         ("stream", "reason"), "", "monitor.daemon.ingest:IngestPipeline.apply"),
        ("embmon_interactions_total", "counter", "Valid interaction events ingested.", ("model",), "",
         "monitor.daemon.ingest:IngestPipeline.apply"),
        ("embmon_internal_errors_total", "counter",
         "Unexpected exceptions caught inside the daemon, by stage (a bug: report it).", ("stage",), "",
         "monitor.daemon.counters:InternalErrors.count"),
        ("embmon_job_runs_total", "counter", "Runs of scheduled jobs (refresh, drift, probes) by outcome.",
         ("job", "outcome"), "", "monitor.daemon.jobs:JobRunner.run"),
        ("embmon_job_duration_seconds", "histogram", "Wall time of one run of a scheduled job.", ("job",), "seconds",
         "monitor.daemon.jobs:JobRunner.run"),
        ("embmon_refresh_duration_seconds", "histogram", "Wall time of one window-metric refresh over all streams.",
         (), "seconds", "monitor.daemon.refresh:Refresher.refresh"),
        ("embmon_metrics_last_update_timestamp_seconds", "gauge",
         "When the window metrics of the stream were last recomputed.", MS, "seconds",
         "monitor.daemon.refresh:Refresher.refresh"),
        ("embmon_source_up", "gauge", "1 when the record source is connected and readable.", (), "",
         "monitor.sources.kafka.source:KafkaSource.up"),
        ("embmon_source_errors_total", "counter",
         "Failed reads from the record source, by reason (unsupported_codec: a compression library is missing).",
         ("reason",), "", "monitor.sources.kafka.source:KafkaSource.poll"),
        ("embmon_consumer_lag_records", "gauge",
         "Records behind the end of the topic, summed over assigned partitions.", ("topic",), "records",
         "monitor.sources.kafka.policy:records_behind"),
        ("embmon_source_last_progress_timestamp_seconds", "gauge",
         "When the consumer was last caught up on the topic (lag 0) or applied records from it; it falls "
         "behind while records wait and none are applied (a stalled poll or partition).", ("topic",), "seconds",
         "monitor.sources.kafka.reconnect:ConsumerReadings._note_progress"),
        ("embmon_source_offset_resets_total", "counter",
         "Partition positions found outside their log and reset by kafka.auto_offset_reset, by reason "
         "(past_end, before_start, topic_recreated, truncated). 0 when healthy.", ("reason",), "",
         "monitor.sources.kafka.positions:PositionGuard.carry_out"),
    ]
    for name, kind, help_text, labels, unit, code in ingest:
        yield MetricSpec(name, kind, help_text, labels, unit, "ingest", code)

    intrinsic: list[tuple[str, str, str, str]] = [
        ("partition_isotropy", "d * smallest / sum of covariance eigenvalues over the window (1 = isotropic).", "",
         "monitor.quality.intrinsic:_spectrum_metrics"),
        ("effective_dimension", "Participation ratio (sum lambda)^2 / sum lambda^2 of covariance eigenvalues.", "",
         "monitor.quality.intrinsic:_spectrum_metrics"),
        ("effective_dimension_ratio", "Effective dimension divided by the vector dimension.", "ratio",
         "monitor.quality.intrinsic:report_from_stats"),
        ("top10_variance_ratio", "Share of total variance in the 10 largest covariance eigenvalues.", "ratio",
         "monitor.quality.intrinsic:_spectrum_metrics"),
        ("mean_cosine_similarity", "Exact mean cosine similarity over all distinct pairs in the window.", "",
         "monitor.quality.intrinsic:report_from_stats"),
        ("vector_norm_mean", "Mean L2 norm of the vectors in the window.", "",
         "monitor.quality.intrinsic:report_from_stats"),
        ("vector_norm_stddev", "Standard deviation of the L2 norms in the window.", "",
         "monitor.quality.intrinsic:report_from_stats"),
        ("dead_dimensions",
         "Dimensions whose variance is below dead_dimension_ratio x the mean per-dimension variance.", "",
         "monitor.quality.intrinsic:_dead_dimensions"),
        ("effective_rank",
         "exp(entropy of normalised singular values of the centred window) (Roy & Vetterli, 2007).", "",
         "monitor.quality.intrinsic:_spectrum_metrics"),
        ("stable_rank", "sum sigma^2 / sigma_max^2 of the centred window.", "",
         "monitor.quality.intrinsic:_spectrum_metrics"),
        ("collapse_detected", "1 when the collapse rule fires for the window (see docs/metrics.md), else 0.", "",
         "monitor.quality.intrinsic:collapse_reasons"),
        ("uniformity",
         "Wang & Isola uniformity (t=2) over pairs of the window sample; lower is more spread.", "",
         "monitor.quality.intrinsic:uniformity"),
        ("alignment",
         "Wang & Isola alignment (alpha=2): mean distance^alpha between declared positive pairs.", "",
         "monitor.state.pairs:PositivePairMatcher.match"),
        ("dimension", "Dimension of the model's vectors.", "", "monitor.quality.intrinsic:report_from_stats"),
        ("window_records", "Records in the current sliding window.", "records",
         "monitor.quality.intrinsic:report_from_stats"),
        ("sample_records", "Rows in the window's uniform sample (used by pair-based metrics and probes).", "records",
         "monitor.quality.intrinsic:report_from_stats"),
    ]
    for short, help_text, unit, code in intrinsic:
        yield MetricSpec(f"embmon_{short}", "gauge", help_text, MS, unit, "intrinsic", code)

    operations: list[tuple[str, Kind, str, tuple[str, ...], str, str]] = [
        ("embmon_refresh_last_success_timestamp_seconds", "gauge",
         "When the last refresh of the window metrics ended.", (), "seconds",
         "monitor.daemon.refresh:Refresher.refresh"),
        ("embmon_refresh_age_seconds", "gauge",
         "Seconds since the last refresh of the window metrics ended (since start-up if none).", (), "seconds",
         "monitor.daemon.export:_refresh_families"),
        ("embmon_checkpoint_last_success_timestamp_seconds", "gauge", "When the last checkpoint was written.",
         (), "seconds", "monitor.daemon.checkpointing:Checkpointer.checkpoint"),
        ("embmon_checkpoint_age_seconds", "gauge",
         "Seconds since the last checkpoint was written (since start-up if none).", (), "seconds",
         "monitor.daemon.export:_checkpoint_families"),
        ("embmon_checkpoint_size_bytes", "gauge", "Size of the last checkpoint file.", (), "bytes",
         "monitor.daemon.checkpointing:Checkpointer.checkpoint"),
        ("embmon_checkpoint_duration_seconds", "histogram",
         "Wall time of one checkpoint: capture between batches, encode, write, fsync, rename.", (), "seconds",
         "monitor.daemon.checkpointing:Checkpointer.checkpoint"),
        ("embmon_checkpoint_write_failures_total", "counter",
         "Checkpoints that could not be taken or written, by stage.", ("stage",), "",
         "monitor.daemon.checkpointing:Checkpointer._failed"),
        ("embmon_checkpoint_restore_failures_total", "counter",
         "Checkpoint files rejected at start-up (the previous one, or empty state, was used), by reason.",
         ("reason",), "", "monitor.daemon.checkpointing:Checkpointer._unusable"),
        ("embmon_ingest_queue_polls", "gauge", "Decoded polls waiting to be applied (queue plus backlog).", (), "",
         "monitor.daemon.ingest:IngestPipeline.queue_depth"),
        ("embmon_ingest_paused", "gauge",
         "1 while fetching is paused because the apply queue is full (backpressure).", (), "",
         "monitor.daemon.ingest:IngestPipeline.paused"),
        ("embmon_ingest_backpressure_seconds_total", "counter",
         "Time fetching was paused because applying could not keep up.", (), "seconds",
         "monitor.daemon.ingest:IngestPipeline.backpressure_seconds"),
        ("embmon_consumer_lag_timestamp_seconds", "gauge", "When embmon_consumer_lag_records was last measured.",
         (), "seconds", "monitor.sources.kafka.reconnect:LagReading.record"),
        ("embmon_http_auth_failures_total", "counter",
         "HTTP requests rejected for missing or wrong credentials, by endpoint kind.", ("endpoint",), "",
         "monitor.server.exporter:HttpServer._deny"),
        ("embmon_state_files_rejected_total", "counter",
         "Files of the state directory found unusable at start-up (a stored drift reference, the canary pins) "
         "and moved aside, by file. 0 when healthy.", ("file",), "",
         "monitor.storage.durable_files:RejectedFiles.set_aside"),
    ]
    for name, kind, help_text, labels, unit, code in operations:
        yield MetricSpec(name, kind, help_text, labels, unit, "operations", code)

    drift: list[tuple[str, Kind, str, tuple[str, ...], str, str]] = [
        ("embmon_reference_records", "gauge",
         "Records the drift reference summarises (its centroid is exact over them).", MS, "records",
         "monitor.drift.references.profile:ReferenceProfile.from_sample"),
        ("embmon_reference_timestamp_seconds", "gauge", "When the drift reference was captured (unix seconds).",
         MS, "seconds", "monitor.drift.component:DriftComponent.on_embeddings"),
        ("embmon_drift_mmd2", "gauge", "Unbiased MMD² (RBF kernel) between the window and reference samples.", MS, "",
         "monitor.drift.twosample.mmd:mmd_test"),
        ("embmon_drift_p_value", "gauge",
         "p-value of each drift test at the last cycle (suite: Bonferroni-adjusted minimum).", (*MS, "test"), "",
         "monitor.drift.twosample.suite:run_drift_suite"),
        ("embmon_drift_threshold", "gauge",
         "p-value threshold each test was held to (multiplicity-corrected; suite: cycle alpha).", (*MS, "test"), "",
         "monitor.drift.twosample.suite:apply_multiplicity"),
        ("embmon_drift_detected", "gauge",
         "1 when the test flagged drift at the last cycle (suite: combined verdict; sustained: drift.sustained "
         "rule over the last cycles).", (*MS, "test"), "", "monitor.drift.component:DriftComponent._cycle_one"),
        ("embmon_drift_drifted_components_ratio", "gauge",
         "Share of principal components whose KS test rejects after Benjamini-Hochberg.", MS, "ratio",
         "monitor.drift.twosample.ks:ks_test"),
        ("embmon_drift_centroid_cosine_distance", "gauge",
         "Cosine distance between the window and reference mean vectors.", MS, "",
         "monitor.drift.twosample.centroid:centroid_test"),
        ("embmon_drift_classifier_auc", "gauge",
         "Held-out ROC AUC of a classifier separating window from reference.", MS, "",
         "monitor.drift.twosample.classifier:classifier_test"),
        ("embmon_drift_p_value_floor", "gauge",
         "Smallest p-value each drift test could give at the last cycle: 1/(1 + permutations) for a permutation "
         "test, 0 for the others; above embmon_drift_threshold the test could not have detected.",
         (*MS, "test"), "", "monitor.drift.twosample.permutation:PermutationOutcome.floor"),
        ("embmon_drift_tests_cut_total", "counter",
         "Drift tests the cycle's time budget cut short: skipped (not started) or truncated (a permutation test "
         "stopped drawing). 0 when healthy.", (*MS, "test"), "",
         "monitor.drift.stream_state:DriftTotals.count_planned"),
        ("embmon_drift_region_reference_ratio", "gauge",
         "Share of the held-out reference sample in each region of the reference (k-means, k <= 16).",
         (*MS, "region"), "ratio", "monitor.drift.attribution.region_shares:compare_regions"),
        ("embmon_drift_region_window_ratio", "gauge",
         "Share of the window sample in each region of the reference at the last cycle.", (*MS, "region"), "ratio",
         "monitor.drift.attribution.region_shares:compare_regions"),
        ("embmon_drift_region_p_value", "gauge",
         "Benjamini-Hochberg adjusted p-value of each region's share change (Fisher's exact test) at the last cycle.",
         (*MS, "region"), "", "monitor.drift.attribution.region_shares:compare_regions"),
        ("embmon_drift_regions_shifted", "gauge",
         "Regions whose share changed at the last cycle (adjusted p-value at most the cycle alpha).", MS, "",
         "monitor.drift.attribution.region_shares:RegionReport.shifted"),
        ("embmon_drift_novel_ratio", "gauge",
         "Share of the window sample farther from every reference row than 99% of held-out reference rows are "
         "(about 0.01 when nothing new arrived).", MS, "ratio",
         "monitor.drift.attribution.region_shares:calibrated_novelty"),
        ("embmon_drift_change_points_total", "counter",
         "Change points the online detectors flagged, by signal and detector.", (*MS, "signal", "detector"), "",
         "monitor.drift.online.detectors:OnlineDriftMonitor.update"),
        ("embmon_drift_last_change_timestamp_seconds", "gauge",
         "When the online detector last flagged a change (unix seconds).", (*MS, "signal", "detector"), "seconds",
         "monitor.drift.online.detectors:OnlineDriftMonitor.update"),
        ("embmon_drift_errors_total", "counter",
         "Failures the drift component caught, by stage: store (a reference could not be written to the state "
         "directory), cycle (a stream's test cycle failed), test (a drift test failed and was left out of the "
         "verdict). 0 when healthy.", ("stage",), "", "monitor.drift.component:DriftComponent._count_error"),
    ]
    for name, kind, help_text, labels, unit, code in drift:
        yield MetricSpec(name, kind, help_text, labels, unit, "drift", code)

    for short, help_text in RETRIEVAL_ESTIMATES.items():
        base = f"embmon_retrieval_{short}"
        yield MetricSpec(base, "gauge", help_text, PROBE_ESTIMATE_LABELS, "", "retrieval",
                         RETRIEVAL_ESTIMATE_CODE[short])
        for side, word in (("lower", "Lower"), ("upper", "Upper")):
            yield MetricSpec(f"{base}_ci_{side}", "gauge", f"{word} bound of the bootstrap interval of {base}.",
                             PROBE_ESTIMATE_LABELS, "", "retrieval", "monitor.retrieval.stats:bootstrap_ci")
    retrieval: list[tuple[str, Kind, str, tuple[str, ...], str, str]] = [
        ("embmon_probe_runs_total", "counter", "Runs of each retrieval probe by outcome (success, failure, timeout).",
         ("probe", "outcome"), "", "monitor.retrieval.probes.component:ProbeComponent._publish"),
        ("embmon_probe_duration_seconds", "gauge", "Wall time of the last run of the probe.", ("probe",), "seconds",
         "monitor.retrieval.probes.component:ProbeComponent._publish"),
        ("embmon_probe_last_success_timestamp_seconds", "gauge",
         "When the probe last succeeded (the daemon's start until it first does).", ("probe",), "seconds",
         "monitor.retrieval.probes.component:ProbeComponent._publish"),
        ("embmon_probe_request_errors_total", "counter",
         "Requests of a probe's HTTP retriever that failed, by reason (connect, timeout, oversized, redirect, "
         "protocol, http_error, not_json, bad_response). 0 when healthy.", ("probe", "reason"), "",
         "monitor.retrieval.probes.http_retriever:HttpRetriever.search"),
        ("embmon_probe_events_dropped_total", "counter",
         "Interaction events evicted from a probe's buffer while still inside its window.", ("probe",), "",
         "monitor.retrieval.probes.base:EventBuffer.add"),
        ("embmon_retrieval_queries", "gauge", "Queries behind the probe's last estimates.",
         ("probe", "model", "slice"), "", "monitor.retrieval.probes.base:summarise"),
        ("embmon_retrieval_click_through_rate", "gauge", "Share of queries with at least one clicked result within k.",
         PROBE_ESTIMATE_LABELS, "", "monitor.retrieval.probes.clicks:ClickFeedbackProbe._evaluate_model"),
        ("embmon_retrieval_zero_result_ratio", "gauge", "Share of queries that returned no result.",
         ("probe", "model", "slice"), "ratio", "monitor.retrieval.probes.clicks:ClickFeedbackProbe._evaluate_model"),
        ("embmon_retrieval_catalog_coverage_ratio", "gauge",
         "Distinct recommended catalog items over the catalog size, over the probe window.", ("probe", "model"),
         "ratio", "monitor.retrieval.probes.clicks:catalog_coverage"),
        ("embmon_retrieval_gini", "gauge",
         "Gini coefficient of recommendation counts over the catalog (0 = even exposure).", ("probe", "model"), "",
         "monitor.retrieval.probes.clicks:gini"),
        ("embmon_retrieval_popularity_bias", "gauge",
         "Mean click popularity of recommended items over the catalog mean (1 = unbiased).", ("probe", "model"), "",
         "monitor.retrieval.probes.clicks:popularity_bias"),
        ("embmon_retrieval_similarity_spearman", "gauge",
         "Spearman correlation of candidate and reference pairwise similarities.", ("probe", "model"), "",
         "monitor.retrieval.probes.agreement:similarity_spearman"),
        ("embmon_retrieval_ann_known_results_ratio", "gauge",
         "Share of served results whose vectors the monitor held (what ANN recall could check).", ("probe", "model"),
         "ratio", "monitor.retrieval.probes.ann_recall:AnnRecallProbe.run"),
        ("embmon_retrieval_slice_warnings", "gauge",
         "Slices flagged in the last run: small_slice (too few queries) or folded_slices (cap reached).",
         ("probe", "model", "kind"), "", "monitor.retrieval.probes.base:summarise"),
    ]
    for name, kind, help_text, labels, unit, code in retrieval:
        yield MetricSpec(name, kind, help_text, labels, unit, "retrieval", code)

    scale_out: list[tuple[str, Kind, str, tuple[str, ...], str, str]] = [
        # a replica (scale_out.role replica)
        ("embmon_partials_published_total", "counter",
         "Records a replica published to the partials topic, by kind (subwindow chunk, tombstone, manifest).",
         ("kind",), "", "monitor.scaleout.publisher:PartialsPublisher._deliver"),
        ("embmon_partials_published_bytes_total", "counter",
         "Bytes of record values a replica published to the partials topic.", (), "bytes",
         "monitor.scaleout.publisher:PartialsPublisher._deliver"),
        ("embmon_partials_manifests_refused_total", "counter",
         "Manifests on the partials topic a replica refused to resume after (forged, unsigned, out of "
         "range), and published offsets capped at the log's end, by reason.", ("reason",), "",
         "monitor.scaleout.resume:ManifestReader._manifest"),
        ("embmon_partials_publish_failures_total", "counter",
         "Publications a replica could not send; its offsets are not committed until one is sent.", (), "",
         "monitor.scaleout.publisher:PartialsPublisher.flush"),
        ("embmon_partials_last_publish_timestamp_seconds", "gauge",
         "When the replica's newest publication reached the broker.", (), "seconds",
         "monitor.scaleout.publisher:PartialsPublisher.flush"),
        # replicas and reducers
        ("embmon_partials_signing_enabled", "gauge",
         "1 when the partials topic's records are signed and checked (scale_out.partials_key_file set), else 0.",
         (), "", "monitor.scaleout.export:SigningCollector.collect"),
        # the reducer (scale_out.role reducer)
        ("embmon_reducer_replicas", "gauge", "Replicas whose publications the reducer merges, by state (live, stale).",
         ("state",), "", "monitor.scaleout.table:MergeTable.status"),
        ("embmon_reducer_replica_stale", "gauge",
         "1 when the replica's newest publication is older than scale_out.stale_after_seconds, else 0.",
         ("replica",), "", "monitor.scaleout.table:MergeTable.status"),
        ("embmon_reducer_partial_age_seconds", "gauge",
         "Seconds since the replica captured the state of its newest publication the reducer applied.",
         ("replica",), "seconds", "monitor.scaleout.table:MergeTable.status"),
        ("embmon_reducer_replica_window_records", "gauge",
         "Records each replica contributes to the reducer's merged windows, over all streams.", ("replica",),
         "records", "monitor.scaleout.table:MergeTable.status"),
        ("embmon_reducer_partials_applied_total", "counter",
         "Partial records the reducer applied, by kind (subwindow, manifest).", ("kind",), "",
         "monitor.scaleout.table:MergeTable.offer_manifest"),
        ("embmon_reducer_partials_ignored_total", "counter",
         "Partial records the reducer did not merge, by reason (see docs/metrics.md).", ("reason",), "",
         "monitor.scaleout.table:MergeTable.offer_record"),
        ("embmon_reducer_stream_owned", "gauge",
         "1 for each (model, stream) this reducer merges and exports (exactly one reducer per stream).",
         ("model", "stream"), "", "monitor.scaleout.export:Ownership.streams"),
        ("embmon_reducer_partitions_owned", "gauge",
         "Partitions of the partials topic this reducer merges (all of them for a single reducer).", (), "",
         "monitor.scaleout.intake:PartialsReader.read_partitions"),
        ("embmon_reducer_rebalances_total", "counter",
         "Changes of the partials partitions this reducer owns in its group (scale_out.reducer_group).", (), "",
         "monitor.scaleout.intake:PartialsReader._follow_group"),
    ]
    for name, kind, help_text, labels, unit, code in scale_out:
        yield MetricSpec(name, kind, help_text, labels, unit, "scale_out", code)

    # index probes (monitor/index/, docs/index.md): the vector store that serves the queries
    scope = ("probe", "model", "scope", "k")
    pm = ("probe", "model")
    index: list[tuple[str, Kind, str, tuple[str, ...], str]] = [  # the code of each: _INDEX_CODE
        ("embmon_index_recall_ratio", "gauge",
         "Recall@k of the production search against the engine's exact search with the same filter.", scope, "ratio"),
        ("embmon_index_recall_lower_ratio", "gauge",
         "Lower bound of embmon_index_recall_ratio: bootstrap (all, other) or confidence sequence (named scopes).",
         scope, "ratio"),
        ("embmon_index_recall_upper_ratio", "gauge",
         "Upper bound of embmon_index_recall_ratio: bootstrap (all, other) or confidence sequence (named scopes).",
         scope, "ratio"),
        ("embmon_index_recall_p5_ratio", "gauge",
         "5th percentile of the per-query recall@k (the tail).", scope, "ratio"),
        ("embmon_index_recall_p10_ratio", "gauge", "10th percentile of the per-query recall@k (the tail).", scope,
         "ratio"),
        ("embmon_index_epsilon_recall_ratio", "gauge",
         "Tie-aware recall@k: served results within (1 + epsilon) of the exact k-th distance.", scope, "ratio"),
        ("embmon_index_distance_inflation", "gauge",
         "Mean over queries of the served k-th distance over the exact k-th distance (1 = as near).", scope, ""),
        ("embmon_index_under_return_ratio", "gauge",
         "Share of queries served fewer rows than the exact search found (up to k).", scope, "ratio"),
        ("embmon_index_queries", "gauge",
         "Queries behind the index probe's last estimates.", ("probe", "model", "scope"),
         ""),
        ("embmon_index_scope_flagged", "gauge",
         "1 for a named scope whose recall is confidently below the rest by a margin, or which under-returns.",
         ("probe", "model", "scope"), ""),
        ("embmon_index_scopes_hidden", "gauge", "Scopes of the window not exported by name (pooled in other).", pm,
         ""),
        ("embmon_index_recall_loss_ratio", "gauge",
         "Recall lost, by part: total, filter, quantization, graph.", (*pm, "part"), "ratio"),
        ("embmon_index_stale_ratio", "gauge",
         "Share of sampled stored vectors that differ from the latest vector of their id.", pm, "ratio"),
        ("embmon_index_stale_lower_ratio", "gauge", "Lower bound of the Wilson interval of embmon_index_stale_ratio.",
         pm, "ratio"),
        ("embmon_index_stale_upper_ratio", "gauge", "Upper bound of the Wilson interval of embmon_index_stale_ratio.",
         pm, "ratio"),
        ("embmon_index_census_ids", "gauge",
         "Stored vectors the last census compared with their latest vector.", pm, ""),
        ("embmon_index_generation_share_ratio", "gauge",
         "Share of the sampled stored vectors in each generation (current, stale_1, stale_2, ...).",
         (*pm, "generation"), "ratio"),
        ("embmon_index_missing_ratio", "gauge",
         "Share of tracked stream ids (older than the grace period) absent from the index.", pm, "ratio"),
        ("embmon_index_orphan_ratio", "gauge",
         "Share of sampled index ids in the tracked hash range never seen in the stream.", pm, "ratio"),
        ("embmon_index_degenerate_ratio", "gauge",
         "Share of sampled stored rows that are degenerate, by kind (zero, nan, duplicate).", (*pm, "kind"), "ratio"),
        ("embmon_index_hubness_skewness", "gauge",
         "Skewness of the k-occurrence over the index (exact k-NN lists of sampled stored rows).", pm, ""),
        ("embmon_index_hub_occurrence_ratio", "gauge",
         "Share of the sampled k-NN lists that hold the most frequent neighbour.", pm, "ratio"),
        ("embmon_index_rows", "gauge", "Rows of the index, as the engine counts them.", pm, ""),
        ("embmon_index_probe_runs_total", "counter",
         "Cycles of each index probe by outcome (success, partial, failure, timeout, backoff).",
         ("probe", "outcome"), ""),
        ("embmon_index_errors_total", "counter", "Index probe failures by reason (see docs/metrics.md).",
         ("probe", "reason"), ""),
        ("embmon_index_census_errors_total", "counter",
         "Index censuses dropped by an engine error, by reason (the cycle's recall still published).",
         ("probe", "reason"), ""),
        ("embmon_index_queries_skipped_total", "counter",
         "Sampled queries the index probe could not use, by reason.", ("probe", "reason"), ""),
        ("embmon_index_searches_total", "counter", "Searches the index probe sent, by kind (served, exact).",
         ("probe", "kind"), ""),
        ("embmon_index_rows_read_total", "counter", "Rows the index probe read from the engine.", ("probe",), ""),
        ("embmon_index_probe_cpu_seconds_total", "counter",
         "CPU time of the index probe's cycles in the monitor (the engine's own is not included).", ("probe",),
         "seconds"),
        ("embmon_index_probe_duration_seconds", "gauge", "Wall time of the last cycle of the index probe.",
         ("probe",), "seconds"),
        ("embmon_index_probe_last_success_timestamp_seconds", "gauge",
         "When the index probe last completed a cycle (the daemon's start until it first does).", ("probe",),
         "seconds"),
    ]
    for name, kind, help_text, labels, unit in index:
        yield MetricSpec(name, kind, help_text, labels, unit, "index", _INDEX_CODE[name])

    canary: list[tuple[str, Kind, str, str, str]] = [
        ("embmon_canary_cosine_min", "gauge",
         "Lowest cosine between a canary's embedding and its pinned vector over the window (1 = unchanged).", "",
         "monitor.canary.component:CanaryComponent.publish"),
        ("embmon_canary_mismatches_total", "counter",
         "Canary records whose cosine to their pin fell below 1 - canaries.tolerance (the model changed).", "",
         "monitor.canary.component:CanaryComponent.on_embeddings"),
        ("embmon_canary_records_total", "counter", "Canary records compared with their pinned vector.", "",
         "monitor.canary.component:CanaryComponent.on_embeddings"),
        ("embmon_canary_pins", "gauge", "Canary ids of the model with a pinned vector.", "",
         "monitor.canary.component:CanaryComponent.publish"),
        ("embmon_canary_last_seen_timestamp_seconds", "gauge", "When a canary record of the model last arrived.",
         "seconds", "monitor.canary.component:CanaryComponent.on_embeddings"),
    ]
    for name, kind, help_text, unit, code in canary:
        yield MetricSpec(name, kind, help_text, ("model",), unit, "canary", code)
    yield from _serving_rows()


def _serving_rows() -> Iterable[MetricSpec]:
    """The serving probe (monitor/serving/, docs/canaries.md): its canaries are counted above."""
    serving: list[tuple[str, Kind, str, tuple[str, ...], str]] = [
        ("embmon_serving_requests_total", "counter", "Embedding requests the serving probe sent to the endpoint.",
         ("model",), ""),
        ("embmon_serving_errors_total", "counter",
         "Serving-probe requests that failed, by reason (connect, timeout, rate_limited, auth, http_error, html, "
         "not_json, bad_response, ragged, oversized, encoder, redirect). 0 when healthy.", ("model", "reason"), ""),
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
        ("embmon_serving_request_duration_seconds", "histogram",
         "Wall time of each successful serving-probe request, in OpenTelemetry's gen_ai.client.operation.duration "
         "buckets.", ("model",), "seconds"),
        ("embmon_serving_last_success_timestamp_seconds", "gauge",
         "When a serving-probe cycle of the model last completed without a failed request.", ("model",), "seconds"),
        ("embmon_serving_backoff_seconds", "gauge",
         "How much longer than its interval the probe waits before it tries the endpoint again (0 when healthy).",
         ("model",), "seconds"),
    ]
    for name, kind, help_text, labels, unit in serving:
        yield MetricSpec(name, kind, help_text, labels, unit, "serving", _SERVING_CODE[name])


def _build() -> dict[str, MetricSpec]:
    specs: dict[str, MetricSpec] = {}
    for spec in _spec_rows():
        if spec.name in specs:
            raise ValueError(f"metric {spec.name} is declared twice")
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
