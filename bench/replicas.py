"""Scaling out on this machine: aggregate ingest of 1, 2 and 3 replicas, and the partials topic's bytes/s.

1. **Aggregate ingest.** One topic of 6 partitions holds binary batches at d = 384, produced up
   front. For k = 1, 2, 3, k replica processes (``embedding-monitor run --role replica``, default
   settings: checkpoints every 30 s, each one published) consume it in a fresh consumer group; a
   single daemon (``--role single``) is the reference. The group's first generation waits for
   every member (the broker's rebalance timeout is set past the start-up time), so all replicas
   start together. Rates are steady state, from 10 % to 100 % of the topic; per-replica rates are
   each replica's share over the same interval.
2. **Partials bytes/s.** One replica with the default window (900 s, 10 sub-windows, 10,000-row
   reservoir) and checkpoint interval (30 s) ingests a steady 300 rows/s (every sub-window's
   reservoir share fills) at d = 384 and d = 768; the bytes it publishes are read from its own
   counter, ``embmon_partials_published_bytes_total``, and compared with the model
   ``S x (1/checkpoint + 1/sub-window + subwindows/full_publish)`` where S is one sub-window's
   encoded size.

    .venv/bin/python bench/replicas.py            # ~10 minutes on 2 cores
    .venv/bin/python bench/replicas.py --quick    # smaller, shorter: a smoke run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import FAST_GROUP_OPTIONS, Broker, free_port
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

PARTITIONS = 6
ROWS_PER_MESSAGE = 256
STEADY_FROM = 0.1
JOIN_WAIT_MS = 20_000  # tansu completes a join after this: every replica is in the first generation


def produce_up_front(broker: Broker, topic: str, dim: int, rows: int) -> int:
    broker.create_topics(topic, partitions=PARTITIONS)
    producer = broker.producer(batch_size=1 << 20, max_request_size=16 << 20)
    block = np.random.default_rng(0).standard_normal((ROWS_PER_MESSAGE, dim)).astype(np.float32).tobytes()
    headers = [("model", b"bench"), ("dim", str(dim).encode()), ("stream", b"docs")]
    messages = rows // ROWS_PER_MESSAGE
    for i in range(messages):
        producer.send(topic, block, headers=headers, partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    return messages * ROWS_PER_MESSAGE


def start_daemon(broker: Broker, topic: str, group: str, role: str, name: str, state: Path, partials: str,
                 log: Path, options: dict[str, object], **env: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    flags = [f"--kafka-option={k}={v}" for k, v in options.items()]
    environment = dict(os.environ, EMBMON_KAFKA__AUTO_OFFSET_RESET="earliest",
                       EMBMON_SCALE_OUT__PARTIALS_TOPIC=partials, EMBMON_DRIFT__ENABLED="false", **env)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--role", role, "--replica-id", name,
             "--bootstrap-servers", broker.bootstrap, "--embeddings-topic", topic, "--group-id", group,
             "--metrics-port", str(port), "--state-dir", str(state), "--refresh-seconds", "3600", *flags],
            env=environment, stdout=out, stderr=subprocess.STDOUT,
        )
    return proc, port


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def counts(ports: list[int]) -> list[float]:
    out = []
    for port in ports:
        try:
            out.append(value(scrape(port), "embmon_records_total", model="bench", stream="docs") or 0.0)
        except OSError:
            out.append(0.0)
    return out


def ingest_run(broker: Broker, topic: str, rows: int, replicas: int, role: str, tmp: Path) -> dict[str, object]:
    """Aggregate and per-process rates of ``replicas`` processes in a fresh group."""
    group = f"bench-{role}-{replicas}"
    options = {**FAST_GROUP_OPTIONS, "max_poll_interval_ms": JOIN_WAIT_MS, "session_timeout_ms": 30_000}
    load = os.getloadavg()[0]
    started = [start_daemon(broker, topic, group, role, f"{group}-{i}", tmp / f"{group}-{i}", f"{topic}-partials",
                            tmp / f"{group}-{i}.log", options) for i in range(replicas)]
    procs, ports = [p for p, _ in started], [port for _, port in started]
    try:
        mark: tuple[float, list[float]] | None = None
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            now, done = time.perf_counter(), counts(ports)
            if mark is None and sum(done) >= STEADY_FROM * rows:
                mark = (now, done)
            if sum(done) >= rows and mark is not None:
                elapsed = now - mark[0]
                shares = [(d - m) / elapsed for d, m in zip(done, mark[1], strict=True)]
                return {"role": role, "replicas": replicas, "rows": rows, "aggregate": sum(shares),
                        "per_replica": shares, "load": load}
            time.sleep(0.25)
        raise RuntimeError(f"{replicas} x {role} consumed {sum(counts(ports))} of {rows} rows in 900 s")
    finally:
        stop_all(procs)


class SteadyProducer(threading.Thread):
    def __init__(self, broker: Broker, topic: str, dim: int, rate: float, seconds: float):
        super().__init__(daemon=True)
        self.broker, self.topic, self.dim, self.rate, self.seconds = broker, topic, dim, rate, seconds
        self.stop_event = threading.Event()

    def run(self) -> None:
        producer = self.broker.producer(max_request_size=16 << 20)
        rng = np.random.default_rng(1)
        rows_per_message, period = 100, 100 / self.rate
        headers = [("model", b"bench"), ("dim", str(self.dim).encode()), ("stream", b"docs")]
        end = time.monotonic() + self.seconds
        i = 0
        while time.monotonic() < end and not self.stop_event.is_set():
            block = rng.standard_normal((rows_per_message, self.dim)).astype(np.float32)
            producer.send(self.topic, block.tobytes(), headers=headers, partition=i % PARTITIONS)
            i += 1
            self.stop_event.wait(period)
        producer.flush()
        producer.close()


def subwindow_bytes(dim: int, reservoir_size: int = 10_000, subwindows: int = 10) -> int:
    """Encoded size of one full sub-window partial (exactly what the replica sends)."""
    from monitor.decoding.records import EmbeddingBatch
    from monitor.scaleout.partials import encode_subwindow
    from monitor.state.window import SlidingWindow

    window = SlidingWindow(dim, 900, subwindows, reservoir_size)
    window.add(EmbeddingBatch("m", "s", np.ones((reservoir_size // subwindows, dim), dtype=np.float32),
                              ids=[f"doc-{i:08d}" for i in range(reservoir_size // subwindows)]), 0.0)
    (sub,) = window.state_dict()["live"]
    return sum(len(r.value or b"") for r in encode_subwindow("embedding-monitor-replica-0", "m", "s", 1, sub, 10**9))


def partials_run(broker: Broker, dim: int, seconds: float, rate: float, tmp: Path) -> dict[str, float]:
    topic = f"bench-partials-{dim}"
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(f"{topic}-partials", partitions=1)
    proc, port = start_daemon(broker, topic, f"bench-partials-{dim}", "replica", f"replica-{dim}", tmp / f"p{dim}",
                              f"{topic}-partials", tmp / f"p{dim}.log", FAST_GROUP_OPTIONS)
    producer = SteadyProducer(broker, topic, dim, rate, seconds)
    try:
        wait_until(lambda: "assigned partitions: [(" in (tmp / f"p{dim}.log").read_text(), timeout=120, interval=0.5)
        producer.start()
        started = time.monotonic()
        first = value(scrape(port), "embmon_partials_published_bytes_total") or 0.0
        producer.join()
        elapsed = time.monotonic() - started
        last = value(scrape(port), "embmon_partials_published_bytes_total") or 0.0
        manifests = value(scrape(port), "embmon_partials_published_total", kind="manifest") or 0.0
    finally:
        producer.stop_event.set()
        stop_all([proc])
    size = subwindow_bytes(dim)
    # each checkpoint re-sends the head sub-window, each boundary the one that closed; every sub-window
    # again every full_publish_seconds (900 s by default: longer than this run)
    incremental = size * (1 / 30 + 1 / 90)
    return {"dim": dim, "seconds": elapsed, "bytes_per_second": (last - first) / elapsed, "subwindow_bytes": size,
            "incremental_model": incremental, "steady_model": incremental + size * 10 / 900, "manifests": manifests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = 100_000 if args.quick else 400_000
    seconds = 40 if args.quick else 180
    broker = Broker().start()
    results, partials = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="embmon-bench-replicas-") as tmp_name:
            tmp = Path(tmp_name)
            topic = "bench-replicas-384"
            rows = produce_up_front(broker, topic, 384, rows)
            broker.create_topics(f"{topic}-partials", partitions=3)
            for replicas, role in ((1, "single"), (1, "replica"), (2, "replica"), (3, "replica")):
                result = ingest_run(broker, topic, rows, replicas, role, tmp)
                results.append(result)
                per = ", ".join(f"{r:,.0f}" for r in result["per_replica"])  # type: ignore[attr-defined]
                print(f"{role:>7} x{replicas}: {result['aggregate']:,.0f} rows/s (per process: {per}), "
                      f"load {result['load']:.2f}", flush=True)
            for dim in (384, 768):
                out = partials_run(broker, dim, seconds, 300.0, tmp)
                partials.append(out)
                print(
                    f"partials d={dim}: {out['bytes_per_second'] / 1e3:,.1f} kB/s "
                    f"measured over {out['seconds']:.0f} s, "
                    f"sub-window {out['subwindow_bytes'] / 1e6:.2f} MB, model {out['incremental_model'] / 1e3:,.1f} "
                    f"kB/s ({out['steady_model'] / 1e3:,.1f} with full re-sends)",
                    flush=True,
                )
    finally:
        broker.stop()
    print(f"\nload average at the end: {os.getloadavg()}")
    print("\n| role | processes | rows | aggregate rows/s | per process rows/s | load average at start |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        per = " / ".join(f"{x:,.0f}" for x in r["per_replica"])  # type: ignore[attr-defined]
        print(f"| {r['role']} | {r['replicas']} | {r['rows']:,} | {r['aggregate']:,.0f} | {per} | {r['load']:.2f} |")
    print("\n| d | sub-window partial | measured (one replica, one stream) | model: checkpoints + boundaries "
          "| model with full re-sends |")
    print("| --- | --- | --- | --- | --- |")
    for p in partials:
        print(f"| {p['dim']} | {p['subwindow_bytes'] / 1e6:.2f} MB | {p['bytes_per_second'] / 1e3:,.1f} kB/s over "
              f"{p['seconds']:.0f} s ({p['manifests']:.0f} publications) | {p['incremental_model'] / 1e3:,.1f} kB/s "
              f"| {p['steady_model'] / 1e3:,.1f} kB/s |")


if __name__ == "__main__":
    main()
