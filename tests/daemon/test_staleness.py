"""The age of the last refresh and checkpoint: exported, and ``/readyz`` fails with the reason once stale.

The daemon's wall clock (``status.wall_clock``, what the scrape-time ages and readiness read) is
moved ahead instead of waiting minutes: the jobs keep running on the real clock, so what they last
did looks that much older.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.daemon.service import Monitor, stale_after
from tests.support import daemons
from tests.support.scrape import http_answer, scrape, value
from tests.support.waiting import wait_until

REFRESH_SECONDS = 30.0  # stale after 120 s
CHECKPOINT_SECONDS = 0.5  # stale after 60.5 s


def readyz(port: int) -> tuple[int, str]:
    return http_answer(port, "/readyz")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Monitor]:
    settings = load_settings(overrides={
        "source": "synthetic", "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path),
        "drift": {"enabled": False}, "refresh_seconds": REFRESH_SECONDS,
        "checkpoint": {"enabled": True, "interval_seconds": CHECKPOINT_SECONDS},
    })
    with daemons.monitor(settings) as monitor:
        wait_until(lambda: monitor.readiness()[0], timeout=30, message="ready")
        wait_until(lambda: (status := monitor.status.checkpoint()) is not None and status.last_success is not None,
                   timeout=30, message="a first checkpoint")
        yield monitor


def ahead(monitor: Monitor, seconds: float) -> None:
    monitor.status.wall_clock = lambda: time.time() + seconds


def test_the_refresh_age_is_exported(daemon: Monitor) -> None:
    samples = scrape(daemon.http.port)
    last = value(samples, "embmon_refresh_last_success_timestamp_seconds")
    age = value(samples, "embmon_refresh_age_seconds")
    assert last is not None and abs(last - time.time()) < REFRESH_SECONDS + 30
    assert age is not None and 0 <= age < REFRESH_SECONDS + 30
    ahead(daemon, 1000)
    later = value(scrape(daemon.http.port), "embmon_refresh_age_seconds")
    assert later is not None and later >= 1000


def test_readyz_says_the_checkpoints_are_stale(daemon: Monitor) -> None:
    assert readyz(daemon.http.port) == (200, "ready")
    ahead(daemon, stale_after(CHECKPOINT_SECONDS) + 5)  # checkpoints keep being written: now they look old
    status, body = readyz(daemon.http.port)
    assert status == 503 and body.startswith("checkpoint stale: the last checkpoint was written"), body
    ahead(daemon, 0)
    assert readyz(daemon.http.port) == (200, "ready")


def test_readyz_says_the_refresh_is_stale_when_it_hangs(daemon: Monitor) -> None:
    release, entered = threading.Event(), threading.Event()
    refresh = daemon.refresher.refresh

    def hung() -> object:
        entered.set()
        release.wait(timeout=120)
        return refresh()

    daemon.refresher.refresh = hung  # type: ignore[method-assign]
    try:
        def hung_now() -> bool:
            """Its next run, now (again, if the first refresh's run had not returned yet: a skip)."""
            daemon.jobs.scheduler.modify_job("refresh", next_run_time=datetime.now(UTC))
            return entered.wait(0.5)

        wait_until(hung_now, timeout=60, message="the refresh hung")
        ahead(daemon, stale_after(REFRESH_SECONDS) + 5)
        status, body = readyz(daemon.http.port)
        assert status == 503 and body.startswith("refresh stale: the last refresh of the window metrics ended"), body
        assert value(scrape(daemon.http.port), "embmon_refresh_age_seconds") > stale_after(REFRESH_SECONDS)
        assert daemon.health() == (True, "ok")  # liveness stays: a restart is not the answer to a slow job
    finally:
        release.set()
