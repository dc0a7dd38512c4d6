"""Dependencies that hang, reset or change under a running index probe, on real engines.

Every cycle must come back by its deadline, counted, and the probe must measure again once the
store is back; thirty frozen cycles must not leave threads or descriptors behind. The relay runs
in a child process (tests/support/relay.py), so the counts are the probe's own.
"""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from monitor.config import Settings
from monitor.decoding.records import EmbeddingBatch
from monitor.index.component import IndexComponent
from monitor.index.sampling import ProbeQuery
from tests.support import vectorstores as vs
from tests.support.probes import probe_context
from tests.support.relay import RelayProcess
from tests.support.waiting import wait_until

SCHEDULING_SLACK = 4.0  # as tests/index/test_deadlines.py: a busy machine may deschedule the cycle's thread
D, K = 16, 5


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with vs.postgres() as uri:
        yield uri


def component(engine: str, section: dict[str, Any], tmp_path: Path, timeout: float,
              census: bool = False) -> IndexComponent:
    probe = {"name": "p", "model": "m", "engine": engine, "k": K, "timeout_seconds": timeout,
             "budget": {"exact_searches": 40},
             "census": {"enabled": census, "grace_seconds": 0, "degenerate_rows": 20, "hub_queries": 2},
             engine: section}
    return IndexComponent(probe_context(Settings(state_dir=tmp_path, index={"probes": [probe]})))


def fill(c: IndexComponent, vectors: np.ndarray, n: int = 10, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        v = vectors[rng.integers(len(vectors))] + 0.2 * rng.normal(size=vectors.shape[1])
        c.probes["p"].buffer.add(ProbeQuery((v / np.linalg.norm(v)).astype(np.float32)), c.context.clock())


def now_cycle(c: IndexComponent) -> tuple[Any, float]:
    """One cycle, backoff cleared (each call here is meant to reach the engine), and its duration."""
    c._skip["p"] = 0
    started = time.monotonic()
    result = c.run_probe("p")
    return result, time.monotonic() - started


def resources() -> tuple[int, int]:
    """Threads and open descriptors, after a collection (a failed connection's socket is closed
    when its exception's reference cycle is collected, not at once)."""
    gc.collect()
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def reasons(c: IndexComponent) -> dict[str, int]:
    return {r: n for (_, r), n in c.snapshot.errors.items()}


@pytest.mark.slow  # thirty cycles of ~2.5 s each
def test_thirty_frozen_cycles_return_in_time_and_leave_no_threads_or_descriptors(
    server: str, tmp_path: Path
) -> None:
    """Frozen at describe time (the cycle's first statement; the watchdog's cancel request goes
    through the same frozen network) and frozen at connect, alternately."""
    vectors = vs.unit_rows(300, D, seed=1)
    vs.load_pg_typed(server, "frozen30", vectors)
    timeout = 4.0
    with RelayProcess(vs.socket_path(server)) as relay:
        c = component("pgvector", {"dsn": f"postgresql://postgres@127.0.0.1:{relay.port}/postgres",
                                   "table": "frozen30"}, tmp_path, timeout)
        fill(c, vectors)
        result, _ = now_cycle(c)
        assert result is not None
        before = resources()
        times, frozen = [], {"timeout": 0, "unreachable": 0}
        for i in range(30):
            if i % 2 == 0:  # a healthy cycle, then frozen on the open connection
                relay.thaw()
                healthy(c)
                relay.freeze()
            counted = dict(reasons(c))
            result, elapsed = now_cycle(c)
            assert result is None
            times.append(elapsed)
            for reason, n in reasons(c).items():
                frozen[reason] = frozen.get(reason, 0) + n - counted.get(reason, 0)
        after = resources()
        relay.thaw()
        healthy(c)
        print(f"30 frozen cycles: max {max(times):.2f}s, median {sorted(times)[15]:.2f}s (timeout {timeout}s); "
              f"threads {before[0]} -> {after[0]}, fds {before[1]} -> {after[1]}; frozen cycles counted {frozen}")
        assert max(times) < timeout + SCHEDULING_SLACK, times
        assert sum(frozen.values()) == 30 and set(frozen) == {"timeout", "unreachable"}, frozen
        assert after[0] <= before[0] and after[1] <= before[1] + 1, (before, after)
        c.close()


def healthy(c: IndexComponent) -> None:
    """A cycle against the thawed store succeeds (a few tries: a loaded machine may miss a short deadline)."""
    for _ in range(5):
        result, _ = now_cycle(c)
        if result is not None:
            assert result.queries == 10
            return
    raise AssertionError(f"no healthy cycle after the thaw: {reasons(c)}")


def test_the_probe_session_terminated_mid_statement_is_a_counted_failure_then_recovers(
    server: str, tmp_path: Path
) -> None:
    vectors = vs.unit_rows(200, D, seed=2)
    vs.load_pg_typed(server, "terminated", vectors)
    c = component("pgvector", {"dsn": server, "table": "terminated"}, tmp_path, 30.0)
    fill(c, vectors)
    assert now_cycle(c)[0] is not None
    release, locked = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(server) as locker:
            locker.execute("LOCK TABLE terminated IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    out: list[tuple[Any, float]] = []
    try:
        assert locked.wait(30)
        cycle = threading.Thread(target=lambda: out.append(now_cycle(c)))
        cycle.start()
        with psycopg.connect(server, autocommit=True) as admin:
            waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%terminated%'"
            wait_until(lambda: admin.execute(waiting).fetchone() is not None, timeout=30,
                       message="the probe's statement waits on the lock")
            row = admin.execute(waiting).fetchone()
            assert row is not None
            admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        cycle.join(30)
        assert out and out[0][0] is None and out[0][1] < 30
    finally:
        release.set()
        holder.join()
    assert reasons(c) == {"unreachable": 1}
    result, _ = now_cycle(c)
    assert result is not None and result.queries == 10
    c.close()


@pytest.mark.parametrize("engine", ["pgvector", pytest.param("lancedb", marks=pytest.mark.slow)])  # LanceDB: 6 s
def test_a_table_recreated_with_another_dimension_and_id_type_is_measured_next_cycle(
    engine: str, server: str, tmp_path: Path
) -> None:
    old = vs.unit_rows(200, D, seed=3)
    new = vs.unit_rows(150, 8, seed=4)
    ids = [f"doc-{i}" for i in range(len(new))]
    lance = tmp_path / "lance"
    if engine == "pgvector":
        vs.load_pg_typed(server, "remade", old)
        section: dict[str, Any] = {"dsn": server, "table": "remade"}
    else:
        vs.load_lance_typed(lance, "remade", old)
        section = {"uri": str(lance), "table": "remade"}
    c = component(engine, section, tmp_path, 30.0, census=True)
    probe = c.probes["p"]
    fill(c, old)
    first = tuple(str(i) for i in range(1, 21))
    probe.on_embeddings(EmbeddingBatch(model="m", stream="s", vectors=old[:20], ids=first), c.context.clock())
    result, _ = now_cycle(c)
    assert result is not None and result.census is not None and result.census.missing == 0
    if engine == "pgvector":  # text ids now, 8 dimensions
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute("DROP TABLE remade")
            conn.execute("CREATE TABLE remade (id text PRIMARY KEY, embedding vector(8))")
            for ident, v in zip(ids, new, strict=True):
                conn.execute("INSERT INTO remade VALUES (%s, %s)", (ident, vs.literal(v)))
    else:
        shutil.rmtree(lance / "remade.lance")
        vs.load_lance(lance, "remade", ids, new, ["a"] * len(new))
    fill(c, new, seed=1)
    probe.on_embeddings(EmbeddingBatch(model="m", stream="s", vectors=new[:20], ids=tuple(ids[:20])),
                        c.context.clock())
    result, _ = now_cycle(c)
    assert result is not None, reasons(c)
    assert result.queries == 10 and result.skipped == {"dimension": 10}
    assert result.census is not None and result.census.sampled == 20 and result.census.missing == 20  # the old ids
    assert reasons(c) == {}
    c.close()


@pytest.mark.parametrize("damage", ["deleted", pytest.param("corrupt_manifest", marks=pytest.mark.slow)])  # 2.9 s CPU
def test_a_lancedb_directory_deleted_or_corrupted_is_a_counted_failure_then_recovers(
    damage: str, tmp_path: Path
) -> None:
    vectors = vs.unit_rows(200, D, seed=5)
    lance = tmp_path / "lance"
    vs.load_lance_typed(lance, "docs", vectors)
    c = component("lancedb", {"uri": str(lance), "table": "docs"}, tmp_path, 10.0, census=True)
    fill(c, vectors)
    assert now_cycle(c)[0] is not None
    saved = tmp_path / "saved"
    shutil.copytree(lance, saved)
    if damage == "deleted":
        shutil.rmtree(lance)
    else:
        for manifest in (lance / "docs.lance" / "_versions").iterdir():
            manifest.write_bytes(b"\x00garbage" * 64)
    result, elapsed = now_cycle(c)
    assert result is None and elapsed < 10 + SCHEDULING_SLACK
    assert sum(reasons(c).values()) == 1, reasons(c)
    shutil.rmtree(lance, ignore_errors=True)
    shutil.copytree(saved, lance)
    result, _ = now_cycle(c)
    assert result is not None and result.queries == 10, reasons(c)
    c.close()


@pytest.mark.slow  # a daemon process, a frozen database, ~20 s
def test_a_daemon_with_a_frozen_probe_scrapes_refreshes_and_stops_on_sigterm(server: str, tmp_path: Path) -> None:
    import yaml

    from tests.support import daemons
    from tests.support.scrape import scrape, value

    vectors = vs.unit_rows(200, D, seed=7)
    vs.load_pg_typed(server, "daemon_frozen", vectors)
    with RelayProcess(vs.socket_path(server)) as relay:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({
            "source": "synthetic",
            "synthetic": {"models": [{"name": "m", "dim": D}], "rate": 200.0, "batch_size": 20,
                          "interactions": {"rate": 50.0, "catalog_size": 200}},
            "index": {"probes": [{
                "name": "pg", "model": "m", "engine": "pgvector", "interval_seconds": 0.5, "timeout_seconds": 4,
                "backoff_max_seconds": 1, "budget": {"exact_searches": 20}, "census": {"enabled": False},
                "pgvector": {"dsn": f"postgresql://postgres@127.0.0.1:{relay.port}/postgres",
                             "table": "daemon_frozen"}}]},
        }))
        with daemons.process("--config", str(config), "--state-dir", str(tmp_path / "state"),
                             "--refresh-seconds", "0.5", log=tmp_path / "daemon.log") as daemon:
            def runs(outcome: str) -> float:
                return value(scrape(daemon.port), "embmon_index_probe_runs_total", probe="pg", outcome=outcome) or 0

            wait_until(lambda: runs("success") >= 1, timeout=60, message="the probe measured through the relay")
            relay.freeze()
            wait_until(lambda: (value(scrape(daemon.port), "embmon_index_errors_total", probe="pg", reason="timeout")
                                or 0) + (value(scrape(daemon.port), "embmon_index_errors_total", probe="pg",
                                               reason="unreachable") or 0) >= 2,
                       timeout=60, message="frozen cycles counted")
            # /metrics answers, quickly, and ingest goes on while the probe is frozen
            slowest, records = 0.0, []
            for _ in range(10):
                started = time.monotonic()
                s = scrape(daemon.port, timeout=5)
                slowest = max(slowest, time.monotonic() - started)
                records.append(value(s, "embmon_records_total", model="m", stream="documents") or 0)
                time.sleep(0.3)
            assert records[-1] > records[0], records
            # a cycle is (almost surely) in its frozen connect now: the next starts 0.5-1 s after the last
            time.sleep(1.0)
            started = time.monotonic()
            code = daemon.stop(timeout=10)
            stopped = time.monotonic() - started
    print(f"daemon with a frozen probe: slowest scrape {slowest:.2f}s, SIGTERM to exit {stopped:.2f}s (rc {code})")
    assert code == 0 and stopped < 10
    assert slowest < 2.0


def test_a_database_port_that_accepts_and_resets_is_unreachable_at_once(tmp_path: Path) -> None:
    import socket
    import struct

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def reset_all() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            conn.close()

    thread = threading.Thread(target=reset_all, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        c = component("pgvector", {"dsn": f"postgresql://postgres@127.0.0.1:{port}/postgres", "table": "docs"},
                      tmp_path, 10.0)
        fill(c, vs.unit_rows(20, D))
        for _ in range(3):
            result, elapsed = now_cycle(c)
            assert result is None and elapsed < 5
        assert reasons(c) == {"unreachable": 3}
        c.close()
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_frozen_database_behind_a_two_host_dsn_cannot_hold_the_cycle(server: str, tmp_path: Path) -> None:
    """An HA DSN names two hosts (primary, standby): libpq gives each attempt the whole connect
    timeout, so both frozen must still end by the cycle's cutoff, not twice it."""
    timeout = 4.0
    with RelayProcess(vs.socket_path(server)) as relay:
        dsn = f"host=127.0.0.1,127.0.0.1 port={relay.port},{relay.port} user=postgres dbname=postgres"
        c = component("pgvector", {"dsn": dsn, "table": "docs", "connect_timeout_seconds": 30}, tmp_path, timeout)
        fill(c, vs.unit_rows(20, D))
        relay.freeze()
        result, elapsed = now_cycle(c)
        print(f"two-host frozen connect returned after {elapsed:.2f}s (timeout {timeout}s)")
        assert result is None and reasons(c) == {"unreachable": 1}
        assert elapsed < timeout * 0.85 + 0.5, elapsed
        c.close()
