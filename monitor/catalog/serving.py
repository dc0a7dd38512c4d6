"""The serving probe: active canaries and conformance checks against the embedding endpoint.

One row per metric; docs/metrics.md defines each (formula, good and bad values)."""

from __future__ import annotations

from monitor.catalog.metric_spec import MetricSpec

AREA = "serving"
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("embmon_serving_requests_total", "counter",
        "Embedding requests the serving probe sent to the endpoint.",
        labels=("model",), code="monitor.serving.component:ServingComponent._cycle"),
    MetricSpec("embmon_serving_errors_total", "counter",
        "Serving-probe requests that failed, by reason (connect, timeout, rate_limited, auth, http_error, html, "
        "not_json, bad_response, ragged, oversized, encoder, redirect). 0 when healthy.",
        labels=("model", "reason"), code="monitor.serving.component:ServingComponent._cycle"),
    MetricSpec("embmon_serving_invalid_vectors_total", "counter",
        "Vectors the endpoint returned that cannot be used, by reason (empty, zero, non_finite, wrong_dimension). 0 "
        "when healthy.",
        labels=("model", "reason"), code="monitor.serving.responses:check_rows"),
    MetricSpec("embmon_serving_cycles_total", "counter",
        "Serving-probe cycles by outcome (ok; failed: a request failed; skipped: backing off).",
        labels=("model", "outcome"), code="monitor.serving.component:ServingComponent._cycle"),
    MetricSpec("embmon_serving_deviation", "gauge",
        "The last cycle's statistic of each conformance check: 1 - cos (repeat, batch, neighbour), its change from the"
        " pins (case, whitespace, prefix), or a relative norm change (norm). 0 = conformant.",
        labels=("model", "check"), code="monitor.serving.probe:run_cycle"),
    MetricSpec("embmon_serving_tolerance", "gauge",
        "The tolerance each conformance check's deviation is compared with.",
        labels=("model", "check"), code="monitor.serving.probe:tolerance"),
    MetricSpec("embmon_serving_violations_total", "counter",
        "Serving-probe cycles in which a conformance check failed, by check. 0 when healthy.",
        labels=("model", "check"), code="monitor.serving.probe:violations"),
    MetricSpec("embmon_serving_collisions", "gauge",
        "Pairs of distinct canary texts (or of their upper-cased forms) with identical vectors in the last cycle. 0 "
        "when healthy.",
        labels=("model",), code="monitor.serving.probe:collisions"),
    MetricSpec("embmon_serving_latency_median_seconds", "gauge",
        "Median latency of the last cycle's requests.",
        labels=("model",), unit="seconds", code="monitor.serving.probe:run_cycle"),
    MetricSpec("embmon_serving_latency_max_seconds", "gauge",
        "Slowest request of the last cycle.",
        labels=("model",), unit="seconds", code="monitor.serving.probe:run_cycle"),
    MetricSpec("embmon_serving_request_duration_seconds", "histogram",
        "Wall time of each successful serving-probe request, in OpenTelemetry's gen_ai.client.operation.duration "
        "buckets.",
        labels=("model",), unit="seconds", code="monitor.serving.component:ServingComponent._cycle"),
    MetricSpec("embmon_serving_last_success_timestamp_seconds", "gauge",
        "When a serving-probe cycle of the model last completed without a failed request.",
        labels=("model",), unit="seconds", code="monitor.serving.component:ServingComponent._cycle"),
    MetricSpec("embmon_serving_backoff_seconds", "gauge",
        "How much longer than its interval the probe waits before it tries the endpoint again (0 when healthy).",
        labels=("model",), unit="seconds", code="monitor.serving.component:ServingComponent._cycle"),
)
