"""A running daemon whose serving probe points at a hostile server: a storm of attacks (drips, answers
without end, JSON that is quadratic to scan or hides its values, 1xx storms, garbage, redirects),
each cycle ends within the request's deadline and is counted by reason, and the daemon's /metrics
still answers and its refreshes go on."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.serving.component import ServingComponent
from tests.support import daemons
from tests.support import hostile_http as hostile
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

TIMEOUT = 1.0


def respond(body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (content_type, len(body), body)


ATTACKS: dict[str, hostile.Behaviour] = {
    "quadratic-strings": hostile.raw(respond(b'"' + b'\\"' * 250_000)),
    "utf16-hidden-values": hostile.raw(respond(('["\u5c41",' + "[]," * 60_000 + '"x"]').encode("utf-16-le"))),
    "deep": hostile.raw(respond(b"[" * 100_000 + b"]" * 100_000)),
    "million-digits": hostile.raw(respond(b'{"data": [{"index": 0, "embedding": [' + b"7" * 500_000 + b"]}]}")),
    "drip": hostile.drip(b"x" * 100, every=0.3),
    "1xx-storm": hostile.raw(b"HTTP/1.1 100 Continue\r\n\r\n" * 5000),
    "endless-chunked": hostile.endless_chunked(),
    "huge-headers": hostile.huge_headers(),
    "garbage": hostile.raw(b"\x16\x03\x01\x00\xff" + bytes(range(256)) * 4),
    "redirect": hostile.redirect("http://evil.example/", 307),
    "cut": hostile.close_mid_body(b'{"data": [' + b"1," * 1000 + b"1]}"),
}


class Switchable:
    def __init__(self) -> None:
        self.behaviour: hostile.Behaviour = hostile.raw(b"")

    def __call__(self, conn: socket.socket, stop: threading.Event) -> None:
        self.behaviour(conn, stop)


def test_a_storm_of_attacks_on_the_serving_probe_leaves_the_daemon_serving(tmp_path: Path) -> None:
    switch = Switchable()
    with hostile.serving(switch) as server:
        settings = load_settings(overrides={
            "source": "synthetic", "state_dir": str(tmp_path / "state"), "refresh_seconds": 0.5,
            "http": {"host": "127.0.0.1", "port": 0}, "drift": {"enabled": False},
            "synthetic": {"rate": 100.0, "batch_size": 10},
            "serving": {"endpoints": [{"model": "hostile", "url": server.url + "/v1/embeddings",
                                       "request_timeout_seconds": TIMEOUT}],
                        "interval_seconds": 3600.0},
        })
        with daemons.running(Monitor(settings)) as monitor:
            port = monitor.http.port
            probe = next(c for c in monitor.components if isinstance(c, ServingComponent))
            refreshed = wait_until(lambda: value(scrape(port), "embmon_refresh_duration_seconds_count"),
                                   timeout=30, message="a first refresh")
            took: dict[str, float] = {}
            for _ in range(2):
                for name, behaviour in ATTACKS.items():
                    switch.behaviour = behaviour
                    probe._state["hostile"].skip_until = 0.0  # no back-off between attacks
                    start = time.monotonic()
                    probe.run()
                    took[name] = max(took.get(name, 0.0), time.monotonic() - start)
                    assert http_status(port, "/metrics") == 200, name
            print("slowest cycle per attack (s):", {k: round(v, 2) for k, v in took.items()})
            assert max(took.values()) < TIMEOUT + 3.0, took
            samples = scrape(port)
            errors = {reason: value(samples, "embmon_serving_errors_total", model="hostile", reason=reason)
                      for reason in ("oversized", "not_json", "timeout", "bad_response", "redirect")}
            print("serving errors by reason:", errors)
            failed = value(samples, "embmon_serving_cycles_total", model="hostile", outcome="failed")
            assert failed == 2 * len(ATTACKS), failed
            assert (errors["oversized"] or 0) >= 2 * 3 and (errors["timeout"] or 0) >= 2
            wait_until(lambda: (value(scrape(port), "embmon_refresh_duration_seconds_count") or 0) > refreshed + 2,
                       timeout=30, message="refreshes go on after the storm")
