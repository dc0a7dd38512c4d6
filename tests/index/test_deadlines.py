"""A store that stops answering cannot hold an index probe's cycle past its deadline.

* PostgreSQL behind a loopback relay (tests/support/relay.py) that freezes mid-statement: the
  server has the probe's statement, its answer is stuck in the relay, nothing is closed. The
  statement watchdog cancels, then cuts, the statement at the cycle's cutoff: the cycle comes back
  within ``timeout_seconds``, counted ``timeout``; after the thaw the next cycle succeeds.
* LanceDB whose data file stops answering (a FIFO in its place: a read that blocks in the kernel,
  as on a hung network mount): the call is given up at the cutoff, counted ``timeout``; once the
  file answers again the next cycle succeeds.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from monitor.config import Settings
from monitor.index.component import IndexComponent
from monitor.index.sampling import ProbeQuery
from tests.support import vectorstores as vs
from tests.support.probes import probe_context
from tests.support.relay import FreezableRelay
from tests.support.waiting import wait_until

# The cycle gives its engine call up at 85 % of the timeout; a loaded machine may deschedule the
# waiting thread for a while past that. Without the cutoff the cycle never returns (30 s here),
# so a bound of the timeout plus this slack still tells the two apart.
SCHEDULING_SLACK = 4.0

D, K = 16, 5


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with vs.postgres() as uri:
        yield uri


def component(engine: str, section: dict[str, Any], tmp_path: Path, timeout: float) -> IndexComponent:
    probe = {"name": "p", "model": "m", "engine": engine, "k": K, "timeout_seconds": timeout,
             "budget": {"exact_searches": 40}, "census": {"enabled": False}, engine: section}
    return IndexComponent(probe_context(Settings(state_dir=tmp_path, index={"probes": [probe]})))


def fill(c: IndexComponent, vectors: np.ndarray, n: int = 10) -> None:
    rng = np.random.default_rng(0)
    for _ in range(n):
        v = vectors[rng.integers(len(vectors))] + 0.2 * rng.normal(size=D)
        c.probes["p"].buffer.add(ProbeQuery((v / np.linalg.norm(v)).astype(np.float32)), c.context.clock())


def timed(c: IndexComponent) -> float:
    started = time.monotonic()
    c.run_probe("p")
    return time.monotonic() - started


def test_a_database_that_stops_answering_mid_statement_cannot_hold_the_cycle(server: str, tmp_path: Path) -> None:
    vectors = vs.unit_rows(300, D, seed=1)
    vs.load_pg_typed(server, "frozen", vectors)
    timeout = 4.0
    with FreezableRelay(vs.socket_path(server)) as relay:
        dsn = f"postgresql://postgres@127.0.0.1:{relay.port}/postgres"
        c = component("pgvector", {"dsn": dsn, "table": "frozen"}, tmp_path, timeout)
        fill(c, vectors)
        assert c.run_probe("p") is not None  # connected through the relay, measured
        release = threading.Event()
        locked = threading.Event()

        def hold_lock() -> None:
            with psycopg.connect(server) as locker:
                locker.execute("LOCK TABLE frozen IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(30)

        holder = threading.Thread(target=hold_lock)
        holder.start()
        elapsed: list[float] = []
        cycle = threading.Thread(target=lambda: elapsed.append(timed(c)))
        try:
            assert locked.wait(30)
            cycle.start()

            def waiting_on_the_lock() -> bool:
                with psycopg.connect(server, autocommit=True) as admin:
                    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                        "AND query LIKE '%frozen%'").fetchone()
                return bool(row and row[0])

            wait_until(waiting_on_the_lock, timeout=30, message="the probe's statement waits in the server")
            relay.freeze()  # the statement is in the server; its answer will stop in the relay
        finally:
            release.set()
            holder.join()
        cycle.join(timeout=30)
        assert not cycle.is_alive()
        assert elapsed and elapsed[0] < timeout + SCHEDULING_SLACK, elapsed  # back by the job's deadline
        print(f"frozen-database cycle returned after {elapsed[0]:.2f}s (timeout {timeout}s)")
        assert {r: n for (_, r), n in c.snapshot.errors.items()} == {"timeout": 1}
        relay.thaw()
        assert c.run_probe("p") is None  # backing off one cycle
        result = c.run_probe("p")
        assert result is not None and result.queries == 10  # a new connection: the store is back
        c.close()


@pytest.mark.slow  # 3-6 s idle (LanceDB's import, the given-up call's end), more under load
def test_a_lancedb_store_that_stops_answering_cannot_hold_the_cycle(tmp_path: Path) -> None:
    vectors = vs.unit_rows(300, D, seed=2)
    vs.load_lance_typed(tmp_path / "lance", "docs", vectors)
    timeout = 2.0
    c = component("lancedb", {"uri": str(tmp_path / "lance"), "table": "docs"}, tmp_path, timeout)
    fill(c, vectors)
    assert c.run_probe("p") is not None
    (data,) = list((tmp_path / "lance" / "docs.lance" / "data").iterdir())
    saved = data.read_bytes()
    data.unlink()
    os.mkfifo(data)  # a read of it blocks until something writes: a mount that stopped answering
    times: list[float] = []
    cycle = threading.Thread(target=lambda: times.append(timed(c)), daemon=True)
    cycle.start()
    cycle.join(timeout=30)
    assert times, "the cycle is still waiting on the store"
    elapsed = times[0]
    print(f"hung-LanceDB cycle returned after {elapsed:.2f}s (timeout {timeout}s)")
    assert elapsed < timeout + SCHEDULING_SLACK
    assert {r: n for (_, r), n in c.snapshot.errors.items()} == {"timeout": 1}
    bounded = c.probes["p"].connector._bounded  # type: ignore[attr-defined]
    assert bounded.given_up == 1
    # the store answers again: the blocked read gets its bytes (and fails, its result dropped),
    # then the file is back in place
    writer = os.open(data, os.O_WRONLY | os.O_NONBLOCK)  # the blocked reader's open completes
    try:
        with contextlib.suppress(BrokenPipeError):  # the reader may fail (a FIFO cannot seek) and go first
            os.write(writer, saved[:4096])
    finally:
        os.close(writer)
    restored = data.with_suffix(".restored")
    restored.write_bytes(saved)
    os.replace(restored, data)
    t0 = time.monotonic()
    wait_until(lambda: bounded._hung == 0, timeout=30, message="the given-up call ended")
    print(f"given-up call ended {time.monotonic() - t0:.2f}s after the store answered")
    assert c.run_probe("p") is None  # backing off one cycle
    result = c.run_probe("p")
    assert result is not None and result.queries == 10
    c.close()


@pytest.mark.slow
def test_connecting_to_a_database_that_stops_answering_cannot_hold_the_cycle(server: str, tmp_path: Path) -> None:
    """Frozen before the connection: the start-up message is never answered; connect_timeout (at
    most the time left to the cutoff) bounds it."""
    vectors = vs.unit_rows(100, D, seed=3)
    vs.load_pg_typed(server, "frozen_connect", vectors)
    timeout = 4.0
    with FreezableRelay(vs.socket_path(server)) as relay:
        dsn = f"postgresql://postgres@127.0.0.1:{relay.port}/postgres"
        c = component("pgvector", {"dsn": dsn, "table": "frozen_connect", "connect_timeout_seconds": 30},
                      tmp_path, timeout)
        fill(c, vectors)
        relay.freeze()
        elapsed = timed(c)
        print(f"connect to a frozen database returned after {elapsed:.2f}s (timeout {timeout}s)")
        assert elapsed < timeout + SCHEDULING_SLACK
        assert {r: n for (_, r), n in c.snapshot.errors.items()} == {"unreachable": 1}
        relay.thaw()
        assert c.run_probe("p") is None  # backing off one cycle
        result = c.run_probe("p")
        assert result is not None and result.queries == 10
        c.close()
