"""The Grafana form: Grafana-managed alert rules in the alerting file-provisioning format.

Each rule queries the Prometheus datasource (``datasourceUid`` is an environment variable that
Grafana expands when it reads the file) for the same expressions as the Prometheus form, reduces
each to its last value and compares it with the same threshold: query A (the value) -> B = last(A)
-> C = threshold on B; a gated alert adds query F (the gate) -> G = last(F) and makes C the math
expression ``$B <op> <threshold> && $G <op> <threshold>``. Annotations are not expanded by the
provisioning loader, so ``{{ $labels.model }}`` is safe there; ``$value`` becomes
``$values.B.Value`` (Grafana's reference to the reduced value).
"""

from __future__ import annotations

import hashlib
from typing import Any

from monitor.artifacts.rules.model import Alert, Condition, RuleSet, description
from monitor.artifacts.rules.values import format_number

_EVALUATOR = {">": "gt", "<": "lt"}
VALUE_REF = "$values.B.Value"


def rule_uid(name: str) -> str:
    """Stable, short, Grafana-valid uid derived from the alert name."""
    return "embmon-" + hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest()[:12]


def _query(ref: str, expr: str, datasource_uid: str) -> dict[str, Any]:
    return {
        "refId": ref,
        "relativeTimeRange": {"from": 600, "to": 0},
        "datasourceUid": datasource_uid,
        "model": {
            "refId": ref,
            "expr": expr,
            "instant": True,
            "range": False,
            "editorMode": "code",
            "legendFormat": "__auto",
            "intervalMs": 1000,
            "maxDataPoints": 43200,
        },
    }


def _expression(ref: str, model: dict[str, Any]) -> dict[str, Any]:
    return {
        "refId": ref,
        "datasourceUid": "__expr__",
        "model": {"refId": ref, "datasource": {"type": "__expr__", "uid": "__expr__"}, **model},
    }


def _reduce(ref: str, source: str) -> dict[str, Any]:
    return _expression(ref, {"type": "reduce", "expression": source, "reducer": "last"})


def math_condition(alert: Alert) -> str:
    assert alert.gate is not None
    c, g = alert.condition, alert.gate
    return (
        f"$B {c.op} {format_number(c.threshold)} && $G {g.op} {format_number(g.threshold)}"
    )


def _threshold(ref: str, source: str, cond: Condition) -> dict[str, Any]:
    return _expression(
        ref,
        {
            "type": "threshold",
            "expression": source,
            "conditions": [
                {"evaluator": {"type": _EVALUATOR[cond.op], "params": [cond.threshold]}}
            ],
        },
    )


def grafana_rule(rules: RuleSet, alert: Alert) -> dict[str, Any]:
    uid = rules.thresholds.grafana.datasource_uid
    data = [_query("A", alert.condition.expr, uid), _reduce("B", "A")]
    if alert.gate is None:
        data.append(_threshold("C", "B", alert.condition))
    else:
        data += [
            _query("F", alert.gate.expr, uid),
            _reduce("G", "F"),
            _expression("C", {"type": "math", "expression": math_condition(alert)}),
        ]
    return {
        "uid": rule_uid(alert.name),
        "title": alert.name,
        "condition": "C",
        "data": data,
        "noDataState": "OK",  # a missing series is the Absent/Stale alerts' business
        "execErrState": "Error",
        "for": alert.for_,
        "labels": {"severity": alert.severity},
        "annotations": {
            "summary": alert.summary,
            "description": description(alert, VALUE_REF),
            "runbook_url": rules.runbook_link(alert),
        },
        "isPaused": False,
    }


def provisioning_file(rules: RuleSet) -> dict[str, Any]:
    g = rules.thresholds.grafana
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": g.org_id,
                "name": group,
                "folder": g.folder,
                "interval": g.interval,
                "rules": [grafana_rule(rules, a) for a in rules.alerts if a.group == group],
            }
            for group in rules.groups
        ],
    }
