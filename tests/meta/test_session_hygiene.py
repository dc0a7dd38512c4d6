"""tests/conftest.py's session rules, run on throwaway test files in a pytest of their own:

* a socket a test leaves open in a reference cycle fails that test (its teardown), not the next one
  whose garbage collection happens to find it; a thread left running fails its module's last test;
* every test's times are recorded (``EMBMON_TEST_DURATIONS``);
* with ``EMBMON_FAST_TIER_SECONDS``, a test not marked slow over the limit fails the run, named;
  with ``EMBMON_FAST_TIER_BUDGET_SECONDS``, a session over the budget fails it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INI = """[pytest]
markers =
    slow: left out of the fast tier
filterwarnings =
    error
"""


def run_pytest(tmp_path: Path, source: str, **env: str) -> tuple[int, str, dict]:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text(  # the suite's conftest, its private fixture included
        "import tests.conftest as suite\nglobals().update({k: v for k, v in vars(suite).items() if k[:2] != '__'})\n")
    (tmp_path / "test_throwaway.py").write_text(source)
    durations = tmp_path / "durations.json"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "EMBMON_TEST_DURATIONS": str(durations), **env}
    for variable in ("EMBMON_FAST_TIER_SECONDS", "EMBMON_FAST_TIER_BUDGET_SECONDS"):
        if variable not in env:  # the outer run's (scripts/test --fast sets both)
            environment.pop(variable, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=120)
    recorded = json.loads(durations.read_text()) if durations.exists() else {}
    return done.returncode, done.stdout + done.stderr, recorded


def test_a_socket_left_in_a_cycle_fails_the_test_that_left_it(tmp_path: Path) -> None:
    code, output, recorded = run_pytest(tmp_path, """
import gc
import socket

def test_leaves_a_socket():
    sock = socket.socket()
    cycle = [sock]
    cycle.append(cycle)

def test_after_it_collects_garbage():
    gc.collect()
""")
    assert code == 1, output
    assert "ERROR at teardown of test_leaves_a_socket" in output and "ResourceWarning" in output, output
    assert "1 error" in output and "2 passed" in output, output  # the next test is not blamed
    assert set(recorded) == {f"test_throwaway.py::{name}" for name in ("test_leaves_a_socket",
                                                                       "test_after_it_collects_garbage")}
    assert all(t["wall_s"] >= 0 and t["cpu_s"] >= 0 for t in recorded.values())


def test_a_thread_left_running_fails_the_last_test_of_its_module(tmp_path: Path) -> None:
    code, output, _ = run_pytest(tmp_path, """
import threading

def test_leaves_a_thread():
    threading.Thread(target=threading.Event().wait, name="left-behind", daemon=True).start()
""", EMBMON_THREAD_GRACE_SECONDS="0.5")  # the thread never ends: the run waits out the grace
    assert code == 1, output
    assert "ERROR at teardown of test_leaves_a_thread" in output and "left-behind (daemon)" in output, output


@pytest.mark.slow  # 5.2 s in all: a pytest run inside the test
def test_a_fast_tier_test_over_the_limit_fails_the_run_and_is_named(tmp_path: Path) -> None:
    source = """
import time
import pytest

def test_quick():
    pass

def test_long():
    time.sleep(0.6)

@pytest.mark.slow
def test_long_and_marked():
    time.sleep(0.6)
"""
    # a limit so small that no load can scale it past 0.6 s (2 cores at load 100: 0.25 s)
    code, output, recorded = run_pytest(tmp_path, source, EMBMON_FAST_TIER_SECONDS="0.005")
    assert code == 1, output
    assert "fast tier over its limits (0.005 s a test" in output and "test_throwaway.py::test_long:" in output, output
    assert "test_long_and_marked:" not in output, output
    assert recorded["test_throwaway.py::test_long_and_marked"]["slow"] is True
    code, output, _ = run_pytest(tmp_path, source)  # without the variable: no limit
    assert code == 0, output


def test_a_session_over_the_tier_budget_fails_the_run_and_says_so(tmp_path: Path) -> None:
    source = """
import time

def test_one():
    time.sleep(0.3)
"""
    # 0.3 s of sleep against a budget of 0.001 s: no load can scale it past (2 cores at load 100: 0.05 s)
    code, output, _ = run_pytest(tmp_path, source, EMBMON_FAST_TIER_BUDGET_SECONDS="0.001")
    assert code == 1, output
    assert "the tier:" in output and "EMBMON_FAST_TIER_BUDGET_SECONDS=0.001" in output, output
    assert "1 passed" in output, output  # the test passed: the budget failed the run
