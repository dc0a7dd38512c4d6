"""The generated alerts and dashboards against a real Prometheus scraping a running daemon.

One daemon (synthetic source: healthy -> a burst of invalid records -> healthy -> collapsed), one
Prometheus (1 s scrape and evaluation, the generated rules with the collapse alert's ``for``
shortened to 2 s) and one Alertmanager notifying a webhook in this process serve the module:

* every dashboard panel query (variables substituted), every Prometheus rule expression and every
  Grafana alert-rule query parses, and returns at least one series when the metrics it reads
  are exported by the daemon;
* every metric the artifacts use is exported, except those listed below with the reason;
* the scripted collapse pages: EmbeddingMonitorCollapse reaches the webhook with its labels and
  rendered annotations, and nothing critical arrives before the collapse.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from monitor.artifacts import dashboards as dash
from monitor.artifacts import grafana_alerts, panels, prometheus
from monitor.artifacts.catalog import METRICS, exported_names, referenced_metrics
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds
from monitor.retrieval.families import PROBE_METRIC_FAMILIES
from tests.support import daemons
from tests.support.artifact_queries import all_queries, sources, substitute, unanswered
from tests.support.broker import free_port
from tests.support.daemons import DaemonProcess
from tests.support.prometheus import AlertmanagerServer, PrometheusServer, PromQLError, WebhookReceiver
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prometheus

JOB = "embedding-monitor"
MODEL, STREAM = "minilm-live", "documents"
HEALTHY_SECONDS = 20.0  # healthy (8 s) + invalid burst (2 s) + healthy (10 s), then collapsed
SCALE_OUT_METRICS = {name for name, spec in METRICS.items() if spec.area == "scale_out"}
CANARIES = [f"canary-{i}" for i in range(3)]

# Metrics the artifacts use that this synthetic set-up cannot produce, by design.
NOT_FROM_SYNTHETIC = {
    "embmon_consumer_lag_records": "Kafka source only",
    "embmon_source_last_progress_timestamp_seconds": "Kafka source only (one series per topic)",
    "embmon_source_errors_total": "Kafka source only (a series once a read fails)",
    "embmon_alignment": "needs records sharing a pair_id",
    # the serving probe needs an embedding endpoint: tests/serving/test_alert.py runs against a real one
    **{series: "serving probe only" for spec in METRICS.values() if spec.area == "serving" for series in spec.series()},
    # the index probes need a vector store holding the catalog: tests/index/test_daemon.py runs a daemon
    # with them on a real pgvector and LanceDB
    **{name: "index probe only" for name, spec in METRICS.items() if spec.area == "index"},
    # a single daemon exports none of these; tests/test_prometheus_live_scaleout.py runs their
    # queries against replicas and a reducer
    **{name: "scale-out roles only" for name in SCALE_OUT_METRICS},
}
# Metrics of features the daemon does not export yet (none left). When one of them starts being
# exported this test fails: remove it here, and its queries are then held to "returns at least
# one series" like all the others. The retrieval probes run below on the synthetic interactions;
# drift compares each stream with its first 1,000 records, and the collapse is a drift.
AWAITING_DAEMON: set[str] = set()

DAEMON_CONFIG = {
    "source": "synthetic",
    "synthetic": {
        "models": [{"name": MODEL, "dim": 64}],
        "stream": STREAM,
        "rate": 500.0,
        "batch_size": 50,
        "phases": [
            {"kind": "healthy", "seconds": 8.0},
            {"kind": "invalid", "seconds": 2.0},
            {"kind": "healthy", "seconds": 10.0},
            {"kind": "collapsed", "seconds": 600.0},
        ],
        "loop": False,
        # the producer's canary job: fixed items re-embedded every second (the collapse changes them)
        "canaries": len(CANARIES),
        "canary_period_seconds": 1.0,
        # a small search system: catalog documents with ids, served results, clicks
        "interactions": {"rate": 20.0, "catalog_size": 200, "catalog_period_seconds": 1.0},
    },
    "canaries": {"ids": {MODEL: CANARIES}},
    "window": {"seconds": 4.0, "subwindows": 2, "reservoir_size": 500},
    "refresh_seconds": 1.0,
    # on for the checkpoint alerts' signals (by default only the Kafka source checkpoints)
    "checkpoint": {"enabled": True, "interval_seconds": 2.0},
    "probes": {
        "statistics": {"resamples": 200},
        "clicks": [{"name": "clicks", "model": MODEL, "k": [5, 10], "metrics": list(PROBE_METRIC_FAMILIES),
                    "window_seconds": 60, "catalog_stream": "catalog", "interval_seconds": 1.0}],
        "ann_recall": [{"name": "ann", "model": MODEL, "stream": "catalog", "k": [10], "window_seconds": 30,
                        "interval_seconds": 1.0}],
    },
    # a screen that passes all but about 1 cycle in 10^4: the artifacts read the classifier's and the MMD's
    # series, which a quiet cycle of the staged default does not export, and the screen's own p-value,
    # which screen_level 1 (no screen) does not
    "drift": {"interval_seconds": 2.0, "false_alarm_every": "1h", "window_sample_size": 300,
              "reference_sample_size": 300, "threads": 1, "reference": {"records": 1000}, "screen_level": 0.9999},
}


@dataclass
class Stack:
    prom: PrometheusServer
    am: AlertmanagerServer
    hook: WebhookReceiver
    daemon: DaemonProcess
    collapse_after: float  # monotonic time at which the collapsed phase begins, at the earliest
    collapse_after_wall: float  # the same on the wall clock (Alertmanager's startsAt)

    def daemon_tail(self) -> str:
        return "--- daemon log ---\n" + "\n".join(self.daemon.output().splitlines()[-30:])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("live")
    port = free_port()
    config = {**DAEMON_CONFIG, "http": {"host": "127.0.0.1", "port": port}}
    (tmp / "daemon.yaml").write_text(yaml.safe_dump(config))
    # the shipped rules, with the collapse alert's `for` shortened so that a test can wait for it
    th = Thresholds.model_validate({"job": JOB, "alerts": {"EmbeddingMonitorCollapse": {"for": "2s"},
                                                          "EmbeddingMonitorModelChanged": {"for": "2s"}}})
    rules_path = tmp / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(prometheus.rule_file(build_rules(th)), sort_keys=False))
    with (
        WebhookReceiver.start() as hook,
        AlertmanagerServer.start(tmp, hook.url) as am,
        PrometheusServer.start(tmp, scrape={JOB: [f"127.0.0.1:{port}"]}, rule_files=[rules_path],
                               alertmanager=am.address) as prom,
        daemons.process("--config", str(tmp / "daemon.yaml"), "--state-dir", str(tmp / "state"),
                        log=tmp / "daemon.log", port=port) as daemon,
    ):
        s = Stack(prom, am, hook, daemon, time.monotonic() + HEALTHY_SECONDS, time.time() + HEALTHY_SECONDS)
        prom.wait_until(lambda: prom.query(f'up{{job="{JOB}"}} == 1'), timeout=60,
                        message="Prometheus scraping the daemon")
        yield s


def exported_now(stack: Stack) -> set[str]:
    names = {r["metric"]["__name__"] for r in stack.prom.query(f'{{job="{JOB}", __name__=~"embmon_.+"}}')}
    return names


@pytest.mark.slow
def test_every_metric_used_by_the_artifacts_is_exported(stack: Stack) -> None:
    rules = build_rules()
    texts = [yaml.safe_dump(prometheus.rule_file(rules)), yaml.safe_dump(grafana_alerts.provisioning_file(rules))]
    texts += [str(board) for board in dash.all_dashboards(rules).values()]
    used = set().union(*(referenced_metrics(t) for t in texts))
    assert used <= exported_names()
    # the invalid-record burst happens 8 s in: wait for its counter like for the gauges
    wait_until(lambda: {"embmon_records_invalid_total", "embmon_effective_rank", "embmon_retrieval_ndcg",
                        "embmon_retrieval_ann_recall", "embmon_retrieval_catalog_coverage_ratio",
                        "embmon_drift_detected", "embmon_drift_last_change_timestamp_seconds"} <= exported_now(stack),
               timeout=40, message="invalid-record counter, intrinsic, retrieval and drift gauges",
               retry=(OSError, PromQLError), on_timeout=lambda: stack.daemon_tail() + stack.prom.log_tail())
    missing = used - exported_now(stack)
    expected = (set(NOT_FROM_SYNTHETIC) | AWAITING_DAEMON) & used
    assert missing == expected, (
        f"now exported, remove from AWAITING_DAEMON: {sorted(expected - missing)}; "
        f"used by the artifacts but not exported: {sorted(missing - expected)}"
    )


@pytest.mark.slow
def test_every_query_parses_and_returns_series(stack: Stack) -> None:
    wait_until(lambda: "embmon_records_invalid_total" in exported_now(stack), timeout=40,
               message="the invalid-record burst", retry=(OSError, PromQLError), on_timeout=stack.daemon_tail)
    # recorded series exist
    stack.prom.wait_until(lambda: stack.prom.query("stream:embmon_records_invalid:ratio_rate10m"), timeout=20,
                          message="the recording rules")
    absent_by_design = set(NOT_FROM_SYNTHETIC) | AWAITING_DAEMON
    queries = all_queries()
    assert len(queries) > 150
    empty: list[str] = []
    waived: list[str] = []

    def every_held_query_answers() -> bool:
        # a parse or evaluation error raises PromQLError at once; an empty answer may only mean that
        # rate() and friends have not had two samples yet: the rules evaluate every second
        empty[:], waived[:] = [], []
        for q, expr in unanswered(stack.prom, queries):
            (waived if sources(q.expr) & absent_by_design else empty).append(f"{q.origin}: {expr}")
        return not empty

    wait_until(every_held_query_answers, timeout=30, message="every query reading exported metrics to return series",
               on_timeout=lambda: "queries returned no series:\n" + "\n".join(empty))
    held = [q for q in queries if q.must_return and not sources(q.expr) & absent_by_design]
    assert len(held) >= 80, len(held)  # most queries are held to returning data today
    # the waived ones are exactly those reading metrics the daemon cannot export here
    assert all(sources(w.split(": ", 1)[1]) & absent_by_design for w in waived)


@pytest.mark.slow
def test_job_panels_split_the_daemons_scheduled_jobs(stack: Stack) -> None:
    """The daemon's own `job` label arrives as `exported_job` (Prometheus keeps `job` for the scrape
    job): the panels by scheduled job show one series per job, not their sum under the scrape job."""
    board = dash.monitor_health(build_rules())
    (runs,) = [expr for title, expr in panels.panel_queries(board) if title == "Job runs / s by outcome"]
    stack.prom.wait_until(lambda: stack.prom.query('embmon_job_runs_total{exported_job="drift"}'), timeout=30,
                          message="a drift cycle counted")

    def split() -> set[tuple[str, str]]:
        return {(r["metric"]["exported_job"], r["metric"]["outcome"]) for r in stack.prom.query(substitute(runs))}

    # rate() needs two samples of each series
    wait_until(lambda: {("refresh", "success"), ("drift", "success")} <= split(), timeout=30,
               message="one series per scheduled job", on_timeout=lambda: f"split: {split()}")
    assert not stack.prom.query('embmon_job_runs_total{job="refresh"}')  # what `job` would have matched


@pytest.mark.slow
def test_a_scripted_collapse_pages_through_alertmanager(stack: Stack) -> None:
    def collapse_notified() -> list[dict[str, Any]]:
        return [a for a in stack.hook.alerts() if a["labels"].get("alertname") == "EmbeddingMonitorCollapse"]

    (alert, *_) = wait_until(
        collapse_notified, timeout=90, message="EmbeddingMonitorCollapse at the webhook",
        on_timeout=lambda: f"{stack.prom.alerts()}\n{stack.daemon_tail()}\n{stack.am.log_tail()}",
    )
    arrived = time.monotonic()
    assert arrived >= stack.collapse_after, "collapse paged during the healthy phases"
    assert alert["status"] == "firing"
    assert alert["labels"] == {"alertname": "EmbeddingMonitorCollapse", "model": MODEL, "stream": STREAM,
                               "severity": "critical"}
    ann = alert["annotations"]
    assert ann["summary"] == "The embedding space has collapsed: few dimensions carry the variance."
    match = re.fullmatch(
        rf"The daemon flags dimensional collapse for model {MODEL} on stream {STREAM}, and its effective rank "
        r"is at ([0-9.]+)% of its 7d median baseline\.", ann["description"])
    assert match and float(match.group(1)) < 50, ann["description"]
    assert ann["runbook_url"].endswith("docs/runbook.md#embeddingmonitorcollapse")
    # nothing else pages: the critical alerts that arrived are the collapse and, since the collapsed
    # model also embeds its canaries elsewhere, the changed model
    critical = {a["labels"]["alertname"] for a in stack.hook.alerts() if a["labels"].get("severity") == "critical"}
    assert critical <= {"EmbeddingMonitorCollapse", "EmbeddingMonitorModelChanged"}
    assert fired_at(alert) >= stack.collapse_after_wall
    # and Alertmanager holds it as an active alert
    active = [a for a in stack.am.alerts() if a["labels"]["alertname"] == "EmbeddingMonitorCollapse"]
    assert active and active[0]["status"]["state"] == "active"


def fired_at(alert: dict[str, Any]) -> float:
    """Alertmanager's ``startsAt`` (when Prometheus began firing it) as unix seconds."""
    stamp = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", alert["startsAt"])
    assert stamp, alert["startsAt"]
    whole = calendar.timegm(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S"))
    return whole + float(f"0.{stamp.group(2) or 0}")


@pytest.mark.slow
def test_a_collapsed_model_pages_as_a_changed_model_through_its_canaries(stack: Stack) -> None:
    def model_changed() -> list[dict[str, Any]]:
        return [a for a in stack.hook.alerts() if a["labels"].get("alertname") == "EmbeddingMonitorModelChanged"]

    (alert, *_) = wait_until(
        model_changed, timeout=90, message="EmbeddingMonitorModelChanged at the webhook",
        on_timeout=lambda: f"{stack.prom.alerts()}\n{stack.daemon_tail()}\n{stack.am.log_tail()}",
    )
    # the canaries matched their pins through the healthy phases (and the invalid burst)
    assert fired_at(alert) >= stack.collapse_after_wall, "a model change paged during the healthy phases"
    assert alert["status"] == "firing"
    assert alert["labels"] == {"alertname": "EmbeddingMonitorModelChanged", "model": MODEL, "severity": "critical"}
    ann = alert["annotations"]
    match = re.fullmatch(
        rf"Canary records of model {MODEL} no longer match their pinned vectors: the lowest canary cosine over "
        r"the window is (-?[0-9.]+) \(1 = unchanged\), with mismatches in the last 10m\.", ann["description"])
    assert match and float(match.group(1)) < 0.999, ann["description"]
    assert ann["runbook_url"].endswith("docs/runbook.md#embeddingmonitormodelchanged")
    # what the daemon counted: every canary compared after its first sighting, mismatches since the collapse
    compared = stack.prom.query(f'sum(embmon_canary_records_total{{model="{MODEL}"}})')
    mismatched = stack.prom.query(f'sum(embmon_canary_mismatches_total{{model="{MODEL}"}})')
    assert float(mismatched[0]["value"][1]) > 0
    assert float(compared[0]["value"][1]) > float(mismatched[0]["value"][1])
