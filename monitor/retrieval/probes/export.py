"""Metric families of the probes, built from the published snapshot at scrape time (no arithmetic).

Every name here is declared in monitor/catalog/ and documented in docs/metrics.md
("Retrieval quality").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from monitor.catalog import PROBE_ESTIMATE_LABELS, RETRIEVAL_ESTIMATES
from monitor.retrieval.probes.base import ProbeResult
from monitor.retrieval.probes.http_retriever import ERROR_REASONS as REQUEST_ERROR_REASONS

OUTCOMES = ("success", "failure", "timeout")

# HELP texts and label names as declared once in the catalog
ESTIMATE_HELP = RETRIEVAL_ESTIMATES
ESTIMATE_LABELS = list(PROBE_ESTIMATE_LABELS)

# name (without embmon_) -> (HELP, label names in order)
SAMPLE_SCHEMA: dict[str, tuple[str, list[str]]] = {
    "retrieval_click_through_rate": (
        "Share of queries with at least one clicked result within k.", ["probe", "model", "slice", "k"]),
    "retrieval_zero_result_ratio": ("Share of queries that returned no result.", ["probe", "model", "slice"]),
    "retrieval_catalog_coverage_ratio": (
        "Distinct recommended catalog items over the catalog size, over the probe window.", ["probe", "model"]),
    "retrieval_gini": (
        "Gini coefficient of recommendation counts over the catalog (0 = even exposure).", ["probe", "model"]),
    "retrieval_popularity_bias": (
        "Mean click popularity of recommended items over the catalog mean (1 = unbiased).", ["probe", "model"]),
    "retrieval_similarity_spearman": (
        "Spearman correlation of candidate and reference pairwise similarities.", ["probe", "model"]),
    "retrieval_ann_known_results_ratio": (
        "Share of served results whose vectors the monitor held (what ANN recall could check).", ["probe", "model"]),
    "retrieval_slice_warnings": (
        "Slices flagged in the last run: small_slice (too few queries) or folded_slices (cap reached).",
        ["probe", "model", "kind"]),
}


@dataclass(frozen=True)
class ProbeSnapshot:
    """Everything a scrape shows about the probes; replaced whole after every run."""

    results: Mapping[str, ProbeResult] = field(default_factory=dict)
    runs: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, outcome) -> runs
    durations: Mapping[str, float] = field(default_factory=dict)  # probe -> seconds of the last run
    last_success: Mapping[str, float] = field(default_factory=dict)  # probe -> unix time


def families(
    snapshot: ProbeSnapshot, probes: Iterable[str], dropped: Mapping[str, int],
    request_errors: Mapping[str, Mapping[str, int]] | None = None,
) -> Iterable[Metric]:
    """The metric families of one scrape; ``request_errors``: failed requests by probe and reason, of
    the probes with an HTTP retriever."""
    names = list(probes)
    runs = CounterMetricFamily(
        "embmon_probe_runs", "Runs of each retrieval probe by outcome (success, failure, timeout).",
        labels=["probe", "outcome"],
    )
    for probe in names:
        for outcome in OUTCOMES:
            runs.add_metric([probe, outcome], float(snapshot.runs.get((probe, outcome), 0)))
    yield runs
    duration = GaugeMetricFamily(
        "embmon_probe_duration_seconds", "Wall time of the last run of the probe.", labels=["probe"]
    )
    for probe in names:
        if probe in snapshot.durations:
            duration.add_metric([probe], snapshot.durations[probe])
    yield duration
    last = GaugeMetricFamily(
        "embmon_probe_last_success_timestamp_seconds",
        "When the probe last succeeded (the daemon's start until it first does).",
        labels=["probe"],
    )
    for probe in names:
        if probe in snapshot.last_success:
            last.add_metric([probe], snapshot.last_success[probe])
    yield last
    if dropped:
        drops = CounterMetricFamily(
            "embmon_probe_events_dropped",
            "Interaction events evicted from a probe's buffer while still inside its window.",
            labels=["probe"],
        )
        for probe, count in sorted(dropped.items()):
            drops.add_metric([probe], float(count))
        yield drops
    if request_errors:
        errors = CounterMetricFamily(
            "embmon_probe_request_errors",
            "Requests of a probe's HTTP retriever that failed, by reason (connect, timeout, oversized, redirect, "
            "protocol, http_error, not_json, bad_response). 0 when healthy.",
            labels=["probe", "reason"],
        )
        for probe, counts in sorted(request_errors.items()):
            for reason in REQUEST_ERROR_REASONS:
                errors.add_metric([probe, reason], float(counts.get(reason, 0)))
        yield errors
    yield from _result_families(snapshot.results)


def _result_families(results: Mapping[str, ProbeResult]) -> Iterable[Metric]:
    by_name: dict[str, GaugeMetricFamily] = {}

    def family(name: str, help_text: str, labels: list[str]) -> GaugeMetricFamily:
        if name not in by_name:
            by_name[name] = GaugeMetricFamily(name, help_text, labels=labels)
        return by_name[name]

    queries = family(
        "embmon_retrieval_queries", "Queries behind the probe's last estimates.", ["probe", "model", "slice"]
    )
    for probe, result in sorted(results.items()):
        for model, slice_, n in result.queries:
            queries.add_metric([probe, model, slice_], float(n))
        for e in result.estimates:
            labels = [probe, e.model, e.slice, str(e.k)]
            base = f"embmon_retrieval_{e.family}"
            help_text = ESTIMATE_HELP.get(e.family, e.family)
            family(base, help_text, ESTIMATE_LABELS).add_metric(labels, e.mean)
            family(f"{base}_ci_lower", f"Lower bound of the bootstrap interval of {base}.", ESTIMATE_LABELS).add_metric(
                labels, e.lower)
            family(f"{base}_ci_upper", f"Upper bound of the bootstrap interval of {base}.", ESTIMATE_LABELS).add_metric(
                labels, e.upper)
        for s in result.samples:
            if not math.isfinite(s.value):
                continue
            help_text, label_names = SAMPLE_SCHEMA[s.name]
            values = dict(s.labels)
            family(f"embmon_{s.name}", help_text, label_names).add_metric([values[n] for n in label_names], s.value)
    yield from by_name.values()
