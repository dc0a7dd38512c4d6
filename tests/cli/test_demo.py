"""``embedding-monitor demo`` as a user runs it: a subprocess whose stdout is a pipe (so it prints the
view's plain lines), its log in a file, real scrapes of its port.

The intervals are shortened (drift every 2.5 s, a 10 s window) so each test takes about a minute;
the demo's own sizing is measured in docs/drift.md ("In the daemon").
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.broker import free_port
from tests.support.daemons import cli_argv, cpu_wait, starved
from tests.support.paths import REPO
from tests.support.scrape import Samples, scrape, value
from tests.support.waiting import wait_until

DRIFT_INTERVAL = 2.5
SHORT = f"""
window: {{seconds: 10, subwindows: 5, reservoir_size: 1000}}
refresh_seconds: 1
drift:
  interval_seconds: {DRIFT_INTERVAL}
  window_sample_size: 500
  reference_sample_size: 500
  reference: {{records: 1500}}
"""
# the demo ends by itself after this long, should a test die without stopping it: longer than any
# test's waits (180 s for the first verdicts and 240 s more; a loaded machine uses them up)
DURATION = 900  # seconds: beyond every wait below (180 s for the first verdicts, 480 s for 20 cycles)
STREAMS = ("minilm-demo/documents", "mpnet-demo/documents", "minilm-demo/catalog", "mpnet-demo/catalog")


class Demo:
    """A running ``embedding-monitor demo --config FILE``; stopped with SIGTERM like Ctrl-C."""

    def __init__(self, tmp_path: Path, synthetic: str):
        self.config = tmp_path / "demo.yaml"
        self.config.write_text(f"synthetic:\n{synthetic}{SHORT}")
        self.log = tmp_path / "demo.log"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "monitor", "demo", "--config", str(self.config), "--metrics-port", str(self.port),
             "--log-file", str(self.log), "--duration", str(DURATION)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def out(self) -> str:
        return "\n".join(self.lines)

    def scrape(self) -> Samples:
        if self.proc.poll() is not None:  # fail now, naming why, not after the wait's time with "refused"
            log = self.log.read_text()[-2000:] if self.log.exists() else "(no log)"
            raise AssertionError(f"the demo exited with status {self.proc.returncode}: {log}")
        return scrape(self.port)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=30)
        self._reader.join(timeout=10)  # the reader owns stdout: it ends at EOF, with every line
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        assert self.proc.returncode == 0, err
        return self.out

    def drift_runs(self) -> float:
        """Drift cycles that ended, in time or past the job's timeout (a starved machine's are late:
        a fresh-clone run under load saw 89 late and 7 in time while the demo waited 3.2 times as
        long for a CPU as it ran)."""
        samples = self.scrape()
        return sum(value(samples, "embmon_job_runs_total", job="drift", outcome=outcome) or 0.0
                   for outcome in ("success", "timeout"))

    def tested_streams(self) -> int:
        samples = self.scrape()
        return sum(
            value(samples, "embmon_drift_p_value", model=s.split("/")[0], stream=s.split("/")[1], test="suite")
            is not None
            for s in STREAMS
        )


def job_outcomes(samples: Samples) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["job"], dict(labels)["outcome"]): v
        for (name, labels), v in samples.items()
        if name == "embmon_job_runs_total"
    }


def blocks(out: str) -> list[list[str]]:
    """The plain view's refreshes: a ``[t=...]`` header and the lines under it."""
    found: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("[t="):
            found.append([line])
        elif found and line.startswith("  "):
            found[-1].append(line)
    return found


@pytest.mark.slow
def test_a_healthy_demo_never_flags_drift_over_twenty_cycles_and_skips_no_job(tmp_path: Path) -> None:
    demo = Demo(tmp_path, "  rate: 300\n  canary_period_seconds: 2\n  phases: [{kind: healthy, seconds: 1000}]\n")
    try:
        wait_until(lambda: demo.tested_streams() == len(STREAMS), timeout=180, interval=0.5, message="first verdicts")
        first, cpu_before = demo.drift_runs(), cpu_wait(demo.proc.pid)
        # 50 s of cycles on the idle machine; a drift run needs CPU, and beside a second job's demo
        # (two demos and a suite on two cores) 20 took over 240 s: the bound is for a stuck job, not a slow one
        wait_until(lambda: demo.drift_runs() >= first + 20, timeout=480, interval=0.5, message="20 more drift cycles",
                   on_timeout=lambda: f"{demo.drift_runs() - first:.0f} came; {job_outcomes(demo.scrape())}; "
                                      f"{starved(demo.proc.pid, cpu_before)[1]}")
        samples = demo.scrape()
        held_off, cpu = starved(demo.proc.pid, cpu_before)
    finally:
        out = demo.stop()
    log = demo.log.read_text()
    # every stream was tested in each of those cycles (a fresh window every refresh), and none flagged
    assert "drifted from its reference" not in log
    for model, stream in (s.split("/") for s in STREAMS):
        assert value(samples, "embmon_drift_detected", model=model, stream=stream, test="suite") == 0
    # canaries matched their pins all along; nothing collapsed
    for model in ("minilm-demo", "mpnet-demo"):
        assert value(samples, "embmon_canary_mismatches_total", model=model) == 0
        assert (value(samples, "embmon_canary_records_total", model=model) or 0) > 0
    # no job skipped (its previous run still going) or overran its timeout, by the daemon's counters and log.
    # The outbound probes run in a pool of their own: on a loaded machine (a parallel test suite) a probe
    # cycle may outlast its interval and its next run is skipped, by design, without touching the others.
    # The core jobs need about one core at these intervals (a refresh a second, drift every 2.5 s). While
    # the daemon got that, they skip or overrun at most 5 % of their runs. The kernel says how long its
    # runnable threads waited for a CPU: measured over this wait, 0.4 of the time they ran on the idle
    # machine and 1.2 beside one busy loop, with no skip, then 1.8 beside two (7 refreshes of 59 skipped)
    # and 2.4 beside three. When they waited more than 1.5 times what they ran, the suite's other workers
    # held the cores: skips are then the scheduler's design working, and what must hold is the rest (the
    # 20 cycles came, none failed, and the log and the view say what was skipped)
    outcomes = job_outcomes(samples)
    outbound = ("probe:", "index:", "serving", "demo-indexer")
    core = {(job, outcome) for job, outcome in outcomes if not job.startswith(outbound)}
    assert {outcome for _, outcome in core} <= {"success", "skipped", "timeout"}, outcomes
    overran = sum(n for (job, outcome), n in outcomes.items() if outcome == "timeout")
    core_runs = sum(n for (job, _), n in outcomes.items() if not job.startswith(outbound))
    core_skips = sum(n for (job, outcome), n in outcomes.items()
                     if not job.startswith(outbound) and outcome != "success")
    assert held_off or core_skips <= max(1, 0.05 * core_runs), (outcomes, cpu)
    assert {outcome for job, outcome in outcomes if job.startswith(outbound)} <= {"success", "skipped", "timeout"}, \
        outcomes
    outbound_skips = core_skips + sum(n for (job, outcome), n in outcomes.items()
                                      if job.startswith(outbound) and outcome != "success")
    assert {job for job, _ in outcomes} >= {"refresh", "drift", "canary", "probe:ann", "probe:clicks"}
    assert overran or "over its" not in log  # the log names every overrun
    assert core_skips or "maximum number of running instances" not in log  # apscheduler logs a core skip
    # the plain view said the same, once per refresh
    views = blocks(out)
    assert len(views) >= 20 * DRIFT_INTERVAL  # a refresh a second
    counts = " 0 skipped, 0 overran" if not outbound_skips else " skipped, 0 overran" if not overran else " overran"
    assert all(counts in view[0] and "phase healthy" in view[0] for view in views)
    assert not any("drift YES" in line or "CHANGED" in line or "collapse YES" in line for v in views for line in v)


@pytest.mark.slow
def test_the_scripted_demo_catches_the_silent_swap_and_names_the_topic_shift(tmp_path: Path) -> None:
    phases = (
        "  phases: [{kind: healthy, seconds: 15}, {kind: swapped, seconds: 15}, {kind: healthy, seconds: 20},\n"
        "           {kind: topic_shift, seconds: 180}]\n  loop: false\n"  # the wait ends when it is named
    )
    demo = Demo(tmp_path, f"  rate: 300\n  canary_period_seconds: 2\n{phases}")

    def canaries_back() -> bool:
        log = demo.log.read_text() if demo.log.exists() else ""
        return "canary minilm-demo/canary-" in log and "is back in line with its reference" in log

    try:
        # named, and with a tenth of the window from what the reference never had (the accumulating
        # detector may flag the shift earlier, while the new topic is still a smaller share); and the
        # canary stream's drift back in line, which a starved machine's late drift cycles can leave
        # until after the naming (a run beside a busy loop, at load 6, stopped before it)
        wait_until(lambda: max(novel_shares(named_topic(blocks(demo.out))), default=0) >= 10 and canaries_back(),
                   timeout=300, interval=1, message="the topic shift named and the canaries' drift back in line")
    finally:
        out = demo.stop()
    views = blocks(out)
    assert views and all(line.startswith(("[t=", "  ")) for v in views for line in v)
    assert "\x1b[" not in out  # a pipe gets plain lines, never terminal control sequences
    by_phase: dict[str, list[list[str]]] = {}
    for view in views:
        by_phase.setdefault(re.search(r"phase (\w+)", view[0]).group(1), []).append(view)  # type: ignore[union-attr]
    swapped = [line for v in by_phase["swapped"] for line in v]
    # the swap: canaries mismatch and drift flags it, while the intrinsic metrics see nothing
    assert any("minilm-demo: canary min cos" in line and "CHANGED" in line for line in swapped)
    assert any("minilm-demo/documents" in line and "drift YES" in line for line in swapped)
    assert not any("collapse YES" in line for line in swapped)
    # the serving incident: the demo's endpoint lower-cases its input; the serving probe's canaries catch it
    assert any("served-demo: canary min cos" in line and "CHANGED" in line for line in swapped)
    # the topic shift: flagged, and the top region's window exemplars are the new topic's own ids
    named = named_topic(views)
    assert named, by_phase["topic_shift"][-1]
    assert max(novel_shares(named)) >= 10  # a share of the window the reference never had
    # and the canaries were back to matching once the old model returned
    assert not any("CHANGED" in line for line in by_phase["topic_shift"][-1])
    assert canaries_back()


def novel_shares(lines: list[str]) -> list[int]:
    """The "novel N%" of each line that says one: the window's share the reference never had."""
    return [int(m.group(1)) for line in lines if (m := re.search(r"novel (\d+)%", line))]


def named_topic(views: list[list[str]]) -> list[str]:
    """Lines of the topic_shift phase where drift flagged a documents stream and named its top region
    by the new topic's own ids."""
    return [
        line
        for view in views
        if "phase topic_shift" in view[0]
        for line in view
        if "documents" in line
        and "drift YES" in line
        and re.search(r"region \d+ \d+%->\d+%( \([^)]*\))? e\.g\. topic-\d+", line)
    ]


@pytest.mark.slow
def test_on_a_terminal_the_view_is_redrawn_in_place_not_printed_line_by_line(tmp_path: Path) -> None:
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "monitor", "demo", "--metrics-port", str(free_port()), "--duration", "6",
         "--log-file", str(tmp_path / "demo.log")],
        stdout=child, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "140", "LINES": "40", "TERM": "xterm-256color"},
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    screen = b"".join(chunks).decode(errors="replace")
    assert screen.count("health and drift per model and stream") >= 2  # drawn, then redrawn
    assert "\x1b[2K" in screen or "\x1b[1A" in screen  # cursor moves back over the last frame: in place
    assert "minilm-demo/documents" in screen and "canaries and retrieval per model" in screen
    assert "[t=" not in screen  # no plain lines on a terminal
    assert "INFO" not in screen  # the log went to its file
    assert "embedding-monitor serving" in (tmp_path / "demo.log").read_text()


def demo_in_temp(tmp_path: Path, prelude: str) -> tuple[Path, subprocess.Popen[str]]:
    """``embedding-monitor demo`` after ``prelude``, its temporary directories under ``tmp_path/tmp``
    (TMPDIR), stdout and stderr together; run from this checkout, so that it imports this ``monitor``."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.Popen(
        cli_argv("demo", "--metrics-port", str(free_port()), "--no-summary", "--log-file", str(tmp_path / "demo.log"),
                 prelude=prelude),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    return temp, proc


def stopped_by_sigterm(proc: subprocess.Popen[str], temp: Path) -> str:
    """SIGTERM the demo, wait for it: it exits 0 and its temporary state directory is gone. Its output."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert not [p.name for p in temp.iterdir() if p.is_dir()], f"the temporary state directory was removed: {out}"
    return out


SLOW_DEMO_BUILD = """
import time
from monitor.daemon import service

built = service.Monitor.__init__

def slowly(self, *args, **kwargs):  # as the demo's build is on a loaded machine
    print("building the demo", flush=True)
    time.sleep(4)
    built(self, *args, **kwargs)

service.Monitor.__init__ = slowly
"""


@pytest.mark.slow  # the build takes 4 s on purpose
def test_a_sigterm_while_the_demo_is_being_built_stops_it_and_removes_its_state_directory(tmp_path: Path) -> None:
    """The demo's handlers go in before its temporary state directory is made: a SIGTERM during the
    build used to kill it by the default action (status -15), leaving that directory behind."""
    temp, proc = demo_in_temp(tmp_path, SLOW_DEMO_BUILD)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "building the demo" in line, line
        assert [p.name for p in temp.iterdir() if p.is_dir()], "the demo's state directory exists while it is built"
        stopped_by_sigterm(proc, temp)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "received SIGTERM; shutting down" in (tmp_path / "demo.log").read_text()


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
    """The demo stopped by SIGTERM while a job it abandoned at the shutdown still writes into its
    temporary state directory (a serving probe pinning its canaries, measured): it exits 0 and the
    directory is removed all the same."""
    temp, proc = demo_in_temp(tmp_path, LATE_WRITER)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("state directory:"):
                break
        stopped_by_sigterm(proc, temp)
    finally:
        if proc.poll() is None:
            proc.kill()
