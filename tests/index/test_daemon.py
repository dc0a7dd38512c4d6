"""The index probes in a running daemon: scraped, isolated from ingest, and a dead database is a count.

The synthetic source streams interaction events with query vectors (and a catalog with ids) for
model ``m``; one index probe searches a real LanceDB table built from the catalog ids, a second
points at a PostgreSQL that is not there. The LanceDB probe must publish recall and census
values, the pgvector one must count ``unreachable`` failures and back off, and ingest must go on
throughout: neither probe touches the ingest thread beyond its hooks, and a scrape reads snapshots.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support import vectorstores as vs
from tests.support.broker import free_port
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

DIM = 16


@pytest.mark.slow
def test_index_probes_in_the_daemon(tmp_path: Path) -> None:
    rows = vs.unit_rows(200, DIM, seed=2)
    vs.load_lance(tmp_path / "lance", "catalog", [f"item-{i}" for i in range(200)], rows,
                  ["a" if i % 2 else "b" for i in range(200)])
    probe = {"model": "m", "interval_seconds": 0.5, "timeout_seconds": 20, "budget": {"exact_searches": 40},
             "census": {"stream": "catalog", "grace_seconds": 0, "hub_queries": 5, "degenerate_rows": 50}}
    settings = load_settings(overrides={
        "source": "synthetic",
        "synthetic": {"models": [{"name": "m", "dim": DIM}], "rate": 200.0, "batch_size": 20,
                      "interactions": {"rate": 50.0, "catalog_size": 200, "catalog_period_seconds": 1.0}},
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path / "state"), "refresh_seconds": 0.5,
        "index": {"probes": [
            {"name": "lance", "engine": "lancedb", **probe,
             "lancedb": {"uri": str(tmp_path / "lance"), "table": "catalog", "id_column": "id"}},
            {"name": "pg", "engine": "pgvector", **probe,
             "pgvector": {"dsn": f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres", "table": "docs",
                          "connect_timeout_seconds": 1}},
        ]},
    })
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port

        def measured() -> bool:
            s = scrape(port)
            return ((value(s, "embmon_index_probe_runs_total", probe="lance", outcome="success") or 0) >= 2
                    and (value(s, "embmon_index_errors_total", probe="pg", reason="unreachable") or 0) >= 2
                    and (value(s, "embmon_index_census_ids", probe="lance", model="m") or 0) > 0)

        wait_until(measured, timeout=60, message="the LanceDB probe measured and the pgvector one failed")
        before = scrape(port)
        wait_until(lambda: value(scrape(port), "embmon_records_total", model="m", stream="documents")
                   > value(before, "embmon_records_total", model="m", stream="documents"),
                   timeout=20, message="ingest goes on")
        s = scrape(port)
    recall = value(s, "embmon_index_recall_ratio", probe="lance", model="m", scope="all", k="10")
    assert recall is not None and 0 < recall <= 1
    assert value(s, "embmon_index_queries", probe="lance", model="m", scope="all") > 0
    # the table holds random vectors under the catalog's ids: every stored vector is "stale"
    assert value(s, "embmon_index_stale_ratio", probe="lance", model="m") == 1.0
    assert value(s, "embmon_index_rows", probe="lance", model="m") == 200
    assert (value(s, "embmon_index_probe_runs_total", probe="pg", outcome="backoff") or 0) >= 1
    assert value(s, "embmon_index_probe_runs_total", probe="pg", outcome="success") == 0
    assert value(s, "embmon_index_searches_total", probe="lance", kind="exact") > 0
    assert value(s, "embmon_index_rows_read_total", probe="lance") > 0
    assert np.isfinite(value(s, "embmon_index_probe_cpu_seconds_total", probe="lance"))


def _closed_port() -> int:
    return free_port()  # nothing listens there


@pytest.mark.slow
def test_a_chroma_probe_in_the_daemon(tmp_path: Path) -> None:
    """The same catalog in a real Chroma server's collection: the daemon's probe measures it and exports."""
    from tests.support import chroma

    rows = vs.unit_rows(200, DIM, seed=2)
    with chroma.server() as url:
        chroma.load(url, "catalog", [f"item-{i}" for i in range(200)], rows)
        settings = load_settings(overrides={
            "source": "synthetic",
            "synthetic": {"models": [{"name": "m", "dim": DIM}], "rate": 200.0, "batch_size": 20,
                          "interactions": {"rate": 50.0, "catalog_size": 200, "catalog_period_seconds": 1.0}},
            "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path / "state"), "refresh_seconds": 0.5,
            "index": {"probes": [{
                "name": "chroma", "engine": "chroma", "model": "m", "interval_seconds": 0.5, "timeout_seconds": 20,
                "budget": {"exact_searches": 40},
                "census": {"stream": "catalog", "grace_seconds": 0, "hub_queries": 5, "degenerate_rows": 50},
                "chroma": {"url": url, "collection": "catalog"}}]},
        })
        with daemons.monitor(settings) as monitor:
            port = monitor.http.port
            wait_until(lambda: (value(scrape(port), "embmon_index_probe_runs_total", probe="chroma",
                                      outcome="success") or 0) >= 2, timeout=60, message="the Chroma probe measured")
            s = scrape(port)
    recall = value(s, "embmon_index_recall_ratio", probe="chroma", model="m", scope="all", k="10")
    assert recall is not None and 0 < recall <= 1
    assert value(s, "embmon_index_rows", probe="chroma", model="m") == 200
    assert value(s, "embmon_index_stale_ratio", probe="chroma", model="m") == 1.0  # random vectors, as above
    assert value(s, "embmon_index_searches_total", probe="chroma", kind="exact") > 0
