"""The demo stopped by SIGTERM while a job it abandoned at the shutdown still writes into its
temporary state directory (a serving probe pinning its canaries, measured): it exits 0 and the
directory is removed all the same."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.broker import free_port
from tests.support.daemons import cli_argv
from tests.support.paths import REPO

LATE_WRITER = """
import threading, time
from pathlib import Path
from monitor.daemon import service

stop = service.Daemon.stop

def stop_then_write_late(self):
    def write():  # as a job abandoned at the shutdown does, into the state directory
        until, i = time.monotonic() + 1.0, 0  # past the directory's removal, not past the watchdog's grace
        while time.monotonic() < until:
            Path(self.settings.state_dir, f"late-{i}.json").write_text("{}")
            i += 1
            time.sleep(0.001)
    stop(self)
    threading.Thread(target=write, daemon=True).start()
    time.sleep(0.02)

service.Daemon.stop = stop_then_write_late
"""


@pytest.mark.slow  # the demo's build takes several seconds
def test_sigterm_removes_the_state_directory_while_an_abandoned_job_still_writes_into_it(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        cli_argv("demo", "--metrics-port", str(free_port()), "--no-summary", "--log-file", str(tmp_path / "demo.log"),
                 prelude=LATE_WRITER),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,  # this checkout's monitor
        env={**os.environ, "TMPDIR": str(temp)},
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("state directory:"):
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert not [p.name for p in temp.iterdir() if p.is_dir()], f"the temporary state directory was removed: {out}"
