"""Three replicas and one reducer through a real broker equal one daemon that consumed everything.

The embeddings topic has 6 partitions and producers key them so that every partition carries its
own distribution (another mean and spread per partition): each replica sees a different mixture,
and its own window metrics would be systematically wrong. The reducer merges the replicas'
publications; a single daemon (its own consumer group) reads the same topic.

Condition for equality (docs/deployment.md, "Scaling out"): every record sits in the live window
of both (a one-hour window holds the whole test stream), and positive pairs complete within one
replica (both halves are produced to one partition). Then every metric computed from the exact
statistics equals the single daemon's to 1e-9 relative; sample-based ones (uniformity, the drift
tests' samples) see other rows, so drift is compared by verdict on a stable and a drifted stream.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor import catalog
from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.scaleout.reducer import Reducer
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

PARTITIONS, DIM, JSON_DIM = 6, 24, 8
MESSAGES_PER_PARTITION, ROWS = 12, 30
EXACT = ("partition_isotropy", "effective_dimension", "effective_dimension_ratio", "top10_variance_ratio",
         "mean_cosine_similarity", "vector_norm_mean", "vector_norm_stddev", "effective_rank", "stable_rank",
         "dead_dimensions", "collapse_detected", "dimension", "window_records", "alignment")
DRIFT = {
    "interval_seconds": 3600.0,  # cycles are run by the test, after everything was consumed
    "false_alarm_every": "30d",
    "window_sample_size": 400,
    "reference_sample_size": 400,
    "threads": 1,
    "ks": {"components": 8},
    "classifier": {"squared_components": 4},
    "reference": {"records": 1_000_000},  # the JSON model gets no reference in either deployment
}


def produce(broker: Broker, topic: str) -> dict[tuple[str, str], np.ndarray]:
    """Keyed traffic: partition p has its own distribution; returns every row per (model, stream)."""
    rng = np.random.default_rng(2024)
    rows: dict[tuple[str, str], list[np.ndarray]] = {("m", "stable"): [], ("m", "moved"): [], ("j", "docs"): []}
    producer = broker.producer()
    for p in range(PARTITIONS):
        mean = np.linspace(-1, 1, DIM) * (p - 2.5) * 0.4
        scale = 0.5 + 0.25 * p
        for i in range(MESSAGES_PER_PARTITION):
            for stream, shift in (("stable", 0.0), ("moved", 1.5)):
                block = (rng.standard_normal((ROWS, DIM)) * scale + mean + shift).astype(np.float32)
                rows[("m", stream)].append(block)
                producer.send(topic, block.tobytes(), partition=p,
                              headers=[("model", b"m"), ("dim", str(DIM).encode()), ("stream", stream.encode())])
            pair = rng.standard_normal((2, JSON_DIM)).astype(np.float32) + p
            for half, vector in enumerate(pair):  # both halves of a positive pair on one partition
                event = {"id": f"p{p}-{i}-{half}", "model": "j", "stream": "docs", "vector": vector.tolist(),
                         "pair_id": f"pair-{p}-{i}"}
                producer.send(topic, orjson.dumps(event), partition=p)
            rows[("j", "docs")].append(pair)
    producer.flush()
    producer.close()
    return {key: np.concatenate(blocks) for key, blocks in rows.items()}


def produce_interactions(broker: Broker, topic: str) -> int:
    """Served results and clicks for the JSON model's documents: what the clicks probe reads."""
    rng = np.random.default_rng(5)
    producer = broker.producer()
    events = 60
    for q in range(events):
        results = [f"p{int(rng.integers(0, PARTITIONS))}-{int(rng.integers(0, MESSAGES_PER_PARTITION))}-0"
                   for _ in range(5)]
        clicks = [results[int(rng.integers(0, 3))]] if q % 4 else []
        event = {"query_id": f"q{q}", "model": "j", "results": results, "clicks": clicks,
                 "slice": "head" if q % 2 else "tail"}
        producer.send(topic, orjson.dumps(event), partition=q % 2)
    producer.flush()
    producer.close()
    return events


def reference_file(tmp_path: Path) -> Path:
    """The pinned drift reference: the stable stream's mixture over all partitions."""
    rng = np.random.default_rng(99)
    parts = []
    for p in range(PARTITIONS):
        mean = np.linspace(-1, 1, DIM) * (p - 2.5) * 0.4
        parts.append(rng.standard_normal((200, DIM)) * (0.5 + 0.25 * p) + mean)
    path = tmp_path / "reference.npy"
    np.save(path, np.concatenate(parts).astype(np.float32))
    return path


def overrides(broker: Broker, topic: str, group: str, state_dir: Path, **extra: object) -> dict:  # type: ignore[type-arg]
    return kafka_daemon_overrides(
        broker, topic, group, state_dir,
        kafka={"interactions_topic": f"{topic}-interactions"},
        window={"seconds": 3600, "subwindows": 4, "reservoir_size": 2000},
        checkpoint={"interval_seconds": 0.5},
        # probes run when the test says (a long interval), the catalog size is given
        probes={"clicks": [{"name": "clicks", "k": [5], "catalog_stream": None, "catalog_size": 100,
                            "interval_seconds": 3600}]},
        **extra,
    )


@pytest.fixture
def deployment(broker: Broker, tmp_path: Path) -> Iterator[dict[str, object]]:
    topic, partials = "emb-scaled", "emb-scaled-partials"
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(partials, f"{topic}-interactions", partitions=2)
    reference = reference_file(tmp_path)
    drift = {**DRIFT, "reference": {**DRIFT["reference"], "path": str(reference)}}  # type: ignore[dict-item]
    scale = {"partials_topic": partials, "max_record_bytes": 65_536}
    with contextlib.ExitStack() as running:
        replicas = [
            running.enter_context(daemons.monitor(load_settings(overrides=overrides(
                broker, topic, "scaled", tmp_path / f"replica-{i}",
                scale_out={**scale, "role": "replica", "replica_id": f"replica-{i}"}))))
            for i in range(3)
        ]
        reducer = running.enter_context(daemons.reducer(load_settings(overrides=overrides(
            broker, topic, "scaled", tmp_path / "reducer", drift=drift, scale_out={**scale, "role": "reducer"}))))
        single = running.enter_context(daemons.monitor(load_settings(overrides=overrides(
            broker, topic, "single", tmp_path / "single", drift=drift))))
        yield {"topic": topic, "partials": partials, "replicas": replicas, "reducer": reducer, "single": single}


def drift_verdicts(daemon: Monitor | Reducer) -> dict[str, bool]:
    drift = next(c for c in daemon.components if c.name == "drift")
    daemon.refresh()
    results = drift.run_cycle()  # type: ignore[attr-defined]
    return {stream: results[("m", stream)].report.detected for stream in ("stable", "moved")}


@pytest.mark.slow  # four processes and a broker, over 5 s on the 2-core machine
def test_three_replicas_and_a_reducer_equal_one_daemon(broker: Broker, deployment: dict) -> None:  # type: ignore[type-arg]
    replicas: list[Monitor] = deployment["replicas"]  # type: ignore[assignment]
    reducer: Reducer = deployment["reducer"]  # type: ignore[assignment]
    single: Monitor = deployment["single"]  # type: ignore[assignment]
    wait_until(lambda: all(r.source.up for r in replicas), timeout=60, message="replicas connected")
    rows = produce(broker, str(deployment["topic"]))
    totals = {key: len(matrix) for key, matrix in rows.items()}
    interactions = produce_interactions(broker, f"{deployment['topic']}-interactions")

    def complete(port: int) -> bool:
        s = scrape(port)
        return value(s, "embmon_interactions_total", model="j") == interactions and all(
            value(s, "embmon_window_records", model=m, stream=st) == n for (m, st), n in totals.items())

    wait_until(lambda: complete(single.http.port), timeout=120, message="the single daemon consumed everything")
    wait_until(lambda: complete(reducer.http.port), timeout=120, message="the reducer merged everything")

    # every replica took part, each with its own mixture (keyed partitions)
    means = []
    for replica in replicas:
        state = replica.registry.get("m", "stable")
        assert state is not None and 0 < state.records_total < totals[("m", "stable")]
        means.append(state.window.snapshot(time.time()).stats.mean)
    assert min(np.abs(a - b).max() for i, a in enumerate(means) for b in means[i + 1:]) > 0.1
    assert sum(r.registry.get("m", "stable").records_total for r in replicas) == totals[("m", "stable")]  # type: ignore[union-attr]

    got, want = scrape(reducer.http.port), scrape(single.http.port)
    worst = 0.0
    for model, stream in totals:
        for name in EXACT:
            a = value(got, f"embmon_{name}", model=model, stream=stream)
            b = value(want, f"embmon_{name}", model=model, stream=stream)
            if name == "alignment" and model == "m":
                assert a is None and b is None  # no positive pairs in that model
                continue
            assert a is not None and b is not None, (model, stream, name)
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (model, stream, name)
            if b:
                worst = max(worst, abs(a / b - 1))
    print(f"largest relative difference reducer vs single daemon: {worst:.2e}")

    # drift: same verdicts on the stable and the drifted stream, against the same pinned reference
    assert drift_verdicts(reducer) == drift_verdicts(single) == {"stable": False, "moved": True}
    # probes: the reducer reads the interactions itself; the same events give the same estimates
    # (bootstrap intervals depend on the order the two partitions interleave: not compared)
    mine, theirs = (probe_estimates(daemon) for daemon in (reducer, single))
    assert mine.keys() == theirs.keys() and mine
    assert all(mine[k] == pytest.approx(theirs[k], rel=1e-9) for k in mine)

    # the replicas export ingest health and their publishing, no window, drift or probe gauges
    for replica in replicas:
        s = scrape(replica.http.port)
        names = {name for name, _ in s}
        assert "embmon_records_total" in names and value(s, "embmon_partials_publish_failures_total") == 0
        assert not names & {"embmon_partition_isotropy", "embmon_window_records", "embmon_drift_detected",
                            "embmon_interactions_total", "embmon_retrieval_mrr"}
    status = reducer.table.status(time.time())
    assert [r.replica for r in status.replicas] == ["replica-0", "replica-1", "replica-2"]
    assert not any(r.stale for r in status.replicas)
    assert value(got, "embmon_reducer_replicas", state="live") == 3
    assert "embmon_records_total" not in {name for name, _ in got}  # each replica exports its own
    assert_families_are_declared(reducer.http.port, replicas[0].http.port)


def probe_estimates(daemon: Monitor | Reducer) -> dict[tuple[str, ...], float]:
    probes = next(c for c in daemon.components if c.name == "probes")
    probes.run_probe("clicks")  # type: ignore[attr-defined]
    return {(name, *sorted(labels)): v for (name, labels), v in scrape(daemon.http.port).items()
            if name.startswith("embmon_retrieval_") and "_ci_" not in name}


def assert_families_are_declared(*ports: int) -> None:
    """What the roles export is exactly what monitor/catalog/ declares (tests/artifacts/test_catalog.py's rule)."""
    import urllib.request

    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name.startswith(("process_", "python_")) or family.name.endswith("_created"):
                continue
            name = family.name + ("_total" if family.type == "counter" else "")
            spec = catalog.spec(name)
            assert family.documentation == spec.help, name
            labels = {label for sample in family.samples for label in sample.labels} - {"le"}
            assert labels <= set(spec.labels), (name, labels)
