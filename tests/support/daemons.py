"""Daemons for tests, started with the settings a test gives and always stopped.

In this process: ``running(daemon)`` starts a built :class:`~monitor.daemon.service.Monitor` or
:class:`~monitor.scaleout.reducer.Reducer` and stops it on the way out, whatever the test did
(``stop()`` is idempotent, so a test may stop it earlier to look at what the shutdown left);
``monitor(settings, ...)`` and ``reducer(settings, ...)`` build one first; ``stopped_after(daemon)``
only stops, for a test that drives a daemon by hand without starting it. Several at once:
``contextlib.ExitStack``.

In a child process: ``process(*args, log=...)`` runs ``python -m monitor run ARGS`` (or another
command; after a ``prelude`` of Python source, such as one that hides the optional extras) with its
output in ``log`` and ``env`` on top of this process's environment. On the way
out it is sent SIGTERM and, if it has not exited within a bound, SIGKILL. A test that checks the
shutdown itself calls :meth:`DaemonProcess.stop` (SIGTERM, returns the exit status, fails past its
bound) or :meth:`DaemonProcess.kill` (SIGKILL) first.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from monitor.cli.main import role_class
from monitor.config import Settings
from monitor.daemon.service import Daemon, Monitor
from monitor.scaleout.reducer import Reducer
from tests.support.broker import FAST_GROUP_OPTIONS, Broker, free_port
from tests.support.paths import REPO

D = TypeVar("D", bound=Daemon)


@contextlib.contextmanager
def running(daemon: D) -> Iterator[D]:
    """``daemon`` started, and stopped when the block ends (also when ``start`` itself failed)."""
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()


@contextlib.contextmanager
def stopped_after(daemon: D) -> Iterator[D]:
    """``daemon`` as built, for a test that drives it by hand without starting it (applying messages,
    refreshing, checkpointing), stopped when the block ends: ``stop`` closes what the constructor opened."""
    try:
        yield daemon
    finally:
        daemon.stop()


@contextlib.contextmanager
def monitor(settings: Settings, **kwargs: Any) -> Iterator[Monitor]:
    """A running ``Monitor(settings, **kwargs)`` (``source``, ``clock``, ``component_factories``), or the
    role built on it that ``scale_out.role`` names (cli/main.py's ``ROLES``: a replica)."""
    with running(role_class(settings.scale_out.role)(settings, **kwargs)) as daemon:
        yield daemon


@contextlib.contextmanager
def reducer(settings: Settings, **kwargs: Any) -> Iterator[Reducer]:
    """A running ``Reducer(settings, **kwargs)``."""
    with running(Reducer(settings, **kwargs)) as daemon:
        yield daemon


class DaemonProcess:
    """``python -m monitor COMMAND ...`` in a child process, its stdout and stderr in ``log``."""

    def __init__(self, argv: list[str], log: Path, port: int, env: Mapping[str, str] | None = None):
        self.log, self.port = log, port
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        """Everything the process wrote so far."""
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, and its exit status; fails (after a SIGKILL) if it does not exit within ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"the daemon did not exit within {timeout}s of SIGTERM\n{self.output()[-3000:]}"
                ) from None
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL (a crash: no shutdown path runs), and its exit status."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(timeout=10)

    def close(self, timeout: float = 20.0) -> None:
        """Stop it if it still runs: SIGTERM, SIGKILL past ``timeout``; never raises."""
        with contextlib.suppress(AssertionError):
            self.stop(timeout)


def cli_argv(*args: str, prelude: str = "") -> list[str]:
    """The command line of ``python -m monitor ARGS``; with ``prelude``, Python source run first in
    that interpreter (e.g. :func:`tests.support.imports.without`), then the same CLI."""
    if not prelude:
        return [sys.executable, "-m", "monitor", *args]
    return [sys.executable, "-c", f"{prelude}\nfrom monitor.cli.main import main\nraise SystemExit(main())\n", *args]


@contextlib.contextmanager
def process(*args: str, log: Path, port: int | None = None, env: Mapping[str, str] | None = None,
            command: str = "run", prelude: str = "") -> Iterator[DaemonProcess]:
    """``python -m monitor COMMAND ARGS --metrics-port PORT`` (a free port unless given), stopped at
    the end; ``prelude``: see :func:`cli_argv`."""
    port = free_port() if port is None else port
    daemon = DaemonProcess(cli_argv(command, *args, "--metrics-port", str(port), prelude=prelude), log, port, env)
    try:
        yield daemon
    finally:
        daemon.close()


# A process whose runnable threads waited for a CPU more than this many times what they ran was
# held off the cores by others (a parallel suite's workers): measured on the healthy demo, 0.4 on
# the idle 2-core machine, 1.2 beside one busy loop, 1.8 beside two (its refreshes began to skip), 2.4
# beside three
STARVED_WAIT_RATIO = 1.5


def cpu_wait(pid: int) -> tuple[float, float]:
    """Seconds the process's threads waited on a run queue, and ran, so far (``/proc/PID/task/*/schedstat``)."""
    waited = ran = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            running, waiting, _ = stat.read_text().split()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        ran, waited = ran + int(running), waited + int(waiting)
    return waited / 1e9, ran / 1e9


def starved(pid: int, since: tuple[float, float]) -> tuple[bool, str]:
    """Whether process ``pid`` was held off the cores since ``since`` (a :func:`cpu_wait`), and the figures."""
    waited, ran = (after - before for after, before in zip(cpu_wait(pid), since, strict=True))
    return waited > STARVED_WAIT_RATIO * ran, f"waited {waited:.1f} s for a CPU, ran {ran:.1f} s"


def to_another_thread(pid: int, signum: int) -> None:
    """``signum`` to a thread of process ``pid`` other than its main one (``tgkill``), as the kernel may
    hand a process-wide signal to any thread that does not block it."""
    libc = ctypes.CDLL(None, use_errno=True)
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)
    assert others, "the process runs threads beside the main one"
    assert libc.tgkill(pid, others[-1], signum) == 0, ctypes.get_errno()


# a SIGKILLed member stays in its group until its session expires: keep that short
QUICK_SESSION = {**FAST_GROUP_OPTIONS, "session_timeout_ms": 2500, "heartbeat_interval_ms": 500}


def crash_tested(broker: Broker, topic: str, group: str, state_dir: Path, log: Path, port: int | None = None,
                 env: Mapping[str, str] | None = None, client: str = "kafka-python",
                 ) -> contextlib.AbstractContextManager[DaemonProcess]:
    """``embedding-monitor run`` on ``topic`` through ``client`` (``kafka.client``) as the crash tests
    kill it: it commits and checkpoints every 0.3 s, polls 7 records at a time, and a killed one
    leaves the group within seconds."""
    fast = {
        "EMBMON_KAFKA__CLIENT": client,
        "EMBMON_KAFKA__AUTO_OFFSET_RESET": "earliest",
        "EMBMON_KAFKA__COMMIT_INTERVAL_SECONDS": "0.3",
        "EMBMON_KAFKA__POLL_TIMEOUT_SECONDS": "0.2",
        "EMBMON_KAFKA__MAX_POLL_RECORDS": "7",
        "EMBMON_CHECKPOINT__INTERVAL_SECONDS": "0.3",
    }
    return process(
        "--bootstrap-servers", broker.bootstrap, "--embeddings-topic", topic, "--group-id", group,
        "--state-dir", str(state_dir), "--refresh-seconds", "0.3",
        *[f"--kafka-option={k}={v}" for k, v in QUICK_SESSION.items()],
        log=log, port=port, env={**fast, **(env or {})},
    )
