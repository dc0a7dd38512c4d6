"""Sustained ingest from a real broker: the daemon vs a bare kafka-python consume loop, same topic, one run.

Also measures a metric refresh over a 10,000 x 768 window and resident memory with 3 models at
d = 768 (every sub-window filled), in a fresh process (``--rss-only``: that number alone, and
whether torch was imported), with what importing torch costs. Prints a table
and the ratios the goals are stated in:

    .venv/bin/python bench/ingest.py                    # full run (several minutes on 2 cores)
    .venv/bin/python bench/ingest.py --quick            # smaller topics, for a smoke run
    .venv/bin/python bench/ingest.py --case binary:768  # one case (e.g. under py-spy)
    .venv/bin/python bench/ingest.py --case binary:384 --kafka-option max_partition_fetch_bytes=8388608
    .venv/bin/python bench/ingest.py --case json:384 --confluent  # + librdkafka: bare loop and daemon

Binary cases run the daemon twice on the same topic: with the default float64 statistics and
with ``window.gram_precision: float32``. Goals: binary >= 0.9 of the bare-consumer rate at
d = 384 and >= 0.8 at d = 768; JSON >= 25,000 vectors/s at d = 384 (one event per message,
full-precision floats); refresh <= 70 ms at 10k x 768; RSS <= 500 MB with 3 models at d = 768.
With ``--confluent``: the bare loop through librdkafka and the daemon with ``kafka.client:
confluent`` too, in the same run; goals JSON d = 384 daemon >= 0.8 x bare kafka-python
(kafka-python source) and >= 1.2 x bare kafka-python (librdkafka source), binary d = 384 >= 0.9 x
the bare loop of the same client.

Next to each rate: CPU per row of the consumer (with its JSON workers) and of the broker, and
"cores busy", their CPU seconds per wall second. The broker shares the two cores; a consumer that
leaves cores idle while behind is bound by latency (poll/fetch round trips), not by arithmetic.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka import KafkaConsumer, TopicPartition

from monitor.config import deep_merge, load_settings
from monitor.daemon.service import Monitor
from monitor.decoding.records import EmbeddingBatch
from tests.support.broker import FAST_GROUP_OPTIONS, Broker, client_settings

ROWS_PER_BINARY_MESSAGE = 256
JSON_EVENTS_PER_MESSAGE = 64


def produce(broker: Broker, topic: str, fmt: str, dim: int, rows: int, rng: np.random.Generator) -> None:
    broker.create_topics(topic)
    producer = broker.producer(batch_size=1 << 20, max_request_size=16 << 20)
    block = rng.standard_normal((ROWS_PER_BINARY_MESSAGE, dim)).astype(np.float32)
    if fmt == "binary":
        headers = [("model", b"bench"), ("dim", str(dim).encode()), ("stream", b"docs")]
        for _ in range(rows // ROWS_PER_BINARY_MESSAGE):
            producer.send(topic, block.tobytes(), headers=headers)
    elif fmt == "json":
        for i in range(rows):
            row = block[i % ROWS_PER_BINARY_MESSAGE]
            producer.send(
                topic, orjson.dumps({"id": f"d{i}", "model": "bench", "vector": row.tolist(), "stream": "docs"})
            )
    else:  # json-array: JSON events batched JSON_EVENTS_PER_MESSAGE to a message
        for start in range(0, rows, JSON_EVENTS_PER_MESSAGE):
            events = [
                {
                    "id": f"d{i}",
                    "model": "bench",
                    "vector": block[i % ROWS_PER_BINARY_MESSAGE].tolist(),
                    "stream": "docs",
                }
                for i in range(start, start + JSON_EVENTS_PER_MESSAGE)
            ]
            producer.send(topic, orjson.dumps(events))
    producer.flush()
    producer.close()


STEADY_FROM = 0.1  # rates are measured from 10 % to 100 % of the topic: steady state, no start-up


@dataclass(frozen=True)
class Rate:
    rows_per_second: float
    cpu_per_row: float  # CPU seconds of this process and its JSON workers, per row
    broker_cpu_per_row: float  # CPU seconds of the broker, per row
    cores: float  # consumer + broker CPU seconds per wall second: 2.0 means both cores were busy
    paused_share: float = 0.0  # of the wall time, the daemon's fetching was paused by a full apply queue
    worker_cpu_per_row: float = 0.0  # of cpu_per_row, the JSON worker processes' share
    rss_mb: float = 0.0  # the daemon's process resident memory at the end of the run (the bench's own included)


@dataclass(frozen=True)
class Mark:
    """Where the steady-state measurement starts: wall clock, rows done, consumer and broker CPU."""

    at: float
    rows: int
    cpu: float
    broker_cpu: float
    worker_cpu: float

    @classmethod
    def now(cls, rows: int, broker: Broker) -> Mark:
        own, workers = cpu_seconds()
        return cls(time.perf_counter(), rows, own + workers, broker_cpu_seconds(broker), workers)

    def rate(self, rows: int, broker: Broker) -> Rate:
        """The rate from this mark to now, ``rows`` being the total done by now."""
        end = Mark.now(rows, broker)
        done, elapsed = end.rows - self.rows, end.at - self.at
        if done <= 0:
            raise RuntimeError("no rows arrived after the steady-state mark: the client fetched the whole topic "
                               "at once (librdkafka prefetches up to 64 MiB); measure a larger topic (no --quick)")
        cpu, broker_cpu = end.cpu - self.cpu, end.broker_cpu - self.broker_cpu
        return Rate(done / elapsed, cpu / done, broker_cpu / done, (cpu + broker_cpu) / elapsed,
                    worker_cpu_per_row=(end.worker_cpu - self.worker_cpu) / done)


def broker_cpu_seconds(broker: Broker) -> float:
    """CPU seconds the broker process has used: on two cores it competes with the consumer."""
    import psutil

    return sum(psutil.Process(broker.pid).cpu_times()[:2])


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process (all threads) and by its JSON worker processes (not
    the broker): unlike rates, this cost does not move when other jobs share the cores.
    (psutil, a bench extra, loads here: ``--rss-only`` runs without it.)"""
    import psutil

    workers = [c for c in psutil.Process().children() if "monitor.decoding.json_workers" in " ".join(c.cmdline())]
    return time.process_time(), sum(sum(w.cpu_times()[:2]) for w in workers)


def bare_rate(broker: Broker, topic: str, fmt: str, dim: int, rows: int, options: dict[str, Any]) -> Rate:
    """Rows/s of a plain consume loop that touches every value and nothing more."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, max_poll_records=2000,
                             **options)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)

    def values() -> list[bytes]:
        return [record.value for records in consumer.poll(timeout_ms=500).values() for record in records]

    try:
        return _consume_rate(values, broker, fmt, dim, rows)
    finally:
        consumer.close()


def confluent_rate(broker: Broker, topic: str, fmt: str, dim: int, rows: int) -> Rate:
    """The same bare loop through confluent-kafka (librdkafka, C), with the properties the daemon's
    confluent source uses. librdkafka prefetches in its own threads up to ``queued.max.messages.kbytes``
    and, once that is full, stops fetching for ``fetch.queue.backoff.ms``: its default 1 s capped a
    run at exactly 43,744 rows/s twice (the source sets 10 ms)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as CTopicPartition

    from monitor.sources.kafka.confluent import POLL_BYTES, librdkafka_config
    from monitor.sources.settings import KafkaSettings

    # the daemon's librdkafka properties (fetch.queue.backoff.ms 10, a 16 MiB prefetch queue, ...)
    settings = KafkaSettings(client="confluent", bootstrap_servers=[broker.bootstrap],
                             group_id=f"bench-confluent-{topic}")
    consumer = Consumer(librdkafka_config(settings))
    consumer.assign([CTopicPartition(topic, 0, OFFSET_BEGINNING)])

    batch = [16]

    def values() -> list[bytes]:
        # consume waits for num_messages or the timeout: ask for about POLL_BYTES, as the source does
        records = consumer.consume(num_messages=batch[0], timeout=0.5)
        if errors := [r.error() for r in records if r.error()]:
            raise RuntimeError(errors[0])
        got = [r.value() for r in records]
        if got:
            batch[0] = max(1, min(2000, POLL_BYTES * len(got) // sum(len(v) for v in got)))
        return got

    try:
        return _consume_rate(values, broker, fmt, dim, rows)
    finally:
        consumer.close()


def _consume_rate(poll: Callable[[], list[bytes]], broker: Broker, fmt: str, dim: int, rows: int) -> Rate:
    """Steady-state rate of counting the rows in every polled value until ``rows`` are seen."""
    seen = 0
    mark: Mark | None = None
    while seen < rows:
        for value in poll():
            if fmt == "binary":
                seen += len(value) // (4 * dim)
            else:
                seen += JSON_EVENTS_PER_MESSAGE if fmt == "json-array" else 1
        if mark is None and seen >= STEADY_FROM * rows:
            mark = Mark.now(seen, broker)
    assert mark is not None
    return mark.rate(rows, broker)


def daemon_rate(broker: Broker, topic: str, rows: int, state_dir: Path, precision: str = "float64",
                options: dict[str, Any] | None = None, client: str = "kafka-python",
                settings_overrides: dict[str, Any] | None = None) -> Rate:
    """Rows/s the daemon folds into its windows (decoded, validated, statistics updated), through ``client``."""
    settings = load_settings(
        overrides=deep_merge({
            "window": {"gram_precision": precision},
            "kafka": {
                "bootstrap_servers": broker.bootstrap,
                "embeddings_topic": topic,
                "group_id": f"bench-{topic}-{precision}-{client}",
                "auto_offset_reset": "earliest",
                "options": {**FAST_GROUP_OPTIONS, **(options or {})},
                **client_settings(client),
            },
            "http": {"host": "127.0.0.1", "port": 0},
            "refresh_seconds": 3600,
            "state_dir": str(state_dir),
        }, settings_overrides or {})
    )
    monitor = Monitor(settings)
    monitor.start()
    try:
        mark: Mark | None = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            state = monitor.registry.get("bench", "docs")
            done = state.records_total if state else 0
            if mark is None and done >= STEADY_FROM * rows:
                mark = Mark.now(done, broker)
                paused_from = monitor.pipeline.backpressure_seconds()
            if done >= rows:
                rate = mark.rate(rows, broker)
                paused = monitor.pipeline.backpressure_seconds() - paused_from
                return replace(rate, paused_share=paused / (time.perf_counter() - mark.at), rss_mb=_rss_mb())
            time.sleep(0.02)  # sample sparsely: this loop competes for the GIL
        raise RuntimeError(f"daemon consumed only {done} of {rows} rows in 600 s")
    finally:
        monitor.stop()


def process_memory(broker: Broker, topic: str, rows: int, client: str, workdir: Path,
                   settings_overrides: dict[str, Any] | None = None) -> tuple[float, float]:
    """MB resident (VmRSS, VmHWM) of ``embedding-monitor run`` through ``client``, its JSON worker
    included, once it has counted the whole topic: the daemon's own memory, which the in-process
    runs above cannot tell apart from the bench's."""
    import psutil
    import yaml

    from tests.support import daemons
    from tests.support.scrape import scrape, value

    config = workdir / f"rss-{client}.yaml"
    config.write_text(yaml.safe_dump(deep_merge({
        "source": "kafka", "state_dir": str(workdir / f"state-{client}"), "refresh_seconds": 5,
        "http": {"host": "127.0.0.1"},
        "kafka": {"bootstrap_servers": broker.bootstrap, "embeddings_topic": topic, "group_id": f"rss-{topic}-{client}",
                  "auto_offset_reset": "earliest", "options": dict(FAST_GROUP_OPTIONS), **client_settings(client)},
    }, settings_overrides or {})))
    with daemons.process("--config", str(config), log=workdir / f"rss-{client}.log") as daemon:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                done = value(scrape(daemon.port), "embmon_records_total", model="bench", stream="docs") or 0
            except OSError:
                done = 0
            if done >= rows:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{client}: the daemon process counted only {done} of {rows} rows in 300 s")
        processes = [psutil.Process(daemon.proc.pid), *psutil.Process(daemon.proc.pid).children(recursive=True)]
        status = [dict(line.split(":", 1) for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                       if ":" in line) for p in processes]
        rss = sum(int(s["VmRSS"].split()[0]) for s in status) / 1024
        peak = sum(int(s["VmHWM"].split()[0]) for s in status) / 1024
    return rss, peak


def refresh_time(dim: int = 768, rows: int = 10_000) -> float:
    settings = load_settings(overrides={"http": {"host": "127.0.0.1", "port": 0}, "source": "synthetic"})
    monitor = Monitor(settings)
    x = np.random.default_rng(0).standard_normal((10_000, dim)).astype(np.float32)
    for start in range(0, rows, 1000):
        monitor.registry.apply(EmbeddingBatch("m", "s", x[start % 10_000 :][:1000]), now=time.time())
    monitor.refresh()  # warm-up (torch/BLAS initialisation)
    best = min(_timed(monitor.refresh) for _ in range(3))
    monitor.http.stop()
    return best


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def rss_with_models(models: int = 3, dim: int = 768) -> float:
    """MB resident after filling every sub-window and reservoir of ``models`` streams at ``dim``.

    Run in a fresh process (``--rss-only``): heap left over by the Kafka runs would inflate it.
    """
    settings = load_settings(overrides={"http": {"host": "127.0.0.1", "port": 0}, "source": "synthetic"})
    monitor = Monitor(settings)
    rng = np.random.default_rng(1)
    step = settings.window.seconds / settings.window.subwindows
    now = time.time()
    for sub in range(settings.window.subwindows):
        for m in range(models):
            for _ in range(4):
                batch = rng.standard_normal((1000, dim)).astype(np.float32)
                monitor.registry.apply(EmbeddingBatch(f"model-{m}", "docs", batch), now=now + sub * step)
    monitor.clock = lambda: now + (settings.window.subwindows - 1) * step
    monitor.refresh()
    gc.collect()
    rss = _rss_mb()
    monitor.http.stop()
    return rss


TORCH_IMPORT = """
from pathlib import Path
import numpy, scipy.linalg, scipy.optimize  # what the daemon loads besides torch
def rss():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024
before = rss()
import torch
print(rss() - before)
"""


def torch_import_mb() -> float:
    """Resident MB that importing torch adds in a fresh process that already has numpy and scipy."""
    out = subprocess.run([sys.executable, "-c", TORCH_IMPORT], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


GOALS = {("binary", 384): 0.9, ("binary", 768): 0.8}
JSON_GOALS = {"kafka-python": 0.8, "confluent": 1.2}  # x the bare kafka-python loop
REFRESH_GOAL_MS = 70
RSS_GOAL_MB = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case", action="append", help="FORMAT:DIM, e.g. binary:768 (repeatable; default all)")
    parser.add_argument("--skip-extras", action="store_true", help="no refresh or memory measurement")
    parser.add_argument("--precision", action="append", choices=("float64", "float32"),
                        help="binary cases: the statistics' precision (repeatable; default both)")
    parser.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a kafka-python consumer option given to the bare consumer and the daemon alike, "
                             "e.g. max_partition_fetch_bytes=8388608 (repeatable)")
    parser.add_argument("--confluent", action="store_true",
                        help="also time the bare loop through confluent-kafka (librdkafka; the bench extra)")
    parser.add_argument("--process-rss", action="store_true",
                        help="also the resident memory of `embedding-monitor run` with each client, per case")
    parser.add_argument("--json-workers", type=int, help="decoding.json_workers for the daemon (default: its default)")
    parser.add_argument("--librdkafka", action="append", default=[], metavar="PROPERTY=VALUE",
                        help="a librdkafka property for the daemon's confluent source (kafka.librdkafka; repeatable)")
    parser.add_argument("--rss-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = dict(_kafka_option(o) for o in args.kafka_option)
    if args.rss_only:
        rss = rss_with_models()
        print(f"torch imported: {'torch' in sys.modules}")
        print(f"{rss:.1f}")
        return
    print(f"load average at start: {_load_average()}; consumer options: {options or 'defaults'}", flush=True)
    scale = 0.2 if args.quick else 1.0
    cases = [
        ("binary", 384, int(200_000 * scale)),
        ("binary", 768, int(100_000 * scale)),
        ("json", 384, int(60_000 * scale)),
        ("json", 768, int(30_000 * scale)),
        ("json-array", 384, int(60_000 * scale)),
    ]
    if args.case:
        wanted = {tuple(c.split(":")) for c in args.case}
        cases = [c for c in cases if (c[0], str(c[1])) in wanted]
    rng = np.random.default_rng(0)
    results = []
    memory: list[tuple[str, int, str, float, float]] = []
    with_broker = Broker().start()
    try:
        for fmt, dim, rows in cases:
            unit = {"binary": ROWS_PER_BINARY_MESSAGE, "json-array": JSON_EVENTS_PER_MESSAGE}.get(fmt, 1)
            rows -= rows % unit
            topic = f"bench-{fmt}-{dim}"
            produce(with_broker, topic, fmt, dim, rows, rng)
            bare = bare_rate(with_broker, topic, fmt, dim, rows, options)
            bares = {"kafka-python": bare}
            if args.confluent:
                peer = bares["confluent"] = confluent_rate(with_broker, topic, fmt, dim, rows)
                print(f"{fmt:>10} d={dim:<4} bare confluent-kafka={peer.rows_per_second:>10,.0f}/s "
                      f"({peer.rows_per_second / bare.rows_per_second:.2f} x kafka-python) "
                      f"cpu/row={peer.cpu_per_row * 1e6:.1f}us broker={peer.broker_cpu_per_row * 1e6:.1f}us "
                      f"cores busy={peer.cores:.2f}", flush=True)
            for precision in (args.precision or ("float64", "float32")) if fmt == "binary" else ("float64",):
                for client in bares:
                    with tempfile.TemporaryDirectory() as tmp:
                        ours = daemon_rate(with_broker, topic, rows, Path(tmp), precision, options, client,
                                           overrides(args, client))
                    results.append((fmt, dim, rows, precision, client, bare, bares[client], ours))
                    print(
                        f"{fmt:>10} d={dim:<4} {precision} {client:<12} rows={rows:<7} "
                        f"bare={bare.rows_per_second:>10,.0f}/s daemon={ours.rows_per_second:>10,.0f}/s "
                        f"ratio={ours.rows_per_second / bare.rows_per_second:.2f} "
                        f"(x own bare {ours.rows_per_second / bares[client].rows_per_second:.2f}) "
                        f"cpu/row bare={bare.cpu_per_row * 1e6:.1f}us daemon={ours.cpu_per_row * 1e6:.1f}us "
                        f"(workers {ours.worker_cpu_per_row * 1e6:.1f}us) "
                        f"broker={ours.broker_cpu_per_row * 1e6:.1f}us cores busy bare={bare.cores:.2f} "
                        f"daemon={ours.cores:.2f} paused={ours.paused_share:.0%} rss={ours.rss_mb:.0f}MB",
                        flush=True,
                    )
                    threading.Event().wait(0.5)
            if args.process_rss:
                with tempfile.TemporaryDirectory() as tmp:
                    for client in bares:
                        rss, peak = process_memory(with_broker, topic, rows, client, Path(tmp), overrides(args, client))
                        memory.append((fmt, dim, client, rss, peak))
                        print(f"{fmt:>10} d={dim:<4} embedding-monitor run, {client}: VmRSS {rss:.0f} MB, "
                              f"VmHWM {peak:.0f} MB (daemon + JSON worker)", flush=True)
    finally:
        with_broker.stop()
    print("\n| format | d | statistics | daemon's client | rows | bare kafka-python rows/s | bare same-client rows/s "
          "| daemon rows/s | daemon / bare kafka-python | daemon / bare same client | goal "
          "| CPU µs/row bare kafka-python | CPU µs/row daemon (JSON workers) | broker CPU µs/row | cores busy daemon "
          "| bench process RSS MB |")
    print("| --- " * 16 + "|")
    for fmt, dim, rows, precision, client, bare, own, ours in results:
        b, o = bare.rows_per_second, ours.rows_per_second
        print(f"| {fmt} | {dim} | {precision} | {client} | {rows:,} | {b:,.0f} | {own.rows_per_second:,.0f} | {o:,.0f} "
              f"| {o / b:.2f} | {o / own.rows_per_second:.2f} | {_goal(fmt, dim, client, b, own.rows_per_second, o)} "
              f"| {bare.cpu_per_row * 1e6:.1f} | {ours.cpu_per_row * 1e6:.1f} ({ours.worker_cpu_per_row * 1e6:.1f}) "
              f"| {ours.broker_cpu_per_row * 1e6:.1f} | {ours.cores:.2f} | {ours.rss_mb:.0f} |")
    if memory:
        print("\n| format | d | client | VmRSS MB (daemon + JSON worker) | VmHWM MB |\n| --- | --- | --- | --- | --- |")
        for fmt, dim, client, rss, peak in memory:
            print(f"| {fmt} | {dim} | {client} | {rss:.0f} | {peak:.0f} |")
    if args.skip_extras:
        return
    refresh = refresh_time()
    longer = refresh_time(rows=200_000)
    print(f"\nrefresh over a 10,000 x 768 window: {refresh * 1000:.0f} ms (goal <= {REFRESH_GOAL_MS} ms); "
          f"over 200,000 records in the same window: {longer * 1000:.0f} ms")
    out = subprocess.run([sys.executable, __file__, "--rss-only"], capture_output=True, text=True, check=True)
    rss, torch_mb = float(out.stdout.split()[-1]), torch_import_mb()
    share = "accounts for" if "torch imported: True" in out.stdout else "would add (not imported on the CPU)"
    print(f"resident memory, 3 models at d=768, all sub-windows and reservoirs full: {rss:.0f} MB "
          f"(goal <= {RSS_GOAL_MB} MB); importing torch {share} {torch_mb:.0f} MB")
    print(f"load average at the end: {_load_average()}")


def overrides(args: argparse.Namespace, client: str) -> dict[str, Any]:
    """Daemon settings from ``--json-workers`` and ``--librdkafka`` (the latter for the confluent client only)."""
    found: dict[str, Any] = {}
    if args.json_workers is not None:
        found["decoding"] = {"json_workers": args.json_workers}
    if client == "confluent" and args.librdkafka:
        found["kafka"] = {"librdkafka": dict(_kafka_option(p) for p in args.librdkafka)}
    return found


def _kafka_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--kafka-option {text!r}: expected KEY=VALUE")
    return key, int(value) if value.lstrip("-").isdigit() else value


def _goal(fmt: str, dim: int, client: str, bare: float, own: float, ours: float) -> str:
    """The goal this row is held to: binary against the bare loop of the same client; JSON d = 384
    against bare kafka-python (0.8 x with the kafka-python source, 1.2 x with librdkafka's)."""
    if (fmt, dim) in GOALS:
        goal = GOALS[(fmt, dim)]
        return f"≥ {goal} x own bare: {'met' if ours / own >= goal else 'missed'}"
    if (fmt, dim) == ("json", 384):
        goal = JSON_GOALS[client]
        return f"≥ {goal} x bare kafka-python: {'met' if ours / bare >= goal else 'missed'}"
    return ""


if __name__ == "__main__":
    main()
