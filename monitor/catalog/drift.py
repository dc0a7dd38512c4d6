"""Drift against the reference: the tests, their thresholds and verdicts, what moved, the online detectors.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MS, MetricSpec

AREA = "drift"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_reference_records", "gauge",
        "Records the drift reference summarises (its centroid is exact over them).",
        labels=MS, unit="records", code="monitor.drift.references.profile:ReferenceProfile.from_sample"),
    MetricSpec("embmon_reference_timestamp_seconds", "gauge",
        "When the drift reference was captured (unix seconds).",
        labels=MS, unit="seconds", code="monitor.drift.component:DriftComponent.on_embeddings"),
    MetricSpec("embmon_drift_mmd2", "gauge",
        "Unbiased MMD² (RBF kernel) between the window and reference samples.",
        labels=MS, code="monitor.drift.twosample.mmd:mmd_test"),
    MetricSpec("embmon_drift_p_value", "gauge",
        "p-value of each drift test at the last cycle (suite: Bonferroni-adjusted minimum).",
        labels=(*MS, "test"), code="monitor.drift.twosample.suite:run_drift_suite"),
    MetricSpec("embmon_drift_threshold", "gauge",
        "p-value threshold each test was held to (multiplicity-corrected; suite: cycle alpha).",
        labels=(*MS, "test"), code="monitor.drift.twosample.suite:apply_multiplicity"),
    MetricSpec("embmon_drift_detected", "gauge",
        "1 when the test flagged drift at the last cycle (suite: the tests' combined verdict; evidence: the "
        "accumulating detector alarmed; sustained: drift.sustained rule over the last cycles, or an evidence alarm).",
        labels=(*MS, "test"), code="monitor.drift.component:DriftComponent._cycle_one"),
    MetricSpec("embmon_drift_drifted_components_ratio", "gauge",
        "Share of principal components whose KS test rejects after Benjamini-Hochberg.",
        labels=MS, unit="ratio", code="monitor.drift.twosample.ks:ks_test"),
    MetricSpec("embmon_drift_centroid_cosine_distance", "gauge",
        "Cosine distance between the window and reference mean vectors.",
        labels=MS, code="monitor.drift.twosample.centroid:centroid_test"),
    MetricSpec("embmon_drift_classifier_auc", "gauge",
        "Held-out ROC AUC of a classifier separating window from reference.",
        labels=MS, code="monitor.drift.twosample.classifier:classifier_test"),
    MetricSpec("embmon_drift_p_value_floor", "gauge",
        "Smallest p-value each drift test could give at the last cycle: 1/(1 + permutations) for a permutation test, 0"
        " for the others; above embmon_drift_threshold the test could not have detected.",
        labels=(*MS, "test"), code="monitor.drift.twosample.permutation:PermutationOutcome.floor"),
    MetricSpec("embmon_drift_tests_cut_total", "counter",
        "Drift tests the cycle's time budget cut short: skipped (not started) or truncated (a permutation test stopped"
        " drawing). 0 when healthy.",
        labels=(*MS, "test"), code="monitor.drift.stream_state:DriftTotals.count_planned"),
    MetricSpec("embmon_drift_tests_screened_total", "counter",
        "Costly drift tests (classifier, MMD) the staged cycle left out because no cheap test's p-value reached "
        "drift.screen_level; counted as p = 1. About 95 % of quiet cycles or more.",
        labels=(*MS, "test"), code="monitor.drift.stream_state:DriftTotals.count_planned"),
    MetricSpec("embmon_drift_screen_p_value", "gauge",
        "The staged cycle's screen at the last cycle: the smallest of the KS, centroid, location-screen and "
        "scale-screen p-values; the costly tests ran when it was at most drift.screen_level.",
        labels=MS, code="monitor.drift.twosample.screen:screen_p_value"),
    MetricSpec("embmon_drift_region_reference_ratio", "gauge",
        "Share of the held-out reference sample in each region of the reference (k-means, k <= 16).",
        labels=(*MS, "region"), unit="ratio", code="monitor.drift.attribution.region_shares:compare_regions"),
    MetricSpec("embmon_drift_region_window_ratio", "gauge",
        "Share of the window sample in each region of the reference at the last cycle.",
        labels=(*MS, "region"), unit="ratio", code="monitor.drift.attribution.region_shares:compare_regions"),
    MetricSpec("embmon_drift_region_p_value", "gauge",
        "Benjamini-Hochberg adjusted p-value of each region's share change (Fisher's exact test) at the last cycle.",
        labels=(*MS, "region"), code="monitor.drift.attribution.region_shares:compare_regions"),
    MetricSpec("embmon_drift_regions_shifted", "gauge",
        "Regions whose share changed at the last cycle (adjusted p-value at most the cycle alpha).",
        labels=MS, code="monitor.drift.attribution.region_shares:RegionReport.shifted"),
    MetricSpec("embmon_drift_novel_ratio", "gauge",
        "Share of the window sample farther from every reference row than 99% of held-out reference rows are (about "
        "0.01 when nothing new arrived).",
        labels=MS, unit="ratio", code="monitor.drift.attribution.region_shares:calibrated_novelty"),
    MetricSpec("embmon_drift_change_points_total", "counter",
        "Change points the online detectors flagged, by signal and detector.",
        labels=(*MS, "signal", "detector"), code="monitor.drift.online.detectors:OnlineDriftMonitor.update"),
    MetricSpec("embmon_drift_last_change_timestamp_seconds", "gauge",
        "When the online detector last flagged a change (unix seconds).",
        labels=(*MS, "signal", "detector"),
        unit="seconds",
        code="monitor.drift.online.detectors:OnlineDriftMonitor.update"),
    MetricSpec("embmon_drift_log_evidence", "gauge",
        "log R_t of the accumulating detector (Shiryaev-Roberts on conformal bets on the fresh rows' regions) at the "
        "last cycle; it alarms at embmon_drift_log_evidence_threshold and restarts.",
        labels=MS, code="monitor.drift.online.evidence_feed:EvidenceFeed.step"),
    MetricSpec("embmon_drift_log_evidence_threshold", "gauge",
        "log A, the accumulating detector's alarm line: A = 1 / (evidence_share x interval / false_alarm_every).",
        labels=MS, code="monitor.drift.settings:DriftSettings.evidence_threshold"),
    MetricSpec("embmon_drift_evidence_alarms_total", "counter",
        "Alarms of the accumulating detector (each one flags the cycle's verdict and restarts it).",
        labels=MS, code="monitor.drift.component:DriftComponent._cycle_one"),
    MetricSpec("embmon_drift_errors_total", "counter",
        "Failures the drift component caught, by stage: store (a reference could not be written to the state "
        "directory), cycle (a stream's test cycle failed), test (a drift test failed and was left out of the verdict)."
        " 0 when healthy.",
        labels=("stage",), code="monitor.drift.component:DriftComponent._count_error"),
)
