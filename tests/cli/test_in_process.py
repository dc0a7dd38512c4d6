"""``monitor.cli.main.main`` called in-process, as tests and embedding programs do: a finite run
returns, and leaves nothing behind in its host process (signal handlers, a wake-up fd, a thread),
and above all does not end that process afterwards.

Each call runs in a fresh interpreter's main thread (the only one that may install handlers), so
that a host killed by a leftover watchdog shows as a missing line, not as a dead test runner.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from monitor.daemon.lifecycle import LEFTOVER_GRACE_SECONDS

HOST = textwrap.dedent(f"""
    import signal, threading, time
    from monitor.cli.main import main

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    status = main(["demo", "--duration", "1", "--no-summary", "--metrics-port", "0",
                   "--refresh-seconds", "1"])
    print("status", status, flush=True)
    print("handlers restored", (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before,
          flush=True)
    print("wake-up fd", signal.set_wakeup_fd(-1), flush=True)
    print("threads", sorted(t.name for t in threading.enumerate() if t.name.startswith("embmon-")), flush=True)
    time.sleep({LEFTOVER_GRACE_SECONDS} + 3)  # past the watchdog's grace, had it been left running
    print("host alive", flush=True)
""")


@pytest.mark.slow  # the demo's build and shutdown take several seconds
def test_a_finite_demo_run_in_process_leaves_nothing_behind_and_does_not_end_its_host() -> None:
    done = subprocess.run([sys.executable, "-W", "error::ResourceWarning", "-c", HOST],
                          capture_output=True, text=True, timeout=180)
    lines = done.stdout.splitlines()
    assert "status 0" in lines, done.stdout + done.stderr[-3000:]
    assert "handlers restored True" in lines
    assert "wake-up fd -1" in lines
    assert "threads []" in lines, done.stdout
    assert "host alive" in lines, f"the host process ended after main() returned: {done.stdout}"
    assert done.returncode == 0
