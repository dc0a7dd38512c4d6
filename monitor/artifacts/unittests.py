"""promtool unit tests generated from each alert's scenario, and recording-rule tests.

Per alert: one evaluation interval before the ``for:`` boundary nothing fires (the alert is
pending), at the boundary it fires with exact labels and annotations, where the scenario says so
it resolves once its history clears the condition, and a similar history that must stay quiet
does not fire at the boundary; where the scenario gives one, the firing history as several
instances export it fires one alert, not one per instance.
"""

from __future__ import annotations

import copy
from typing import Any

from monitor.artifacts.rules.model import RECORDING_GROUP, RULES_FILE, Alert, RuleSet, Series, render_description
from monitor.artifacts.rules.recording import INTRINSIC_BASELINES, INVALID_RECORDS_RATIO, PROBE_FAILED_RATIO, recorded
from monitor.artifacts.rules.scenarios import TEST_INSTANCE, TEST_MODEL, TEST_PROBE


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
    if sc.resolves_at is not None and (sc.resolves_at <= fire or sc.resolves_at % sc.step):
        raise ValueError(f"{alert.name}: resolves_at must be a step multiple after the firing boundary {fire}s")
    labels = {**sc.labels, "severity": alert.severity}
    annotations = {
        "summary": alert.summary,
        "description": render_description(alert, sc.labels, sc.value),
        "runbook_url": rules.runbook_link(alert),
    }
    fires_at = [
        {"eval_time": _duration(fire - sc.step), "alertname": alert.name, "exp_alerts": []},
        {
            "eval_time": _duration(fire),
            "alertname": alert.name,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
        },
    ]
    scaled = [] if not sc.scaled else [{
        # exp_alerts is the whole set: one alert per instance would fail it
        "name": f"{alert.name}: scaled out, several instances' series fire one alert",
        "interval": _duration(sc.step),
        "input_series": _series(sc.scaled),
        "alert_rule_test": copy.deepcopy(fires_at),  # a copy: YAML would write anchors for a shared object
    }]
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
                "alert_rule_test": [*fires_at, *_resolved(alert, sc.resolves_at)],
            },
            {
                "name": f"{alert.name}: negative case stays quiet",
                "interval": _duration(sc.step),
                "input_series": _series(sc.quiet),
                "alert_rule_test": [
                    {"eval_time": _duration(fire), "alertname": alert.name, "exp_alerts": []},
                ],
            },
            *scaled,
        ],
    }


def _resolved(alert: Alert, at: int | None) -> list[dict[str, Any]]:
    """The checkpoint where the firing history has cleared the condition (none when it never does)."""
    return [] if at is None else [{"eval_time": _duration(at), "alertname": alert.name, "exp_alerts": []}]


def _sample(name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    inner = ", ".join([f'__name__="{name}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return {"labels": "{" + inner + "}", "value": value}


def _input(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": Series(metric, labels, "").selector(), "values": values}


def _expect(record: str, eval_time: str, *samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    """A ``promql_expr_test`` of a recorded series: its samples (labels, value) at ``eval_time``."""
    return {"expr": record, "eval_time": eval_time,
            "exp_samples": [_sample(record, labels, value) for labels, value in samples]}


def recording_test_file(rules: RuleSet) -> dict[str, Any]:
    """Every recording rule evaluated on a small history with hand-computed results."""
    job = rules.thresholds.job
    base = {"job": job, "instance": TEST_INSTANCE}
    w = rules.thresholds.baseline_window
    series: list[dict[str, str]] = []
    exprs: list[dict[str, Any]] = []
    # intrinsic: two instances of one (model, stream); 2 h healthy, then 1 h at a quarter.
    # At 3h: avg of the two instances = 0.25; median over the window = healthy (0.5); ratio 0.5.
    for name, comparison in INTRINSIC_BASELINES.items():
        metric = f"embmon_{name}"
        for instance, healthy, bad in (("a:9464", 0.25, 0.125), ("b:9464", 0.75, 0.375)):
            series.append(_input(metric, {**base, "instance": instance, **TEST_MODEL}, f"{healthy}x119 {bad}x60"))
        exprs.append(_expect(recorded(metric, "avg"), "3h", (TEST_MODEL, 0.25)))
        exprs.append(_expect(recorded(metric, f"median{w}"), "3h", (TEST_MODEL, 0.5)))
        if comparison == "delta":
            exprs.append(_expect(recorded(metric, f"delta_median{w}"), "3h", (TEST_MODEL, -0.25)))
        elif comparison == "ratio":
            exprs.append(_expect(recorded(metric, f"ratio_median{w}"), "3h", (TEST_MODEL, 0.5)))
    # invalid records: 1/s invalid for two reasons, 6/s valid over two models -> 2 / 8 = 0.25;
    # a stream with only invalid records has ratio 1.
    series += [
        _input("embmon_records_invalid_total", {**base, "stream": "queries", "reason": "bad_dimension"}, "0+60x30"),
        _input("embmon_records_invalid_total", {**base, "stream": "queries", "reason": "not_finite"}, "0+60x30"),
        _input("embmon_records_total", {**base, "model": "minilm", "stream": "queries"}, "0+240x30"),
        _input("embmon_records_total", {**base, "model": "e5", "stream": "queries"}, "0+120x30"),
        _input("embmon_records_invalid_total", {**base, "stream": "broken", "reason": "bad_json"}, "0+60x30"),
    ]
    exprs.append(_expect(INVALID_RECORDS_RATIO, "20m", ({"stream": "broken"}, 1), ({"stream": "queries"}, 0.25)))
    # probe runs: 1 failure + 1 timeout per minute against 2 successes -> 0.5
    for outcome, rate in (("success", 2), ("failure", 1), ("timeout", 1)):
        series.append(
            _input("embmon_probe_runs_total", {**base, "probe": "golden", "outcome": outcome}, f"0+{rate}x60")
        )
    exprs.append(_expect(PROBE_FAILED_RATIO, "45m", ({"probe": "golden"}, 0.5)))
    # retrieval: the hourly average of two instances' probe results
    for metric in rules.thresholds.retrieval_objectives:
        full = f"embmon_retrieval_{metric}"
        series.append(_input(full, {**base, "instance": "a:9464", **TEST_PROBE}, "0.5x181"))
        series.append(_input(full, {**base, "instance": "b:9464", **TEST_PROBE}, "0.75x119 0.25x61"))
        # at 3h: instance a averages 0.5, instance b's last hour is all 0.25 -> 0.375
        exprs.append(_expect(recorded(full, "avg1h", "probe_model_slice_k"), "3h", (TEST_PROBE, 0.375)))
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
