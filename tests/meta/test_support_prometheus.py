"""The Prometheus/Alertmanager test helpers themselves, against the real binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.prometheus import AlertmanagerServer, PrometheusServer, PromQLError, WebhookReceiver
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prometheus


@pytest.mark.slow  # over 5 s on the idle 2-core machine (.cache/test-durations.json)
def test_prometheus_scrapes_itself_and_answers_queries(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: self\n  rules:\n"
        "  - record: job:up:sum\n    expr: sum by (job) (up)\n"
        "  - alert: SelfScrapeWorks\n    expr: up == 1\n    for: 0s\n"
    )
    with PrometheusServer.start(tmp_path, self_scrape=True, rule_files=[rules]) as prom:
        assert prom.address.startswith("127.0.0.1:")
        up = prom.wait_until(lambda: prom.query('up{job="prometheus"}'), message="the first self-scrape")
        assert up[0]["metric"]["instance"] == prom.address
        assert up[0]["value"][1] == "1"
        # a scalar result is returned as one sample
        assert prom.query("1 + 1")[0]["value"][1] == "2"
        # rules are loaded and evaluated
        recorded = prom.wait_until(lambda: prom.query('job:up:sum{job="prometheus"}'), message="recording rule")
        assert recorded[0]["value"][1] == "1"
        firing = prom.wait_until(lambda: [a for a in prom.alerts() if a["state"] == "firing"], message="alert")
        assert firing[0]["labels"]["alertname"] == "SelfScrapeWorks"
        assert [t["health"] for t in prom.targets()] == ["up"]
        with pytest.raises(PromQLError, match="bad_data"):
            prom.query("sum(")
        process = prom.proc.process
    # stopped cleanly by the context manager (SIGTERM -> exit 0)
    assert process is not None and process.returncode == 0


@pytest.mark.slow
def test_alertmanager_delivers_to_the_webhook(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: page\n  rules:\n"
        "  - alert: AlwaysFiring\n    expr: vector(1)\n    for: 0s\n"
        "    labels: {severity: critical}\n    annotations: {summary: it works}\n"
    )
    with (
        WebhookReceiver.start() as hook,
        AlertmanagerServer.start(tmp_path, hook.url) as am,
        PrometheusServer.start(tmp_path, rule_files=[rules], alertmanager=am.address) as prom,
    ):
        received = wait_until(hook.alerts, timeout=30, message="a webhook notification",
                              on_timeout=lambda: prom.log_tail() + "\n" + am.log_tail())
        assert received[0]["labels"] == {"alertname": "AlwaysFiring", "severity": "critical"}
        assert received[0]["annotations"] == {"summary": "it works"}
        assert received[0]["status"] == "firing"
        assert [a["labels"]["alertname"] for a in am.alerts()] == ["AlwaysFiring"]

