"""Soak test (not in CI): the daemon under steady load for N minutes, resident memory every minute.

Starts a tansu broker (tests/support/broker.py), a producer thread writing binary batches at a
steady rate, and the daemon as a subprocess (`python -m monitor run`, checkpoints on); samples the
daemon's RSS with psutil every minute and prints it, then a verdict: "flat" when the growth over
the second half of the run is below --tolerance (default 5 %) of the RSS at its midpoint (the
first half is warm-up: windows and reservoirs fill until the window length is reached).

    python bench/soak.py --minutes 30 --rate 2000 --dim 384
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.broker import FAST_GROUP_OPTIONS, Broker, free_port

REPO = Path(__file__).resolve().parents[1]


def produce(broker: Broker, topic: str, rate: float, dim: int, stop: threading.Event) -> None:
    producer = broker.producer()
    rng = np.random.default_rng(0)
    batch = max(1, int(rate / 10))
    headers = [("model", b"soak"), ("dim", str(dim).encode())]
    next_at = time.monotonic()
    while not stop.is_set():
        producer.send(topic, rng.standard_normal((batch, dim)).astype(np.float32).tobytes(), headers=headers)
        next_at += batch / rate
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush()
    producer.close()


def records(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("embmon_records_total{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=2000, help="records per second")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--window-seconds", type=float, default=300)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument(
        "--state-dir", help="checkpoint directory (default: a fresh temporary one, so no run restores another's state)"
    )
    args = parser.parse_args()
    if args.state_dir is None:
        args.state_dir = tempfile.mkdtemp(prefix="embmon-soak-")

    broker = Broker().start()
    stop = threading.Event()
    port = free_port()
    proc = None
    try:
        topic = "soak"
        broker.create_topics(topic)
        writer = threading.Thread(target=produce, args=(broker, topic, args.rate, args.dim, stop), daemon=True)
        writer.start()
        env = dict(
            os.environ,
            EMBMON_KAFKA__AUTO_OFFSET_RESET="earliest",
            EMBMON_WINDOW__SECONDS=str(args.window_seconds),
            EMBMON_CHECKPOINT__INTERVAL_SECONDS="30",
            EMBMON_KAFKA__COMMIT_INTERVAL_SECONDS="30",
        )
        options = [f"--kafka-option={k}={v}" for k, v in FAST_GROUP_OPTIONS.items()]
        proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "run", "--bootstrap-servers", broker.bootstrap, "--embeddings-topic",
             topic, "--group-id", "soak", "--metrics-port", str(port), "--state-dir", args.state_dir, *options],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        process = psutil.Process(proc.pid)
        samples: list[tuple[float, float, float]] = []
        started = time.monotonic()
        print(f"soak: {args.minutes:g} min at {args.rate:g} records/s, d={args.dim}, window {args.window_seconds:g} s")
        print(f"{'minute':>6} {'rss MiB':>9} {'records':>12}")
        for minute in range(1, int(args.minutes) + 1):
            time.sleep(max(0.0, started + 60 * minute - time.monotonic()))
            if proc.poll() is not None:
                print(f"daemon exited with status {proc.returncode}")
                return 1
            rss = process.memory_info().rss / 2**20
            try:
                count = records(port)
            except OSError:
                count = float("nan")
            samples.append((minute, rss, count))
            print(f"{minute:>6} {rss:>9.1f} {count:>12.0f}", flush=True)
        half = [rss for m, rss, _ in samples if m > args.minutes / 2]
        if len(half) < 2:
            print("verdict: too short to judge (run at least 4 minutes)")
            return 0
        growth = (half[-1] - half[0]) / half[0]
        verdict = "flat" if growth < args.tolerance else "GROWING"
        print(
            f"verdict: {verdict} (second-half RSS change {growth * 100:+.1f} %, tolerance {args.tolerance * 100:.0f} %)"
        )
        return 0 if verdict == "flat" else 1
    finally:
        stop.set()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        broker.stop()


if __name__ == "__main__":
    raise SystemExit(main())
