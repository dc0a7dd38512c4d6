"""A replica SIGKILLed and restarted mid-stream: the reducer's counts end exact, nothing lost or doubled.

Two replica processes (``embedding-monitor run --role replica``) share the embeddings topic's
partitions; tests/test_crash.py's producer writes its known sequence over ~40 s (binary batches,
JSON events, some invalid records); one replica is SIGKILLed at seeded random moments while it
consumes, checkpoints and publishes, and restarted. Its partitions move
to the other replica meanwhile and back when it returns. At the end the reducer's merged window
holds every record exactly once: counts equal what was produced and the exact window metrics equal
those of the whole matrix (the window is long enough to hold the whole stream).
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.quality.intrinsic import report_from_matrix
from monitor.scaleout.reducer import Reducer
from tests.support.broker import Broker, free_port, kafka_daemon_overrides
from tests.support.scrape import scrape, value, wait_until
from tests.test_crash import DIM_BIN, MESSAGES, Producer, start_daemon

pytestmark = pytest.mark.broker

PARTITIONS, KILLS = 2, 3  # one partition per replica while both run; both on one while the victim is down
EXACT = ("partition_isotropy", "effective_dimension", "mean_cosine_similarity", "vector_norm_mean",
         "vector_norm_stddev", "effective_rank", "stable_rank", "top10_variance_ratio")
WINDOW = {"seconds": 3600, "subwindows": 4, "reservoir_size": 500}


def start_replica(monkeypatch: pytest.MonkeyPatch, broker: Broker, topic: str, name: str, state_dir: Path,
                  log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``embedding-monitor run`` as tests/test_crash.py starts it (fast commits and checkpoints, a
    short session), as replica ``name`` of the scaled deployment (the environment says so)."""
    monkeypatch.setenv("EMBMON_SCALE_OUT__REPLICA_ID", name)
    port = free_port()
    return start_daemon(broker, topic, "crash-scaled", state_dir, port, log), port


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_replica_killed_mid_stream_leaves_the_reducer_exact(broker: Broker, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    topic, partials = "emb-scaled-crash", "emb-scaled-crash-partials"
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(partials, partitions=2)
    reducer = Reducer(load_settings(overrides=kafka_daemon_overrides(
        broker, topic, "crash-scaled", tmp_path / "reducer", window=WINDOW, drift={"enabled": False},
        scale_out={"role": "reducer", "partials_topic": partials},
    )))
    reducer.start()
    # the replica processes' settings: the reducer's window and partials topic, role replica
    for key, setting in WINDOW.items():
        monkeypatch.setenv(f"EMBMON_WINDOW__{key.upper()}", str(setting))
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_TOPIC", partials)
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")
    steady, steady_port = start_replica(monkeypatch, broker, topic, "replica-b", tmp_path / "b", tmp_path / "b.log")
    rng = random.Random(20261122)
    producer = Producer(broker, topic)
    logs: list[Path] = []
    victim: subprocess.Popen[bytes] | None = None
    killed_mid_stream = 0
    try:
        wait_until(lambda: "assigned partitions" in (tmp_path / "b.log").read_text(), timeout=60,
                   message="the steady replica joined")
        producer.start()
        for kill in range(KILLS):
            log = tmp_path / f"a-{kill}.log"
            logs.append(log)
            victim, _ = start_replica(monkeypatch, broker, topic, "replica-a", tmp_path / "a", log)
            wait_until(lambda: "assigned partitions: [(" in log.read_text(), timeout=60,
                       message="the victim got partitions")
            time.sleep(rng.uniform(0.5, 3.0))  # while it consumes, checkpoints, publishes and commits
            killed_mid_stream += producer.is_alive()
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            assert victim.returncode == -signal.SIGKILL
            time.sleep(rng.uniform(0.0, 4.0))  # its partitions may move to the other replica meanwhile
        logs.append(tmp_path / "a-final.log")
        victim, victim_port = start_replica(monkeypatch, broker, topic, "replica-a", tmp_path / "a", logs[-1])
        producer.join(timeout=90)
        assert producer.error is None
        expected = {"bin": MESSAGES * 20, "json": MESSAGES}

        seen: dict[str, float | None] = {}

        def exact_counts() -> bool:
            s = scrape(reducer.http.port)
            seen.update({m: value(s, "embmon_window_records", model=m, stream="default") for m in expected})
            return all(seen[m] == n for m, n in expected.items())

        try:
            wait_until(exact_counts, timeout=120, message="the reducer's counts reach what was produced")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; produced {expected}, the reducer's window last held {seen}") from None
        # both replicas keep publishing: a doubled or lost publication would show within a few cycles
        settled = reducer.table.status(time.time()).applied.get("manifest", 0)
        wait_until(lambda: reducer.table.status(time.time()).applied.get("manifest", 0) >= settled + 10,
                   timeout=60, message="further publications")
        samples = scrape(reducer.http.port)
        # the replicas' own ingest counters (checkpointed with their state) add up exactly too
        invalid = [value(scrape(port), "embmon_records_invalid_total", stream="default", reason="bad_binary") or 0
                   for port in (steady_port, victim_port)]
    finally:
        if victim is not None:
            stop(victim)
        stop(steady)
        reducer.stop()

    assert exact_counts_in(samples, {"bin": MESSAGES * 20, "json": MESSAGES})
    assert sum(invalid) == producer.invalid
    assert killed_mid_stream >= 2
    text = [log.read_text() for log in logs]
    restored = [int(n) for t in text for n in re.findall(r"restored state from \S+ \((\d+) streams", t)]
    assert sum(n > 0 for n in restored) >= 2, restored  # restarts resumed from checkpoints
    assert all("Traceback" not in t for t in text + [(tmp_path / "b.log").read_text()])
    settings = load_settings().quality
    for model, matrix in (("bin", producer.bin_rows.reshape(-1, DIM_BIN)), ("json", producer.json_rows)):
        want = report_from_matrix(matrix, settings=settings)
        for name in EXACT:
            got = value(samples, f"embmon_{name}", model=model, stream="default")
            assert got == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-12), (model, name)
        assert value(samples, "embmon_dead_dimensions", model=model, stream="default") == want.dead_dimensions
    assert value(samples, "embmon_reducer_replicas", state="live") == 2


def exact_counts_in(samples: dict, expected: dict[str, int]) -> bool:  # type: ignore[type-arg]
    return all(value(samples, "embmon_window_records", model=m, stream="default") == n for m, n in expected.items())
