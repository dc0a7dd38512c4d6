"""A second stop signal while a role is still being built ends the process at once with 128 + its
number, whichever thread the kernel handed the signals to: the main thread, busy with the build, runs
Python's handlers only once the build is over."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.daemon.test_shutdown_phases import SLOW_REDUCER_BUILD, UNREACHABLE
from tests.support import daemons
from tests.support.waiting import wait_until


@pytest.mark.slow  # the build takes 4 s on purpose
def test_a_second_signal_to_another_thread_during_the_build_exits_at_once_with_its_status(tmp_path: Path) -> None:
    with daemons.process("--role", "reducer", "--bootstrap-servers", UNREACHABLE, "--state-dir",
                         str(tmp_path / "state"), log=tmp_path / "run.log", prelude=SLOW_REDUCER_BUILD) as daemon:
        wait_until(lambda: "building the reducer" in daemon.output(), timeout=60, message="the build",
                   on_timeout=daemon.output)
        daemons.to_another_thread(daemon.proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        signalled = time.monotonic()
        daemons.to_another_thread(daemon.proc.pid, signal.SIGINT)
        status = daemon.proc.wait(timeout=30)
        took = time.monotonic() - signalled
    print(f"\nSIGTERM then SIGINT, to other threads, during the build: exit {status} {took:.2f} s after the second")
    assert status == 128 + signal.SIGINT, daemon.output()[-3000:]
    assert took < 2.0, daemon.output()[-3000:]  # the build had about 3.7 s left
