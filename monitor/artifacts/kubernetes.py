"""Kubernetes objects generated from the rules and dashboards (prometheus-operator, Grafana sidecar)."""

from __future__ import annotations

import json
from typing import Any

from monitor.artifacts.prometheus import rule_file
from monitor.artifacts.rules.model import RuleSet

APP_LABELS = {"app.kubernetes.io/name": "embedding-monitor", "app.kubernetes.io/part-of": "embedding-monitor"}


def prometheus_rule(rules: RuleSet) -> dict[str, Any]:
    """A ``monitoring.coreos.com/v1`` PrometheusRule with exactly the groups of the rule file."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "embedding-monitor",
            "labels": {**APP_LABELS, "role": "alert-rules"},
        },
        "spec": rule_file(rules),
    }


def dashboards_configmap(dashboards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One ConfigMap the Grafana sidecar picks up (label ``grafana_dashboard: "1"``).

    Each board is compact JSON (one line): ``kubectl apply`` keeps the whole object in an annotation limited
    to 256 KiB, which the five boards indented would pass. The indented boards are in dashboards/."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "embedding-monitor-dashboards",
            "labels": {**APP_LABELS, "grafana_dashboard": "1"},
            # kiwigrid/k8s-sidecar (the Grafana chart's sidecar) puts them in this folder
            "annotations": {"grafana_folder": "Embedding monitor"},
        },
        "data": {f"{stem}.json": json.dumps(model, separators=(",", ":"), ensure_ascii=False) + "\n"
                 for stem, model in sorted(dashboards.items())},
    }
