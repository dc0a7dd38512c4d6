"""A silent model change scaled out: two replica processes, a reducer, the real broker.

The canaries ``c0`` and ``c1`` are produced to partitions 0 and 1, so each replica forwards one of
them; the reducer compares both with its pins and exports ``embmon_canary_*`` once per model, with
the values a single daemon over the same topic exports. A real Prometheus scrapes the reducer and
both replicas with the generated rules (``for`` shortened to 2 s): ``EmbeddingMonitorModelChanged``
fires once for the model. After the model changes, an operator re-pins through the reducer
(``embedding-monitor canary repin``): the window's cosines are dropped, the alert resolves, and the
next arrivals match the new pins.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from monitor.artifacts import prometheus
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds
from tests.support import daemons
from tests.support.broker import Broker
from tests.support.prometheus import PrometheusServer
from tests.support.scaleout import replica, scaled_settings
from tests.support.scrape import Samples, scrape, value
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.prometheus]

GROUP, MODEL, DIM = "canaries-scaled", "m", 16
CANARIES = ["c0", "c1"]  # c0 on partition 0, c1 on partition 1
TOKEN = "canary-admin-token-0123456789"
FAMILIES = ("embmon_canary_records_total", "embmon_canary_mismatches_total", "embmon_canary_pins",
            "embmon_canary_cosine_min")


def event(ident: str, vector: np.ndarray) -> bytes:
    return orjson.dumps({"id": ident, "model": MODEL, "vector": vector.astype(np.float32).tolist()})


def send_round(broker: Broker, topic: str, canaries: np.ndarray, rng: np.random.Generator, docs: int = 3) -> None:
    """One canary per partition among a few ordinary records."""
    producer = broker.producer()
    for partition, (ident, vector) in enumerate(zip(CANARIES, canaries, strict=True)):
        for i in range(docs):
            producer.send(topic, event(f"doc-{partition}-{rng.integers(1 << 30)}-{i}", rng.standard_normal(DIM)),
                          partition=partition)
        producer.send(topic, event(ident, vector), partition=partition)
    producer.flush()
    producer.close()


def canary_values(samples: Samples) -> dict[str, float | None]:
    return {name: value(samples, name, model=MODEL) for name in FAMILIES}


def series(samples: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels), _ in samples.items() if n == name]


def model_changed(prom: PrometheusServer, state: str) -> list[dict[str, object]]:
    return [a for a in prom.alerts()
            if a["labels"].get("alertname") == "EmbeddingMonitorModelChanged" and a["state"] == state]


@pytest.mark.slow
def test_a_changed_model_is_caught_once_per_model_and_a_repin_through_the_reducer_clears_it(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = "emb-canaries-scaled"
    canaries = {"ids": {MODEL: CANARIES}}
    settings = scaled_settings(monkeypatch, broker, topic, GROUP, tmp_path,
                               extra={"canaries": canaries, "http": {"admin_token": TOKEN}})
    monkeypatch.setenv("EMBMON_CANARIES__IDS", json.dumps(canaries["ids"]))
    rng = np.random.default_rng(20)
    pinned = rng.standard_normal((2, DIM))
    changed = pinned @ np.linalg.qr(rng.standard_normal((DIM, DIM)))[0]  # a rotated space: same norms
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        single = running.enter_context(daemons.crash_tested(
            broker, topic, "canaries-single", tmp_path / "single", tmp_path / "single.log",
            env={"EMBMON_SCALE_OUT__ROLE": "single", "EMBMON_DRIFT__ENABLED": "false"}))
        replicas = [running.enter_context(replica(broker, topic, f"replica-{i}", tmp_path / f"r{i}",
                                                  tmp_path / f"r{i}.log", GROUP)) for i in range(2)]

        rounds = [0]  # canary rounds sent: 2 canary records each

        def send(vectors: np.ndarray, docs: int = 3) -> None:
            send_round(broker, topic, vectors, rng, docs)
            rounds[0] += 1

        # both replicas in the group, one partition each: rounds of the unchanged model (the first
        # pins the canaries) until each replica has consumed records
        def both_consuming() -> bool:
            send(pinned, docs=0)
            return all((value(scrape(r.port), "embmon_records_total", model=MODEL, stream="default") or 0) > 0
                       for r in replicas)

        wait_until(both_consuming, timeout=90, interval=1.0, message="both replicas consuming a partition")

        def settled() -> tuple[dict[str, float | None], dict[str, float | None]] | None:
            """The reducer's canary gauges equal the single daemon's, every arrival but the pins compared."""
            mine, theirs = canary_values(scrape(reducer.http.port)), canary_values(scrape(single.port))
            done = mine == theirs and mine["embmon_canary_records_total"] == 2 * rounds[0] - 2
            return (mine, theirs) if done else None

        # 1. the unchanged model: every arrival after the pins matches
        for _ in range(3):
            send(pinned)
        mine, _ = wait_until(settled, timeout=60, message="the reducer's canaries equal the single daemon's")
        assert mine["embmon_canary_pins"] == 2 and mine["embmon_canary_mismatches_total"] == 0
        assert mine["embmon_canary_cosine_min"] == pytest.approx(1.0, abs=1e-6)
        # each replica forwarded the canary of its partition: the comparison spans replicas
        assert {r for r, *_ in reducer.table.canary_arrivals()} == {"replica-0", "replica-1"}

        # Prometheus scrapes the deployment (reducer and replicas) with the generated rules
        rules = tmp_path / "rules.yaml"
        th = Thresholds.model_validate({"alerts": {"EmbeddingMonitorModelChanged": {"for": "2s"}}})
        rules.write_text(yaml.safe_dump(prometheus.rule_file(build_rules(th)), sort_keys=False))
        targets = [f"127.0.0.1:{port}" for port in (reducer.http.port, *(r.port for r in replicas))]
        prom = running.enter_context(PrometheusServer.start(tmp_path, scrape={th.job: targets}, rule_files=[rules]))
        prom.wait_until(lambda: len(prom.query(f'up{{job="{th.job}"}} == 1')) == 3
                        and prom.query(f'embmon_canary_mismatches_total{{model="{MODEL}"}}'), timeout=60,
                        message="Prometheus scraping the reducer and both replicas")

        # 2. the model changes: 3 rounds, 6 mismatches, counted once, the lowest cosine as one daemon's
        changed_at = time.time()
        for _ in range(3):
            send(changed)
        wait_until(lambda: canary_values(scrape(reducer.http.port))["embmon_canary_mismatches_total"], timeout=60,
                   interval=0.05, message="a mismatch at the reducer")
        counted = time.time() - changed_at
        mine, theirs = wait_until(settled, timeout=60, message="the mismatches at the reducer and the single daemon")
        assert mine["embmon_canary_mismatches_total"] == 6
        worst = min(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)) for a, b in zip(
            changed.astype(np.float32).astype(np.float64), pinned.astype(np.float32).astype(np.float64), strict=True))
        assert mine["embmon_canary_cosine_min"] == pytest.approx(worst, abs=1e-6) and worst < 0.9
        got = scrape(reducer.http.port)
        for name in FAMILIES:  # once per model, from the reducer only
            assert series(got, name) == [{"model": MODEL}], name
            for r in replicas:
                assert not series(scrape(r.port), name), (name, "replica")

        # the alert fires once for the model (the reducer is its only exporter; the rule aggregates by model)
        firing = prom.wait_until(lambda: model_changed(prom, "firing"), timeout=60,
                                 message="EmbeddingMonitorModelChanged firing")
        print(f"scaled out: first mismatch counted by the reducer {counted:.2f}s after the first changed canary was "
              f"sent, EmbeddingMonitorModelChanged firing (for: 2s) after {time.time() - changed_at:.2f}s")
        assert [a["labels"] for a in firing] == [
            {"alertname": "EmbeddingMonitorModelChanged", "model": MODEL, "severity": "critical"}]

        # 3. re-pin through the reducer, with the CLI an operator uses
        token = tmp_path / "token"
        token.write_text(TOKEN)
        answer = subprocess.run(
            [sys.executable, "-m", "monitor", "canary", "repin", "--url", f"http://127.0.0.1:{reducer.http.port}",
             "--token-file", str(token), "--model", MODEL], capture_output=True, text=True, timeout=60, check=False)
        assert answer.returncode == 0, answer.stderr
        assert "re-pinned 2 canaries ['c0', 'c1']" in answer.stdout
        after = canary_values(scrape(reducer.http.port))
        assert after["embmon_canary_cosine_min"] is None  # the window's cosines against the old pins are gone
        assert after["embmon_canary_mismatches_total"] == 6
        prom.wait_until(lambda: not model_changed(prom, "firing") and not model_changed(prom, "pending"),
                        timeout=60, message="EmbeddingMonitorModelChanged resolved after the re-pin")
        send(changed)
        wait_until(lambda: canary_values(scrape(reducer.http.port))["embmon_canary_records_total"]
                   == 2 * rounds[0] - 2,
                   timeout=60, message="the next round compared with the new pins")
        final = canary_values(scrape(reducer.http.port))
        assert final["embmon_canary_mismatches_total"] == 6
        assert final["embmon_canary_cosine_min"] == pytest.approx(1.0, abs=1e-6)
