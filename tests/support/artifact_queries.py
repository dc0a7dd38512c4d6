"""Every query the generated artifacts send to Prometheus, as the live tests run them.

Dashboard panels, annotations and variables, rule expressions, alert signals and Grafana rule
queries, with Grafana's variables substituted (``tests/test_prometheus_live.py`` and
``tests/test_prometheus_live_scaleout.py`` run them against a real Prometheus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from monitor.artifacts import dashboards as dash
from monitor.artifacts import grafana_alerts, panels, prometheus
from monitor.artifacts.catalog import referenced_metrics
from monitor.artifacts.rules import build_rules
from tests.support.prometheus import PrometheusServer


def substitute(expr: str) -> str:
    """A dashboard/alert query as Grafana or Prometheus would send it, for a few minutes of data."""
    for var in ("model", "stream", "probe", "slice", "k"):
        expr = expr.replace(f"${var}", ".+")
    expr = expr.replace("$__rate_interval", "5s").replace("$__interval", "5s")
    return expr


def shorten_history(expr: str) -> str:
    """Week-over-week comparisons need a week of data: compare with a few seconds ago instead."""
    return expr.replace("offset 1w", "offset 3s")


@dataclass(frozen=True)
class Query:
    origin: str
    expr: str
    must_return: bool  # False: parse only (a threshold comparison may legitimately be empty)


def all_queries() -> list[Query]:
    rules = build_rules()
    out: list[Query] = []
    for stem, board in dash.all_dashboards(rules).items():
        for title, expr in panels.panel_queries(board):
            out.append(Query(f"dashboard {stem} / {title}", expr, True))
        for ann in board["annotations"]["list"]:
            if "expr" in ann:
                out.append(Query(f"dashboard {stem} annotation {ann['name']}", ann["expr"], False))
                out.append(Query(f"dashboard {stem} annotation {ann['name']} (signal)",
                                 ann["expr"].removesuffix(" > 0"), True))
        for var in board["templating"]["list"]:
            if var["type"] == "query":  # label_values(<selector>, label): the selector must match
                selector = re.fullmatch(r"label_values\((.+), \w+\)", var["query"]["query"])
                assert selector, var["query"]["query"]
                out.append(Query(f"dashboard {stem} variable {var['name']}", selector.group(1), True))
    for group in prometheus.rule_file(rules)["groups"]:
        for rule in group["rules"]:
            name = rule.get("record") or rule["alert"]
            out.append(Query(f"rule {name}", rule["expr"], "record" in rule))
    for alert in rules.alerts:
        for signal in alert.signals():
            out.append(Query(f"rule {alert.name} (signal)", signal, True))
    for group in grafana_alerts.provisioning_file(rules)["groups"]:
        for rule in group["rules"]:
            for data in rule["data"]:
                if data["datasourceUid"] != "__expr__":
                    must = not rule["title"].endswith("Absent")  # absent() is empty while all is well
                    out.append(Query(f"grafana {rule['title']} {data['refId']}", data["model"]["expr"], must))
    return out


_RECORDED = re.compile(r"[a-z_]+:embmon_[a-z0-9_]+:[a-z0-9_]+")


def sources(expr: str) -> set[str]:
    """Metric names an expression reads, through the recording rules it uses."""
    records = {r.record: r.expr for r in build_rules().recording}
    names = referenced_metrics(expr)
    for recorded in _RECORDED.findall(expr):
        names |= sources(records[recorded]) if recorded in records else set()
    return names


def unanswered(prom: PrometheusServer, queries: list[Query]) -> list[tuple[Query, str]]:
    """Run every query as the live tests send it (a parse or evaluation error raises); the ones that
    must return series and returned none, each with the expression sent."""
    empty = []
    for q in queries:
        expr = shorten_history(substitute(q.expr))
        if not prom.query(expr) and q.must_return:
            empty.append((q, expr))
    return empty
