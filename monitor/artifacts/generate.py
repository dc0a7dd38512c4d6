"""Render every generated artifact and write (or check) them; :mod:`monitor.artifacts.command` runs this."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from monitor.artifacts import dashboards as dash
from monitor.artifacts import grafana_alerts, kubernetes, prometheus, unittests
from monitor.artifacts._io import to_json, to_yaml
from monitor.artifacts.rules import build_rules
from monitor.artifacts.rules.model import DEFAULT_RUNBOOK, RULES_FILE, RuleSet
from monitor.artifacts.thresholds import Thresholds

GRAFANA_ALERTS = "alerts/grafana/embedding-monitor-alerts.yaml"
PROMETHEUS_RULES = f"alerts/{RULES_FILE}"
PROMETHEUS_RULE_CR = "deploy/kubernetes/generated/prometheusrule.yaml"
DASHBOARDS_CONFIGMAP = "deploy/kubernetes/generated/grafana-dashboards-configmap.yaml"
THRESHOLDS_DEFAULTS = "alerts/thresholds.defaults.yaml"
# (folder, suffix) pairs the generator owns: stale files there are removed on write
MANAGED = (("alerts/tests", ".yaml"), ("alerts/grafana", ".yaml"), ("dashboards", ".json"),
           ("deploy/kubernetes/generated", ".yaml"))


def thresholds_defaults(rules: RuleSet) -> dict[str, Any]:
    """A thresholds file listing every knob at its current value (loading it changes nothing)."""
    th = rules.thresholds
    data = th.model_dump(mode="json", by_alias=True, exclude={"alerts"})
    data["alerts"] = {
        a.name: {
            "enabled": a.enabled,
            "threshold": a.condition.threshold,
            "for": a.for_,
            "severity": a.severity,
        }
        for a in rules.all_alerts
    }
    return data


def render(th: Thresholds | None = None, runbook_url: str = DEFAULT_RUNBOOK) -> dict[str, str]:
    """Relative path -> file text, for every generated artifact."""
    rules = build_rules(th, runbook_url)
    files: dict[str, str] = {
        PROMETHEUS_RULES: to_yaml(prometheus.rule_file(rules)),
        GRAFANA_ALERTS: to_yaml(grafana_alerts.provisioning_file(rules)),
        "alerts/tests/recording-rules.yaml": to_yaml(unittests.recording_test_file(rules)),
        THRESHOLDS_DEFAULTS: to_yaml(
            thresholds_defaults(rules),
            header="Every alert threshold at its current value; copy, edit, then run "
            "`embedding-monitor artifacts --thresholds FILE --out DIR`.",
        ),
    }
    for alert in rules.alerts:
        files[f"alerts/tests/{unittests.test_file_name(alert)}"] = to_yaml(unittests.alert_test_file(rules, alert))
    boards = dash.all_dashboards(rules)
    for stem, model in boards.items():
        files[f"dashboards/{stem}.json"] = to_json(model)
    files[PROMETHEUS_RULE_CR] = to_yaml(kubernetes.prometheus_rule(rules))
    files[DASHBOARDS_CONFIGMAP] = to_yaml(kubernetes.dashboards_configmap(boards))
    return dict(sorted(files.items()))


def _stale(out: Path, files: dict[str, str]) -> list[Path]:
    stale = []
    for folder, suffix in MANAGED:
        for path in sorted((out / folder).glob(f"*{suffix}")):
            if path.relative_to(out).as_posix() not in files:
                stale.append(path)
    return stale


def _differing(out: Path, files: dict[str, str]) -> Iterator[tuple[str, Path, str | None]]:
    """(relative path, path, text there or ``None`` when missing) of each file that differs under ``out``."""
    for rel, text in files.items():
        path = out / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            yield rel, path, current


def write(out: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` under ``out``; remove stale files in the managed folders. Returns changed paths."""
    changed: list[Path] = []
    for rel, path, _ in _differing(out, files):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
        changed.append(path)
    for path in _stale(out, files):
        path.unlink()
        changed.append(path)
    return changed


def check(out: Path, files: dict[str, str]) -> list[str]:
    """Differences between ``files`` and what is under ``out`` (unified diffs / stale notes)."""
    problems: list[str] = []
    for rel, _, current in _differing(out, files):
        problems.append("".join(difflib.unified_diff(
            (current or "").splitlines(True), files[rel].splitlines(True), f"{rel} (committed)", f"{rel} (generated)",
            n=1)))
    problems += [f"{p.relative_to(out)}: stale generated file" for p in _stale(out, files)]
    return problems


__all__ = ["check", "render", "write"]
