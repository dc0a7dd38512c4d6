"""Start-up, signals and shutdown: exception-safe start, a second signal forces exit, bounded stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.daemon.lifecycle import StopRequest, capture_signals
from monitor.daemon.service import Monitor
from monitor.sources.base import Source, SourceMessage
from tests.support import daemons
from tests.support.broker import free_port
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until


class Recording(Source):
    """A source that records its lifecycle calls."""

    name = "kafka"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def poll(self, timeout: float) -> list[SourceMessage]:
        time.sleep(min(timeout, 0.05))  # the point: an idle poll blocks for a while, as Kafka's does
        return []

    def close(self) -> None:
        self.calls.append("close")


def settings(tmp_path: Path, port: int = 0):  # type: ignore[no-untyped-def]
    return load_settings(overrides={"http": {"host": "127.0.0.1", "port": port}, "state_dir": str(tmp_path),
                                    "drift": {"enabled": False}, "checkpoint": {"enabled": False}})


def test_a_signal_requests_a_stop_and_a_second_forces_exit() -> None:
    stop, exits = StopRequest(), []
    before = signal.getsignal(signal.SIGTERM)
    with capture_signals(stop, force_exit=exits.append):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5) and exits == []
        os.kill(os.getpid(), signal.SIGINT)
        wait_until(lambda: exits, timeout=5, interval=0.01, message="the forced exit")
    assert exits == [128 + signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is before  # the original handler is back


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


class Unreachable(Recording):
    """A source whose start fails (kafka-python's own errors are retried; this is anything else)."""

    def start(self) -> None:
        super().start()
        raise OSError("broker certificate file unreadable")


def test_a_failed_start_stops_what_had_started_and_binds_nothing_before(tmp_path: Path) -> None:
    with taken_port() as port:
        source = Recording()
        monitor = Monitor(settings(tmp_path, port), source=source)  # constructing binds nothing
        with pytest.raises(OSError):
            monitor.start()
        # the port is bound before the source starts (/healthz answers while a broker is being
        # waited for), so a taken port fails the start before the broker is contacted
        assert source.calls == []
        assert not monitor.jobs.scheduler.running and not monitor.pipeline.alive
        monitor.stop()  # still safe
    source, port = Unreachable(), free_port()
    monitor = Monitor(settings(tmp_path, port), source=source)
    with pytest.raises(OSError, match="certificate"):
        monitor.start()
    assert source.calls == ["start"]  # it did not start, so it is not closed
    with socket.socket() as again:  # the port bound before it is released
        again.bind(("127.0.0.1", port))
    assert not monitor.jobs.scheduler.running and not monitor.pipeline.alive
    monitor.stop()


def test_the_cli_names_the_port_it_could_not_bind(tmp_path: Path) -> None:
    with taken_port() as port:
        proc = subprocess.run(
            [sys.executable, "-m", "monitor", "run", "--source", "synthetic", "--metrics-port", str(port),
             "--state-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=120, env={**os.environ, "EMBMON_HTTP__HOST": "127.0.0.1"},
        )
    assert proc.returncode == 1, proc.stderr
    assert "cannot start" in proc.stderr and "Address already in use" in proc.stderr
    assert "Traceback" not in proc.stderr


SLOW_SHUTDOWN = textwrap.dedent(
    """
    import sys, time
    from monitor.component import Component
    from monitor.config import load_settings
    from monitor.logs import configure_logging
    from monitor.daemon.service import Monitor

    class SlowClose(Component):
        name = "slow"
        def close(self):
            print("closing", flush=True)
            time.sleep(30)  # the point: a close that hangs, which the second signal must cut short

    configure_logging("INFO")
    settings = load_settings(overrides={"source": "synthetic", "http": {"host": "127.0.0.1", "port": 0},
                                        "state_dir": sys.argv[1], "drift": {"enabled": False}})
    Monitor(settings, component_factories=[lambda ctx: SlowClose()]).serve(on_started=lambda: print("up", flush=True))
    """
)


def test_sigterm_stops_cleanly_and_a_second_one_cuts_a_hung_shutdown_short(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", SLOW_SHUTDOWN, str(tmp_path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "up"
            proc.send_signal(signal.SIGTERM)
            assert proc.stdout.readline().strip() == "closing"  # shutdown is under way, and hangs
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=10)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - started < 5
    # the main thread's handler ("without a clean shutdown") or the watchdog reading the wake-up pipe
    # ("without waiting for it"), whichever sees the second signal first
    assert "again" in stderr and "exiting now, without" in stderr, stderr


def test_metrics_include_the_standard_process_and_python_collectors(tmp_path: Path) -> None:
    with daemons.monitor(settings(tmp_path), source=Recording()) as monitor:
        samples = scrape(monitor.http.port)
    rss = value(samples, "process_resident_memory_bytes")
    assert rss is not None and rss > 10 * 2**20
    assert (value(samples, "process_cpu_seconds_total") or 0) > 0
    assert any(name == "python_info" for name, _ in samples)
    assert any(name == "python_gc_collections_total" for name, _ in samples)
