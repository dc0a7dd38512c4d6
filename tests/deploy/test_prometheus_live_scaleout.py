"""The generated scale-out alerts and panels against a real Prometheus scraping replicas and a reducer.

Two replicas consume a two-partition topic through the real broker and publish their partial
state; one Prometheus (1 s scrape and evaluation) scrapes them and a reducer under the alerts'
job, with the generated rules (the scale-out alerts' ``for`` shortened). The reducer starts only
after the replicas publish, so the module sees, in order:

* replicas publishing and nothing merging: ``EmbeddingMonitorReducerNotMerging`` fires, and
  resolves once the reducer applies their manifests;
* every query of the artifacts that reads a scale-out metric returns series (single-process
  ``tests/test_prometheus_live.py`` cannot produce them), and the rules read the global gauges
  from the reducer alone, one series per (model, stream) even where both replicas export one;
* a record no replica wrote lands on the partials topic: ``EmbeddingMonitorPartialsRefused``;
* a replica stops: the reducer marks it stale and ``EmbeddingMonitorReplicaStale`` names it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from monitor.artifacts import prometheus
from monitor.artifacts.catalog import METRICS
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds
from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.scaleout.reducer import Reducer
from monitor.scaleout.replica import Replica
from tests.support.artifact_queries import all_queries, sources, substitute, unanswered
from tests.support.broker import Broker, free_port, kafka_daemon_overrides
from tests.support.prometheus import PrometheusServer
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.prometheus]

JOB = "embedding-monitor"
MODEL, STREAM, DIM = "m", "docs", 16
PARTITIONS, BATCHES, ROWS = 2, 20, 25
STALE_AFTER = 5.0  # seconds without a publication before the reducer calls a replica stale
SCALE_OUT = {name for name, spec in METRICS.items() if spec.area == "scale_out"}
# Grafana's query of this alert is the alert itself: empty while a reducer merges (checked before it starts)
EMPTY_WHILE_MERGING = "grafana EmbeddingMonitorReducerNotMerging A"
# ... and this one's while the reducer exports every stream the replicas ingest
EMPTY_WHILE_EXPORTED = "grafana EmbeddingMonitorStreamNotMerged A"
SHORT_FOR = {"EmbeddingMonitorReducerNotMerging": "1s", "EmbeddingMonitorPartialsRefused": "1s",
             "EmbeddingMonitorReplicaStale": "2s"}


@dataclass
class Deployment:
    broker: Broker
    prom: PrometheusServer
    replicas: list[Monitor]
    reducer: Reducer
    topic: str
    partials: str
    # what Prometheus showed before the reducer started
    before_reducer: dict[str, Any] = field(default_factory=dict)

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        return [a for a in self.prom.alerts() if a["labels"]["alertname"] == alertname and a["state"] == "firing"]


def produce(broker: Broker, topic: str) -> int:
    """Binary batches of one stream on every partition: both replicas see the stream."""
    rng = np.random.default_rng(12)
    producer = broker.producer()
    for p in range(PARTITIONS):
        for _ in range(BATCHES):
            block = (rng.standard_normal((ROWS, DIM)) + p).astype(np.float32)
            producer.send(topic, block.tobytes(), partition=p,
                          headers=[("model", MODEL.encode()), ("dim", str(DIM).encode()), ("stream", STREAM.encode())])
    producer.flush()
    producer.close()
    return PARTITIONS * BATCHES * ROWS


def overrides(broker: Broker, topic: str, partials: str, state_dir: Path, port: int, **scale: object) -> dict:  # type: ignore[type-arg]
    return kafka_daemon_overrides(
        broker, topic, "scaled-live", state_dir,
        http={"port": port},
        window={"seconds": 3600, "subwindows": 4, "reservoir_size": 500},
        checkpoint={"interval_seconds": 0.5},
        drift={"enabled": False},
        scale_out={"partials_topic": partials, "stale_after_seconds": STALE_AFTER, **scale},
    )


@pytest.fixture(scope="module")
def deployment(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("scaled-live")
    topic, partials = "emb-live-scaled", "emb-live-scaled-partials"
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(partials, partitions=1)
    ports = [free_port() for _ in range(3)]
    replicas = [
        Replica(load_settings(overrides=overrides(broker, topic, partials, tmp / f"replica-{i}", ports[i],
                                                  role="replica", replica_id=f"replica-{i}")))
        for i in range(2)
    ]
    reducer = Reducer(load_settings(overrides=overrides(broker, topic, partials, tmp / "reducer", ports[2],
                                                        role="reducer")))
    th = Thresholds.model_validate({"job": JOB, "alerts": {name: {"for": f} for name, f in SHORT_FOR.items()}})
    rules_path = tmp / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(prometheus.rule_file(build_rules(th)), sort_keys=False))
    started: list[Monitor | Reducer] = []
    scraped = {JOB: [f"127.0.0.1:{p}" for p in ports]}
    with PrometheusServer.start(tmp, scrape=scraped, rule_files=[rules_path]) as prom:
        try:
            for replica in replicas:
                replica.start()
                started.append(replica)
            d = Deployment(broker, prom, replicas, reducer, topic, partials)
            wait_until(lambda: all(r.source.up for r in replicas), timeout=60, message="replicas connected")
            d.before_reducer["records"] = produce(broker, topic)
            # replicas publish and nothing merges: the critical alert, and Grafana's form of it
            d.before_reducer["not_merging"] = wait_until(
                lambda: d.firing("EmbeddingMonitorReducerNotMerging"), timeout=60,
                message="EmbeddingMonitorReducerNotMerging before the reducer starts", on_timeout=prom.log_tail)
            (grafana,) = [q for q in all_queries() if q.origin == EMPTY_WHILE_MERGING]
            d.before_reducer["grafana"] = prom.query(substitute(grafana.expr))
            reducer.start()
            started.append(reducer)
            yield d
        finally:
            for daemon in reversed(started):
                daemon.stop()


def merged_everything(d: Deployment) -> bool:
    s = scrape(d.reducer.http.port)
    return value(s, "embmon_window_records", model=MODEL, stream=STREAM) == d.before_reducer["records"]


@pytest.mark.slow
def test_no_reducer_pages_and_a_merging_reducer_resolves_it(deployment: Deployment) -> None:
    d = deployment
    (alert,) = d.before_reducer["not_merging"]
    assert alert["labels"] == {"alertname": "EmbeddingMonitorReducerNotMerging", "job": JOB, "severity": "critical"}
    assert alert["annotations"]["description"].startswith(f"Replicas of job {JOB} published ")
    assert d.before_reducer["grafana"], "Grafana's query of the alert returned nothing while no reducer ran"
    d.prom.wait_until(lambda: not d.firing("EmbeddingMonitorReducerNotMerging"), timeout=60,
                    message="EmbeddingMonitorReducerNotMerging resolved once the reducer merges")
    assert d.prom.query('sum(increase(embmon_reducer_partials_applied_total{kind="manifest"}[5m])) > 0')


@pytest.mark.slow
def test_every_scale_out_query_returns_series(deployment: Deployment) -> None:
    d = deployment
    wait_until(lambda: merged_everything(d), timeout=90, message="the reducer merged every record")
    inject_corrupt_record(d)
    d.prom.wait_until(lambda: any(float(r["value"][1]) >= 1 for r in d.prom.query(
        'embmon_reducer_partials_ignored_total{reason="corrupt"}')), timeout=30, message="the corrupt record counted")
    queries = [q for q in all_queries()
               if sources(q.expr) & SCALE_OUT and q.origin not in (EMPTY_WHILE_MERGING, EMPTY_WHILE_EXPORTED)]
    assert any(q.origin.startswith("dashboard embedding-monitor-monitor-health") for q in queries)
    # rate() over the new samples answers once it has two of them (a parse error raises at once)
    wait_until(lambda: not unanswered(d.prom, queries), timeout=30, message="every scale-out query to return series",
               on_timeout=lambda: "scale-out queries returned no series:\n"
               + "\n".join(f"{q.origin}: {expr}" for q, expr in unanswered(d.prom, queries)))
    # every scale-out metric the artifacts use is exported by a replica or the reducer
    exported = {
        r["metric"]["__name__"] for r in d.prom.query(f'{{job="{JOB}", __name__=~"embmon_(partials|reducer)_.+"}}')
    }
    used = set().union(*(sources(q.expr) for q in queries)) & SCALE_OUT
    assert used and used <= exported, used - exported


@pytest.mark.slow
def test_the_rules_read_the_global_gauges_from_the_reducer(deployment: Deployment) -> None:
    d = deployment
    wait_until(lambda: merged_everything(d), timeout=90, message="the reducer merged every record")
    reducer_instance = f"127.0.0.1:{d.reducer.http.port}"
    # window gauges come from the reducer alone, so the recorded per-stream averages are its values
    rank = d.prom.wait_until(lambda: d.prom.query(f'embmon_effective_rank{{model="{MODEL}"}}'), timeout=30,
                           message="the reducer's effective rank")
    assert [r["metric"]["instance"] for r in rank] == [reducer_instance]

    def recorded_equals_reducer() -> bool:
        recorded = d.prom.query("model_stream:embmon_effective_rank:avg")
        own = value(scrape(d.reducer.http.port), "embmon_effective_rank", model=MODEL, stream=STREAM)
        return len(recorded) == 1 and own is not None and float(recorded[0]["value"][1]) == pytest.approx(own, rel=1e-9)

    d.prom.wait_until(recorded_equals_reducer, timeout=30, message="recorded average equal to the reducer's gauge")
    # both replicas export the stream's last record; the alert reads the newest, once per stream
    last = d.prom.query(f'embmon_last_record_timestamp_seconds{{model="{MODEL}", stream="{STREAM}"}}')
    assert len(last) == 2 and reducer_instance not in {r["metric"]["instance"] for r in last}
    (rule,) = [a for a in build_rules().alerts if a.name == "EmbeddingMonitorNoRecentRecords"]
    (age,) = d.prom.query(rule.condition.expr)
    assert age["metric"] == {"model": MODEL, "stream": STREAM}
    assert float(age["value"][1]) < 120
    assert not d.firing("EmbeddingMonitorNoRecentRecords")


def inject_corrupt_record(d: Deployment) -> None:
    """A record no replica wrote (an unknown key) on the partials topic."""
    producer = d.broker.producer()
    producer.send(d.partials, b"not a partial", key=b"someone-else", partition=0)
    producer.flush()
    producer.close()


@pytest.mark.slow
def test_a_foreign_record_on_the_partials_topic_is_refused_and_alerted(deployment: Deployment) -> None:
    d = deployment
    # the reducer exports every refusal reason at 0 from the start; once Prometheus holds that 0, the first
    # foreign record is an increase() (a series born at 1 is none: the alert would miss it)
    d.prom.wait_until(lambda: d.prom.query('embmon_reducer_partials_ignored_total{reason="corrupt"}'), timeout=60,
                      message="the refusal counter scraped at 0")
    inject_corrupt_record(d)
    (alert, *_) = d.prom.wait_until(lambda: d.firing("EmbeddingMonitorPartialsRefused"), timeout=60,
                                  message="EmbeddingMonitorPartialsRefused")
    assert alert["labels"] == {"alertname": "EmbeddingMonitorPartialsRefused", "reason": "corrupt",
                               "severity": "warning"}


@pytest.mark.slow
def test_a_stopped_replica_is_reported_stale_by_name(deployment: Deployment) -> None:
    d = deployment
    wait_until(lambda: merged_everything(d), timeout=90, message="the reducer merged every record")
    assert not d.firing("EmbeddingMonitorReplicaStale")
    stopped = d.replicas[1]
    stopped.stop()
    stopped_at = time.monotonic()
    (alert, *_) = d.prom.wait_until(lambda: d.firing("EmbeddingMonitorReplicaStale"), timeout=60,
                                  message="EmbeddingMonitorReplicaStale")
    assert time.monotonic() - stopped_at >= STALE_AFTER
    assert alert["labels"] == {"alertname": "EmbeddingMonitorReplicaStale", "replica": "replica-1",
                               "severity": "warning"}
    assert [a["labels"]["replica"] for a in d.firing("EmbeddingMonitorReplicaStale")] == ["replica-1"]
