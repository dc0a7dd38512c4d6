"""The daemon harness stops what it started, also when the test inside it fails."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support.scrape import http_status
from tests.support.waiting import wait_until


class Failed(Exception):
    """What a failing test body raises."""


def synthetic_settings(tmp_path: Path):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "source": "synthetic", "synthetic": {"models": [{"name": "m", "dim": 4}]},
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path / "state"), "drift": {"enabled": False},
    })


def test_an_in_process_daemon_is_stopped_when_the_block_fails(tmp_path: Path) -> None:
    with pytest.raises(Failed), daemons.monitor(synthetic_settings(tmp_path)) as monitor:
        port = monitor.http.port
        assert http_status(port, "/healthz") == 200 and monitor.pipeline.alive
        raise Failed
    assert monitor.stopping and not monitor.pipeline.alive
    with pytest.raises(OSError):  # the port is closed
        http_status(port, "/healthz")


@pytest.mark.slow
def test_a_daemon_process_is_stopped_when_the_block_fails_and_can_be_killed(tmp_path: Path) -> None:
    args = ("--source", "synthetic", "--state-dir", str(tmp_path / "state"))
    with pytest.raises(Failed), daemons.process(*args, log=tmp_path / "first.log") as first:
        wait_until(lambda: http_status(first.port, "/healthz") == 200, timeout=60, message="serving")
        raise Failed
    assert first.returncode == 0  # SIGTERM on the way out: a clean shutdown
    assert "embedding-monitor stopped" in first.output()
    with daemons.process(*args, log=tmp_path / "second.log") as second:
        wait_until(lambda: http_status(second.port, "/healthz") == 200, timeout=60, message="serving")
        assert second.kill() == -signal.SIGKILL
    assert "embedding-monitor stopped" not in second.output()  # no shutdown path ran
