"""Intrinsic health of each model's vectors over the sliding window (monitor/quality/intrinsic.py).

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MS, MetricSpec

AREA = "intrinsic"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_partition_isotropy", "gauge",
        "d * smallest / sum of covariance eigenvalues over the window (1 = isotropic).",
        labels=MS, code="monitor.quality.intrinsic:_spectrum_metrics"),
    MetricSpec("embmon_effective_dimension", "gauge",
        "Participation ratio (sum lambda)^2 / sum lambda^2 of covariance eigenvalues.",
        labels=MS, code="monitor.quality.intrinsic:_spectrum_metrics"),
    MetricSpec("embmon_effective_dimension_ratio", "gauge",
        "Effective dimension divided by the vector dimension.",
        labels=MS, unit="ratio", code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_top10_variance_ratio", "gauge",
        "Share of total variance in the 10 largest covariance eigenvalues.",
        labels=MS, unit="ratio", code="monitor.quality.intrinsic:_spectrum_metrics"),
    MetricSpec("embmon_mean_cosine_similarity", "gauge",
        "Exact mean cosine similarity over all distinct pairs in the window.",
        labels=MS, code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_vector_norm_mean", "gauge",
        "Mean L2 norm of the vectors in the window.",
        labels=MS, code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_vector_norm_stddev", "gauge",
        "Standard deviation of the L2 norms in the window.",
        labels=MS, code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_dead_dimensions", "gauge",
        "Dimensions whose variance is below dead_dimension_ratio x the mean per-dimension variance.",
        labels=MS, code="monitor.quality.intrinsic:_dead_dimensions"),
    MetricSpec("embmon_effective_rank", "gauge",
        "exp(entropy of normalised singular values of the centred window) (Roy & Vetterli, 2007).",
        labels=MS, code="monitor.quality.intrinsic:_spectrum_metrics"),
    MetricSpec("embmon_stable_rank", "gauge",
        "sum sigma^2 / sigma_max^2 of the centred window.",
        labels=MS, code="monitor.quality.intrinsic:_spectrum_metrics"),
    MetricSpec("embmon_collapse_detected", "gauge",
        "1 when the collapse rule fires for the window (see docs/metrics.md), else 0.",
        labels=MS, code="monitor.quality.intrinsic:collapse_reasons"),
    MetricSpec("embmon_uniformity", "gauge",
        "Wang & Isola uniformity (t=2) over pairs of the window sample; lower is more spread.",
        labels=MS, code="monitor.quality.intrinsic:uniformity"),
    MetricSpec("embmon_alignment", "gauge",
        "Wang & Isola alignment (alpha=2): mean distance^alpha between declared positive pairs.",
        labels=MS, code="monitor.state.pairs:PositivePairMatcher.match"),
    MetricSpec("embmon_dimension", "gauge",
        "Dimension of the model's vectors.",
        labels=MS, code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_window_records", "gauge",
        "Records in the current sliding window.",
        labels=MS, unit="records", code="monitor.quality.intrinsic:report_from_stats"),
    MetricSpec("embmon_sample_records", "gauge",
        "Rows in the window's uniform sample (used by pair-based metrics and probes).",
        labels=MS, unit="records", code="monitor.quality.intrinsic:report_from_stats"),
)
