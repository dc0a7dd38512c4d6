"""The Prometheus form: a rule file with recording and alerting rules."""

from __future__ import annotations

from typing import Any

from monitor.artifacts.rules.model import RECORDING_GROUP, Alert, RuleSet, description


def alert_rule(rules: RuleSet, alert: Alert) -> dict[str, Any]:
    return {
        "alert": alert.name,
        "expr": alert.promql(),
        "for": alert.for_,
        "labels": {"severity": alert.severity},
        "annotations": {
            "summary": alert.summary,
            "description": description(alert),
            "runbook_url": rules.runbook_link(alert),
        },
    }


def rule_file(rules: RuleSet) -> dict[str, Any]:
    groups: list[dict[str, Any]] = [
        {
            "name": RECORDING_GROUP,
            "rules": [{"record": r.record, "expr": r.expr} for r in rules.recording],
        }
    ]
    for group in rules.groups:
        groups.append(
            {
                "name": group,
                "rules": [alert_rule(rules, a) for a in rules.alerts if a.group == group],
            }
        )
    return {"groups": groups}
