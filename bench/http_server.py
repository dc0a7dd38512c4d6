"""The HTTP port's cost per request: the exporter (monitor/server/) in a child process on loopback,
driven from this one; the server's CPU time per request (from /proc), scrape latency and request
throughput.

The child imports the ``monitor`` package of ``--tree`` (default: this checkout), so two trees
compare side by side, e.g. the parser before h11 and after (docs/benchmarks.md, "The HTTP port"):

    git archive 3eeb8ae | tar -x -C /tmp/before
    python bench/http_server.py --tree /tmp/before --label before
    python bench/http_server.py --label after
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SERVER = """
import sys
from prometheus_client import CollectorRegistry, Gauge
from monitor.server.exporter import HttpServer
from monitor.server.http_server import ConnectionLimits
from monitor.server.security import AuthLimits

registry = CollectorRegistry()
gauge = Gauge("embmon_bench_gauge", "a gauge", ["model", "stream"], registry=registry)
for i in range(int(sys.argv[1])):
    gauge.labels(f"model-{i % 20}", f"stream-{i}").set(i * 0.5)
limits = ConnectionLimits(max_connections=512, max_header_bytes=65536, read_timeout=10, idle_timeout=120,
                          write_timeout=30, workers=4)
server = HttpServer(registry, "127.0.0.1", 0, health=lambda: (True, "ok"), readiness=lambda: (True, "ready"),
                    limits=limits, auth_limits=AuthLimits(5, 60.0, 1))
server.start()
print(server.port, flush=True)
sys.stdin.read()
server.stop()
"""

HEADERS = {"Host": "127.0.0.1", "User-Agent": "Prometheus/2.53.0", "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
           "Accept-Encoding": "gzip", "X-Prometheus-Scrape-Timeout-Seconds": "10"}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_on_one_connection(port: int, path: str, n: int, headers: dict[str, str]) -> list[float]:
    """``n`` GETs on one kept-alive connection (as Prometheus scrapes): each one's seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
            out.append(time.perf_counter() - start)
    finally:
        conn.close()
    return out


def measure(pid: int, port: int, args: argparse.Namespace) -> dict[str, float]:
    results: dict[str, float] = {}
    requests_on_one_connection(port, "/metrics", 20, HEADERS)  # warm-up
    for name, path, n, headers in (("scrape", "/metrics", args.scrapes, HEADERS),
                                   ("scrape_plain", "/metrics", args.scrapes, {**HEADERS, "Accept-Encoding": ""}),
                                   ("healthz", "/healthz", args.requests, {"Host": "127.0.0.1"})):
        used = cpu_seconds(pid)
        seconds = requests_on_one_connection(port, path, n, headers)
        results[f"{name}_server_cpu_us"] = (cpu_seconds(pid) - used) / n * 1e6
        results[f"{name}_median_ms"] = statistics.median(seconds) * 1e3
        results[f"{name}_p99_ms"] = sorted(seconds)[int(0.99 * (n - 1))] * 1e3
    # throughput: ``clients`` kept-alive connections asking /healthz at once
    per_client = args.requests // args.clients
    threads = [threading.Thread(target=requests_on_one_connection, args=(port, "/healthz", per_client,
                                                                          {"Host": "127.0.0.1"}))
               for _ in range(args.clients)]
    start, used = time.perf_counter(), cpu_seconds(pid)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    results["healthz_concurrent_per_s"] = per_client * args.clients / elapsed
    results["healthz_concurrent_server_cpu_us"] = (cpu_seconds(pid) - used) / (per_client * args.clients) * 1e6
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose monitor package serves")
    parser.add_argument("--label", default="")
    parser.add_argument("--series", type=int, default=2000, help="gauge series on /metrics")
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}
    child = subprocess.Popen([sys.executable, "-c", SERVER, str(args.series)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, cwd=args.tree, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        results = measure(child.pid, port, args)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)
    print(json.dumps({"label": args.label, "tree": str(args.tree), "load": os.getloadavg()[0],
                      **{k: round(v, 3) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
