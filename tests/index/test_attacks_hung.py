"""Dependencies that hang, reset or change under a running index probe, on real engines.

Every cycle must come back by its deadline, counted, and the probe must measure again once the
store is back; thirty frozen cycles must not leave threads or descriptors behind. The relay runs
in a child process (tests/support/relay.py), so the counts are the probe's own.
"""

from __future__ import annotations

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
    timeout = 3.0
    with RelayProcess(vs.socket_path(server)) as relay:
        c = component("pgvector", {"dsn": f"postgresql://postgres@127.0.0.1:{relay.port}/postgres",
                                   "table": "frozen30"}, tmp_path, timeout)
        fill(c, vectors)
        result, _ = now_cycle(c)
        assert result is not None
        before = resources()
        times = []
        for i in range(30):
            if i % 2 == 0:  # a healthy cycle, then frozen on the open connection
                relay.thaw()
                result, _ = now_cycle(c)
                assert result is not None and result.queries == 10, reasons(c)
                relay.freeze()
            result, elapsed = now_cycle(c)
            assert result is None
            times.append(elapsed)
        after = resources()
        relay.thaw()
        result, _ = now_cycle(c)
        assert result is not None and result.queries == 10
        print(f"30 frozen cycles: max {max(times):.2f}s, median {sorted(times)[15]:.2f}s (timeout {timeout}s); "
              f"threads {before[0]} -> {after[0]}, fds {before[1]} -> {after[1]}; errors {reasons(c)}")
        assert max(times) < timeout + SCHEDULING_SLACK, times
        assert sum(reasons(c).values()) == 30 and set(reasons(c)) <= {"timeout", "unreachable"}
        assert after[0] <= before[0] and after[1] <= before[1] + 1, (before, after)
        c.close()


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


@pytest.mark.parametrize("damage", ["deleted", "corrupt_manifest"])
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
