"""The one list of metric names the alerts and dashboards may use.

Every PromQL expression in :mod:`monitor.artifacts` names metrics through :func:`m` (or the
constants below), which refuses a name that is not listed here; a rename is one edit in this
file, and ``tests/artifacts/test_alerts.py`` checks that every ``embmon_*`` name in the generated artifacts
appears in :data:`METRICS`. The daemon-side check (every listed name is really exported) needs a
running daemon: :func:`exported_names` expands histograms into the series names a scrape shows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from monitor.retrieval.families import PROBE_METRIC_FAMILIES

Kind = Literal["counter", "gauge", "histogram", "info"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    labels: tuple[str, ...]
    area: str  # core | drift | retrieval


MS = ("model", "stream")
# how alerts and dashboards name each retrieval metric family
RETRIEVAL_TITLES = {
    "recall": "Recall",
    "precision": "Precision",
    "map": "MAP",
    "mrr": "MRR",
    "ndcg": "nDCG",
    "err": "ERR",
    "hit_rate": "Hit rate",
}


def _specs() -> dict[str, MetricSpec]:
    rows: list[tuple[str, Kind, tuple[str, ...], str]] = [
        ("embmon_records_total", "counter", MS, "core"),
        ("embmon_records_invalid_total", "counter", ("stream", "reason"), "core"),
        ("embmon_interactions_total", "counter", ("model",), "core"),
        ("embmon_refresh_duration_seconds", "histogram", (), "core"),
        ("embmon_source_up", "gauge", (), "core"),
        ("embmon_consumer_lag_records", "gauge", ("topic",), "core"),
        ("embmon_build_info", "gauge", ("version",), "core"),
        ("embmon_job_runs_total", "counter", ("job", "outcome"), "core"),
        ("embmon_job_duration_seconds", "histogram", ("job",), "core"),
        # operations: checkpoints, backpressure, access control (docs/operations.md)
        ("embmon_checkpoint_last_success_timestamp_seconds", "gauge", (), "core"),
        ("embmon_checkpoint_age_seconds", "gauge", (), "core"),
        ("embmon_checkpoint_size_bytes", "gauge", (), "core"),
        ("embmon_checkpoint_duration_seconds", "histogram", (), "core"),
        ("embmon_checkpoint_write_failures_total", "counter", ("stage",), "core"),
        ("embmon_checkpoint_restore_failures_total", "counter", ("reason",), "core"),
        ("embmon_ingest_queue_polls", "gauge", (), "core"),
        ("embmon_ingest_paused", "gauge", (), "core"),
        ("embmon_ingest_backpressure_seconds_total", "counter", (), "core"),
        ("embmon_consumer_lag_timestamp_seconds", "gauge", (), "core"),
        ("embmon_http_auth_failures_total", "counter", ("endpoint",), "core"),
    ]
    for gauge in (
        "partition_isotropy",
        "effective_dimension",
        "effective_dimension_ratio",
        "top10_variance_ratio",
        "mean_cosine_similarity",
        "vector_norm_mean",
        "vector_norm_stddev",
        "dead_dimensions",
        "effective_rank",
        "stable_rank",
        "collapse_detected",
        "uniformity",
        "alignment",
        "dimension",
        "window_records",
        "sample_records",
        "metrics_last_update_timestamp_seconds",
        "last_record_timestamp_seconds",
    ):
        rows.append((f"embmon_{gauge}", "gauge", MS, "core"))
    # drift
    for gauge in (
        "reference_records",
        "reference_timestamp_seconds",
        "drift_mmd2",
        "drift_drifted_components_ratio",
        "drift_centroid_cosine_distance",
        "drift_classifier_auc",
    ):
        rows.append((f"embmon_{gauge}", "gauge", MS, "drift"))
    for gauge in ("drift_p_value", "drift_threshold", "drift_detected"):
        rows.append((f"embmon_{gauge}", "gauge", (*MS, "test"), "drift"))
    rows.append(("embmon_drift_change_points_total", "counter", (*MS, "signal", "detector"), "drift"))
    rows.append(
        ("embmon_drift_last_change_timestamp_seconds", "gauge", (*MS, "signal", "detector"), "drift")
    )
    # retrieval
    pmsk = ("probe", "model", "slice", "k")
    for metric in (*PROBE_METRIC_FAMILIES, "ann_recall"):
        for suffix in ("", "_ci_lower", "_ci_upper"):
            rows.append((f"embmon_retrieval_{metric}{suffix}", "gauge", pmsk, "retrieval"))
    rows += [
        ("embmon_retrieval_queries", "gauge", ("probe", "model", "slice"), "retrieval"),
        ("embmon_probe_runs_total", "counter", ("probe", "outcome"), "retrieval"),
        ("embmon_probe_duration_seconds", "gauge", ("probe",), "retrieval"),
        ("embmon_probe_last_success_timestamp_seconds", "gauge", ("probe",), "retrieval"),
        ("embmon_retrieval_catalog_coverage_ratio", "gauge", ("probe", "model"), "retrieval"),
        ("embmon_retrieval_gini", "gauge", ("probe", "model"), "retrieval"),
        ("embmon_retrieval_popularity_bias", "gauge", ("probe", "model"), "retrieval"),
        ("embmon_retrieval_click_through_rate", "gauge", pmsk, "retrieval"),
        ("embmon_retrieval_zero_result_ratio", "gauge", ("probe", "model", "slice"), "retrieval"),
        ("embmon_retrieval_similarity_spearman", "gauge", ("probe", "model"), "retrieval"),
        ("embmon_retrieval_ann_known_results_ratio", "gauge", ("probe", "model"), "retrieval"),
        ("embmon_retrieval_slice_warnings", "gauge", ("probe", "model", "kind"), "retrieval"),
        ("embmon_probe_events_dropped_total", "counter", ("probe",), "retrieval"),
    ]
    return {name: MetricSpec(name, kind, labels, area) for name, kind, labels, area in rows}


METRICS: dict[str, MetricSpec] = _specs()

_SERIES_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}


def m(name: str) -> str:
    """Return ``name`` if the daemon exports it (histogram series suffixes allowed), else raise."""
    if name in METRICS:
        return name
    for base, spec in METRICS.items():
        if spec.kind == "histogram" and name in {base + s for s in _SERIES_SUFFIXES["histogram"]}:
            return name
    raise ValueError(f"unknown metric {name!r}: add it to monitor/artifacts/catalog.py first")


def exported_names() -> set[str]:
    """Series names a scrape of the daemon shows for the catalogued metrics."""
    names: set[str] = set()
    for name, spec in METRICS.items():
        names.update(name + s for s in _SERIES_SUFFIXES.get(spec.kind, ("",)))
    return names


_NAME = re.compile(r"(?<![A-Za-z0-9_:])(embmon_[A-Za-z0-9_]+)")


def referenced_metrics(expr: str) -> set[str]:
    """``embmon_*`` metric names in a PromQL expression (recording-rule names excluded)."""
    # the look-behind skips the middle of a recorded series name `level:embmon_x:operations`
    return {match.group(1) for match in _NAME.finditer(expr)}
