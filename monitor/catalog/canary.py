"""Canaries: pinned records whose vectors must not change.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MetricSpec

AREA = "canary"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_canary_cosine_min", "gauge",
        "Lowest cosine between a canary's embedding and its pinned vector over the window (1 = unchanged).",
        labels=("model",), code="monitor.canary.component:CanaryComponent.publish"),
    MetricSpec("embmon_canary_mismatches_total", "counter",
        "Canary records whose cosine to their pin fell below 1 - canaries.tolerance (the model changed).",
        labels=("model",), code="monitor.canary.component:CanaryComponent.on_embeddings"),
    MetricSpec("embmon_canary_records_total", "counter",
        "Canary records compared with their pinned vector.",
        labels=("model",), code="monitor.canary.component:CanaryComponent.on_embeddings"),
    MetricSpec("embmon_canary_pins", "gauge",
        "Canary ids of the model with a pinned vector.",
        labels=("model",), code="monitor.canary.component:CanaryComponent.publish"),
    MetricSpec("embmon_canary_last_seen_timestamp_seconds", "gauge",
        "When a canary record of the model last arrived.",
        labels=("model",), unit="seconds", code="monitor.canary.component:CanaryComponent.on_embeddings"),
)
