"""promtool unit tests generated from each alert's scenario, and recording-rule tests.

Per alert: one evaluation interval before the ``for:`` boundary nothing fires (the alert is
pending), at the boundary it fires with exact labels and annotations, and a similar history that
must stay quiet does not fire at the boundary.
"""

from __future__ import annotations

from typing import Any

from monitor.artifacts.rules import (
    RECORDING_GROUP,
    RULES_FILE,
    TEST_INSTANCE,
    TEST_MODEL,
    TEST_PROBE,
    Alert,
    RuleSet,
    Series,
    render_description,
)


def _duration(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _series(items: tuple[Series, ...]) -> list[dict[str, str]]:
    return [{"series": s.selector(), "values": s.values} for s in items]


def alert_test_file(rules: RuleSet, alert: Alert) -> dict[str, Any]:
    sc = alert.scenario()
    if alert.for_seconds % sc.step or sc.onset % sc.step:
        raise ValueError(f"{alert.name}: `for` and onset must be multiples of the test step {sc.step}s")
    fire = sc.onset + alert.for_seconds
    labels = {**sc.labels, "severity": alert.severity}
    annotations = {
        "summary": alert.summary,
        "description": render_description(alert, sc.labels, sc.value),
        "runbook_url": rules.runbook_link(alert),
    }
    return {
        "rule_files": [f"../{RULES_FILE}"],
        "evaluation_interval": _duration(sc.step),
        # promtool evaluates groups in random order unless told: recorded series first
        "group_eval_order": [RECORDING_GROUP, *rules.groups],
        "tests": [
            {
                "name": f"{alert.name}: quiet one interval before for, fires at it",
                "interval": _duration(sc.step),
                "input_series": _series(sc.firing),
                "alert_rule_test": [
                    {"eval_time": _duration(fire - sc.step), "alertname": alert.name, "exp_alerts": []},
                    {
                        "eval_time": _duration(fire),
                        "alertname": alert.name,
                        "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                    },
                ],
            },
            {
                "name": f"{alert.name}: negative case stays quiet",
                "interval": _duration(sc.step),
                "input_series": _series(sc.quiet),
                "alert_rule_test": [
                    {"eval_time": _duration(fire), "alertname": alert.name, "exp_alerts": []},
                ],
            },
        ],
    }


def _sample(name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    inner = ", ".join([f'__name__="{name}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return {"labels": "{" + inner + "}", "value": value}


def recording_test_file(rules: RuleSet) -> dict[str, Any]:
    """Every recording rule evaluated on a small history with hand-computed results."""
    job = rules.thresholds.job
    base = {"job": job, "instance": TEST_INSTANCE}
    w = rules.thresholds.baseline_window
    series: list[dict[str, str]] = []
    exprs: list[dict[str, Any]] = []
    # intrinsic: two instances of one (model, stream); 2 h healthy, then 1 h at a quarter.
    # At 3h: avg of the two instances = 0.25; median over the window = healthy (0.5); ratio 0.5.
    for metric in (
        "embmon_partition_isotropy",
        "embmon_effective_dimension_ratio",
        "embmon_mean_cosine_similarity",
        "embmon_effective_rank",
        "embmon_top10_variance_ratio",
    ):
        for instance, healthy, bad in (("a:9464", 0.25, 0.125), ("b:9464", 0.75, 0.375)):
            series.append(
                {
                    "series": Series(metric, {**base, "instance": instance, **TEST_MODEL}, "").selector(),
                    "values": f"{healthy}x119 {bad}x60",
                }
            )
        exprs.append({"expr": f"model_stream:{metric}:avg", "eval_time": "3h",
                      "exp_samples": [_sample(f"model_stream:{metric}:avg", TEST_MODEL, 0.25)]})
        exprs.append({"expr": f"model_stream:{metric}:median{w}", "eval_time": "3h",
                      "exp_samples": [_sample(f"model_stream:{metric}:median{w}", TEST_MODEL, 0.5)]})
        if metric == "embmon_mean_cosine_similarity":
            name = f"model_stream:{metric}:delta_median{w}"
            exprs.append({"expr": name, "eval_time": "3h", "exp_samples": [_sample(name, TEST_MODEL, -0.25)]})
        elif metric != "embmon_top10_variance_ratio":
            name = f"model_stream:{metric}:ratio_median{w}"
            exprs.append({"expr": name, "eval_time": "3h", "exp_samples": [_sample(name, TEST_MODEL, 0.5)]})
    # invalid records: 1/s invalid for two reasons, 6/s valid over two models -> 2 / 8 = 0.25;
    # a stream with only invalid records has ratio 1.
    series += [
        {"series": Series("embmon_records_invalid_total", {**base, "stream": "queries", "reason": "bad_dimension"}, "").selector(), "values": "0+60x30"},
        {"series": Series("embmon_records_invalid_total", {**base, "stream": "queries", "reason": "not_finite"}, "").selector(), "values": "0+60x30"},
        {"series": Series("embmon_records_total", {**base, "model": "minilm", "stream": "queries"}, "").selector(), "values": "0+240x30"},
        {"series": Series("embmon_records_total", {**base, "model": "e5", "stream": "queries"}, "").selector(), "values": "0+120x30"},
        {"series": Series("embmon_records_invalid_total", {**base, "stream": "broken", "reason": "bad_json"}, "").selector(), "values": "0+60x30"},
    ]
    name = "stream:embmon_records_invalid:ratio_rate10m"
    exprs.append({"expr": name, "eval_time": "20m", "exp_samples": [
        _sample(name, {"stream": "broken"}, 1), _sample(name, {"stream": "queries"}, 0.25)]})
    # probe runs: 1 failure + 1 timeout per minute against 2 successes -> 0.5
    for outcome, rate in (("success", 2), ("failure", 1), ("timeout", 1)):
        series.append({"series": Series("embmon_probe_runs_total", {**base, "probe": "golden", "outcome": outcome}, "").selector(), "values": f"0+{rate}x60"})
    name = "probe:embmon_probe_runs_failed:ratio_rate30m"
    exprs.append({"expr": name, "eval_time": "45m", "exp_samples": [_sample(name, {"probe": "golden"}, 0.5)]})
    # retrieval: the hourly average of two instances' probe results
    probe = {k: v for k, v in TEST_PROBE.items()}
    for metric in rules.thresholds.retrieval_objectives:
        full = f"embmon_retrieval_{metric}"
        series.append({"series": Series(full, {**base, "instance": "a:9464", **probe}, "").selector(), "values": "0.5x181"})
        series.append({"series": Series(full, {**base, "instance": "b:9464", **probe}, "").selector(), "values": "0.75x119 0.25x61"})
        name = f"probe_model_slice_k:{full}:avg1h"
        # at 3h: instance a averages 0.5, instance b's last hour is all 0.25 -> 0.375
        exprs.append({"expr": name, "eval_time": "3h", "exp_samples": [_sample(name, probe, 0.375)]})
    covered = {e["expr"] for e in exprs}
    missing = [r.record for r in rules.recording if r.record not in covered]
    if missing:
        raise ValueError(f"recording rules without a promql_expr_test: {missing}")
    return {
        "rule_files": [f"../{RULES_FILE}"],
        "evaluation_interval": "1m",
        "tests": [{"name": "recording rules", "interval": "1m", "input_series": series,
                   "promql_expr_test": exprs}],
    }


def test_file_name(alert: Alert) -> str:
    return f"{alert.name}.yaml"
