"""End to end through a real Kafka-compatible broker: produce, run the daemon, scrape /metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.quality.intrinsic import report_from_matrix
from tests.support import daemons
from tests.support.broker import FAST_GROUP_OPTIONS, Broker, kafka_daemon_overrides
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

DIM_JSON = 16
DIM_BIN = 32


def kafka_settings(broker: Broker, topic: str, group: str, state_dir: Path, **extra: object):  # type: ignore[no-untyped-def]
    return load_settings(overrides=kafka_daemon_overrides(broker, topic, group, state_dir, **extra))


def produce_mixed_stream(broker: Broker, topic: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """JSON events for one model, binary batches for another, with malformed messages in between."""
    json_rows = rng.standard_normal((300, DIM_JSON)).astype(np.float32)
    bin_rows = rng.standard_normal((1000, DIM_BIN)).astype(np.float32)
    producer = broker.producer()
    for i, row in enumerate(json_rows):
        producer.send(
            topic, orjson.dumps({"id": f"doc-{i}", "model": "json-model", "vector": row.tolist(), "stream": "docs"})
        )
        if i == 100:
            producer.send(topic, b"{this is not json")
            producer.send(
                topic,
                orjson.dumps({"id": "x", "model": "json-model", "vector": [0.1] * (DIM_JSON + 1), "stream": "docs"}),
            )
            producer.send(
                topic,
                json.dumps(
                    {"id": "n", "model": "json-model", "vector": [float("nan")] * DIM_JSON, "stream": "docs"}
                ).encode(),
            )
            producer.send(topic, orjson.dumps({"model": "json-model", "vector": [0.1] * DIM_JSON, "stream": "docs"}))
    headers = [("model", b"bin-model"), ("dim", str(DIM_BIN).encode()), ("stream", b"docs")]
    for start in range(0, 1000, 250):
        producer.send(topic, bin_rows[start : start + 250].tobytes(), headers=headers)
    producer.send(topic, b"\x00" * 10, headers=headers)  # not a whole number of rows
    producer.flush()
    producer.close()
    return {"json-model": json_rows, "bin-model": bin_rows}


def test_daemon_consumes_json_and_binary_and_exports_exact_metrics(broker: Broker, state_dir: Path) -> None:
    topic, group = "emb-e2e", "e2e-group"
    broker.create_topics(topic)
    rows = produce_mixed_stream(broker, topic, np.random.default_rng(7))
    settings = kafka_settings(broker, topic, group, state_dir)
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port

        def all_consumed() -> bool:
            s = scrape(port)
            return (
                value(s, "embmon_records_total", model="json-model", stream="docs") == 300
                and value(s, "embmon_records_total", model="bin-model", stream="docs") == 1000
                and value(s, "embmon_window_records", model="bin-model", stream="docs") == 1000
                and value(s, "embmon_window_records", model="json-model", stream="docs") == 300
            )

        wait_until(all_consumed, timeout=60, message="all records counted and refreshed")
        samples = scrape(port)
        invalid = {
            dict(labels)["reason"]: v for (name, labels), v in samples.items() if name == "embmon_records_invalid_total"
        }
        assert invalid == {"bad_json": 1, "dim_mismatch": 1, "non_finite": 1, "missing_field": 1, "bad_binary": 1}
        for model, matrix in rows.items():
            expected = report_from_matrix(matrix, settings=settings.quality)
            labels = {"model": model, "stream": "docs"}
            for name in ("partition_isotropy", "effective_dimension", "mean_cosine_similarity", "vector_norm_mean",
                         "vector_norm_stddev", "effective_rank", "stable_rank", "top10_variance_ratio"):
                got = value(samples, f"embmon_{name}", **labels)
                assert got == pytest.approx(getattr(expected, name), rel=1e-6, abs=1e-9), name
            assert value(samples, "embmon_dimension", **labels) == matrix.shape[1]
            assert value(samples, "embmon_dead_dimensions", **labels) == expected.dead_dimensions
            assert value(samples, "embmon_collapse_detected", **labels) == 0
        assert value(samples, "embmon_source_up") == 1
        assert http_status(port, "/healthz") == 200
        wait_until(lambda: http_status(port, "/readyz") == 200, timeout=10, message="ready")
        # consumption continued past the malformed messages and offsets were committed
        total_messages = 300 + 4 + 4 + 1
        wait_until(lambda: broker.committed(group, topic) == total_messages, timeout=20, message="commit")


@pytest.mark.slow
def test_sigterm_commits_and_exits_zero_within_ten_seconds(broker: Broker, tmp_path: Path) -> None:
    topic, group = "emb-sigterm", "sigterm-group"
    broker.create_topics(topic)
    rng = np.random.default_rng(1)
    producer = broker.producer()
    headers = [("model", b"m"), ("dim", b"8")]
    for _ in range(20):
        producer.send(topic, rng.standard_normal((50, 8)).astype(np.float32).tobytes(), headers=headers)
    producer.flush()
    producer.close()
    options = [f"--kafka-option={k}={v}" for k, v in FAST_GROUP_OPTIONS.items()]
    env = {"EMBMON_KAFKA__AUTO_OFFSET_RESET": "earliest", "EMBMON_KAFKA__COMMIT_INTERVAL_SECONDS": "3600"}

    def run_until_sigterm(state_dir: Path, records: int | None) -> str:
        """Run a daemon until it was assigned the partition (it measured its lag) and holds ``records``
        records, SIGTERM it, and return its output."""
        with daemons.process(
            "--bootstrap-servers", broker.bootstrap, "--embeddings-topic", topic, "--group-id", group,
            "--state-dir", str(state_dir), "--refresh-seconds", "0.5", *options,
            env=env, log=state_dir.with_suffix(".log"),
        ) as daemon:
            def done() -> bool:
                samples = scrape(daemon.port)
                return (value(samples, "embmon_consumer_lag_records", topic=topic) == 0
                        and value(samples, "embmon_records_total", model="m", stream="default") == records)

            wait_until(done, timeout=60, message="partition assigned and records consumed")
            # the commit interval is an hour: only the shutdown path can have committed
            started = time.monotonic()
            assert daemon.stop(timeout=10) == 0
            assert time.monotonic() - started < 10
        output = daemon.output()
        assert "shutting down" in output
        return output

    first = run_until_sigterm(tmp_path / "state", 1000)
    assert broker.committed(group, topic) == 20
    # the start-up log says where each partition starts and why
    assert "no committed offset for this group: starting at the beginning (auto_offset_reset=earliest)" in first
    fresh_state = run_until_sigterm(tmp_path / "other-state", None)
    assert "starting at offset 20, the group's committed offset" in fresh_state
    restored = run_until_sigterm(tmp_path / "state", 1000)
    assert "starting at offset 20, after what the restored checkpoint reflects (up to 19" in restored
