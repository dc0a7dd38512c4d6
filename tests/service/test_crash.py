"""Crash safety: the daemon is SIGKILLed at seeded random moments while a producer writes a known
sequence; after the restarts every record is counted exactly once and the window metrics are
those of an uninterrupted run.

Exact (compared to 1e-6): everything computed from the window's sufficient statistics, i.e. the
record counters, embmon_records_invalid_total and the spectral/norm/cosine gauges. Not compared:
embmon_uniformity and embmon_sample_records, which depend on which rows the reservoir kept (the
reservoir's RNG state is restored, but the batches it sees depend on how polls were cut).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.quality.intrinsic import report_from_matrix
from tests.support.broker import FAST_GROUP_OPTIONS, Broker, free_port
from tests.support.logs import tracebacks
from tests.support.scrape import scrape, value, wait_until

pytestmark = pytest.mark.broker

DIM_BIN, DIM_JSON = 16, 8
MESSAGES = 150
KILLS = 6
EXACT = ("partition_isotropy", "effective_dimension", "mean_cosine_similarity", "vector_norm_mean",
         "vector_norm_stddev", "effective_rank", "stable_rank", "top10_variance_ratio")


class Producer(threading.Thread):
    """Writes the known sequence over ~40 s: binary batches, JSON events and some invalid records."""

    def __init__(self, broker: Broker, topic: str):
        super().__init__(name="test-producer", daemon=True)
        self.broker, self.topic = broker, topic
        rng = np.random.default_rng(11)
        self.bin_rows = rng.standard_normal((MESSAGES, 20, DIM_BIN)).astype(np.float32) + 0.3
        self.json_rows = rng.standard_normal((MESSAGES, DIM_JSON)).astype(np.float32)
        self.invalid = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = self.broker.producer()
            headers = [("model", b"bin"), ("dim", str(DIM_BIN).encode())]
            for i in range(MESSAGES):
                partition = i % 2
                producer.send(self.topic, self.bin_rows[i].tobytes(), headers=headers, partition=partition)
                event = {"id": f"e{i}", "model": "json", "vector": self.json_rows[i].tolist()}
                producer.send(self.topic, orjson.dumps(event), partition=1 - partition)
                if i % 10 == 0:
                    producer.send(self.topic, b"\x01\x02\x03", headers=headers, partition=partition)  # bad_binary
                    self.invalid += 1
                if i % 5 == 0:
                    producer.flush()
                time.sleep(0.25)
            producer.flush()
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def start_daemon(broker: Broker, topic: str, group: str, state_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        EMBMON_KAFKA__AUTO_OFFSET_RESET="earliest",
        EMBMON_KAFKA__COMMIT_INTERVAL_SECONDS="0.3",
        EMBMON_KAFKA__POLL_TIMEOUT_SECONDS="0.2",
        EMBMON_KAFKA__MAX_POLL_RECORDS="7",
        EMBMON_CHECKPOINT__INTERVAL_SECONDS="0.3",
    )
    # a SIGKILLed member stays in the group until its session expires: keep that short
    group_options = {**FAST_GROUP_OPTIONS, "session_timeout_ms": 2500, "heartbeat_interval_ms": 500}
    options = [f"--kafka-option={k}={v}" for k, v in group_options.items()]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--bootstrap-servers", broker.bootstrap, "--embeddings-topic",
             topic, "--group-id", group, "--metrics-port", str(port), "--state-dir", str(state_dir),
             "--refresh-seconds", "0.3", *options],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )


def test_sigkill_at_random_moments_counts_every_record_exactly_once(broker: Broker, tmp_path: Path) -> None:
    topic, group = "emb-crash", "crash-group"
    broker.create_topics(topic, partitions=2)
    state_dir, port = tmp_path / "state", free_port()
    rng = random.Random(20240607)
    producer = Producer(broker, topic)
    producer.start()
    seen_before_kill: list[float] = []
    for kill in range(KILLS):
        log = tmp_path / f"run-{kill}.log"
        proc = start_daemon(broker, topic, group, state_dir, port, log)
        try:
            wait_until(lambda: "assigned partitions" in log.read_text(), timeout=40, message="partitions assigned")
            time.sleep(rng.uniform(0.05, 2.5))  # while it consumes, checkpoints and commits
            with_records = scrape(port)
            seen_before_kill.append(value(with_records, "embmon_records_total", model="bin", stream="default") or 0)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
    producer.join(timeout=60)
    assert producer.error is None

    log = tmp_path / "final.log"
    proc = start_daemon(broker, topic, group, state_dir, port, log)
    try:
        expected_bin = MESSAGES * 20

        def done() -> bool:
            s = scrape(port)
            return (value(s, "embmon_records_total", model="bin", stream="default") == expected_bin
                    and value(s, "embmon_records_total", model="json", stream="default") == MESSAGES
                    and value(s, "embmon_window_records", model="bin", stream="default") == expected_bin)

        wait_until(done, timeout=60, message="all records counted after the restarts")
        time.sleep(1.5)  # a replayed (double-counted) poll would land by now
        samples = scrape(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert proc.returncode == 0

    # the kills did interrupt consumption mid-stream, and restarts resumed from checkpoints
    assert sum(0 < seen < expected_bin for seen in seen_before_kill) >= 3, seen_before_kill
    logs = [(tmp_path / f"run-{k}.log").read_text() for k in range(KILLS)] + [log.read_text()]
    restored = [int(n) for text in logs for n in re.findall(r"restored state from \S+ \((\d+) streams", text)]
    assert sum(n > 0 for n in restored) >= 3, restored
    assert not [tb for text in logs for tb in tracebacks(text)]

    assert value(samples, "embmon_records_total", model="bin", stream="default") == expected_bin
    assert value(samples, "embmon_records_total", model="json", stream="default") == MESSAGES
    assert value(samples, "embmon_records_invalid_total", stream="default", reason="bad_binary") == producer.invalid
    settings = load_settings().quality
    for model, matrix in (("bin", producer.bin_rows.reshape(-1, DIM_BIN)), ("json", producer.json_rows)):
        expected = report_from_matrix(matrix, settings=settings)
        for name in EXACT:
            got = value(samples, f"embmon_{name}", model=model, stream="default")
            assert got == pytest.approx(getattr(expected, name), rel=1e-6, abs=1e-9), (model, name)
        assert value(samples, "embmon_window_records", model=model, stream="default") == matrix.shape[0]
        assert value(samples, "embmon_dead_dimensions", model=model, stream="default") == expected.dead_dimensions
