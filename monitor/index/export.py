"""Metric families of the index probes, from the published snapshot (no arithmetic at scrape time).

Every name is declared in monitor/catalog/index.py and documented in docs/metrics.md
("Index probes").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from monitor import catalog
from monitor.index.probe import IndexResult

OUTCOMES = ("success", "partial", "failure", "timeout", "backoff")


@dataclass(frozen=True)
class IndexSnapshot:
    """Everything a scrape shows about the index probes; replaced whole after every cycle."""

    results: Mapping[str, IndexResult] = field(default_factory=dict)
    runs: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, outcome) -> cycles
    errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, reason) -> failures
    census_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, reason) -> censuses
    skipped: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, reason) -> queries
    searches: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, kind) -> searches
    rows_read: Mapping[str, int] = field(default_factory=dict)
    cpu_seconds: Mapping[str, float] = field(default_factory=dict)
    durations: Mapping[str, float] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)


def _finite(family: Metric, labels: list[str], value: float) -> None:
    if math.isfinite(value):
        family.add_metric(labels, float(value))  # type: ignore[attr-defined]


def families(snapshot: IndexSnapshot, probes: Iterable[str]) -> Iterable[Metric]:
    names = list(probes)
    runs = catalog.counter("embmon_index_probe_runs_total")
    for probe in names:
        for outcome in OUTCOMES:
            runs.add_metric([probe, outcome], float(snapshot.runs.get((probe, outcome), 0)))
    yield runs
    for name, values in (("embmon_index_errors_total", snapshot.errors),
                         ("embmon_index_census_errors_total", snapshot.census_errors),
                         ("embmon_index_queries_skipped_total", snapshot.skipped),
                         ("embmon_index_searches_total", snapshot.searches)):
        family = catalog.counter(name)
        for (probe, label), count in sorted(values.items()):
            family.add_metric([probe, label], float(count))
        yield family
    for name, per_probe in (("embmon_index_rows_read_total", snapshot.rows_read),
                            ("embmon_index_probe_cpu_seconds_total", snapshot.cpu_seconds)):
        counter = catalog.counter(name)
        for probe in names:
            counter.add_metric([probe], float(per_probe.get(probe, 0)))
        yield counter
    for name, per_probe in (("embmon_index_probe_duration_seconds", snapshot.durations),
                            ("embmon_index_probe_last_success_timestamp_seconds", snapshot.last_success)):
        gauge = catalog.gauge(name)
        for probe in names:
            if probe in per_probe:
                gauge.add_metric([probe], float(per_probe[probe]))
        yield gauge
    yield from _results(snapshot.results)


def _results(results: Mapping[str, IndexResult]) -> Iterable[Metric]:
    g = {name: catalog.gauge(name) for name, spec in catalog.CATALOG.items()
         if spec.area == "index" and spec.kind == "gauge" and "probe_" not in name}
    for probe, result in sorted(results.items()):
        model, k = result.model, str(result.k)
        pm = [probe, model]
        for row in result.recall.rows:
            labels = [probe, model, row.scope, k]
            _finite(g["embmon_index_recall_ratio"], labels, row.recall.mean)
            _finite(g["embmon_index_recall_lower_ratio"], labels, row.recall.lower)
            _finite(g["embmon_index_recall_upper_ratio"], labels, row.recall.upper)
            _finite(g["embmon_index_recall_p5_ratio"], labels, row.p5)
            _finite(g["embmon_index_recall_p10_ratio"], labels, row.p10)
            _finite(g["embmon_index_epsilon_recall_ratio"], labels, row.epsilon_recall)
            _finite(g["embmon_index_distance_inflation"], labels, row.distance_ratio)
            _finite(g["embmon_index_under_return_ratio"], labels, row.under_return)
            g["embmon_index_queries"].add_metric([probe, model, row.scope], float(row.queries))
            if row.scope not in ("all", "other"):
                g["embmon_index_scope_flagged"].add_metric(
                    [probe, model, row.scope], 1.0 if row.scope in result.recall.flagged else 0.0)
        if result.recall.rows:
            g["embmon_index_scopes_hidden"].add_metric(pm, float(result.recall.scopes_hidden))
        for part, value in sorted(result.recall.loss.items()):
            _finite(g["embmon_index_recall_loss_ratio"], [*pm, part], value)
        census = result.census
        if census is None:
            continue
        g["embmon_index_rows"].add_metric(pm, float(census.rows))
        g["embmon_index_census_ids"].add_metric(pm, float(census.sampled))
        if census.sampled:
            _finite(g["embmon_index_stale_ratio"], pm, census.stale.mean)
            _finite(g["embmon_index_stale_lower_ratio"], pm, census.stale.lower)
            _finite(g["embmon_index_stale_upper_ratio"], pm, census.stale.upper)
            for i, share in enumerate(census.generation_shares):
                g["embmon_index_generation_share_ratio"].add_metric(
                    [*pm, "current" if i == 0 else f"stale_{i}"], share)
        if census.checked_for_missing:
            g["embmon_index_missing_ratio"].add_metric(pm, census.missing / census.checked_for_missing)
        if census.checked_for_orphans:
            g["embmon_index_orphan_ratio"].add_metric(pm, census.orphans / census.checked_for_orphans)
        for kind, share in sorted(census.degenerate.items()):
            _finite(g["embmon_index_degenerate_ratio"], [*pm, kind], share)
        _finite(g["embmon_index_hubness_skewness"], pm, census.hubness)
        _finite(g["embmon_index_hub_occurrence_ratio"], pm, census.hub_occurrence)
    yield from g.values()
