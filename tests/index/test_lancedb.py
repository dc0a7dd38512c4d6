"""The index probe on a real embedded LanceDB table (IVF-PQ index), recall and census.

3,000 clustered 32-d unit vectors; a tenant with 1 % of the rows; an IVF-PQ index searched with
one probe of 16 partitions and the filter applied *after* the search (``prefilter: false``, as
applications that want the index's speed do): the small tenant gets almost nothing back. The
census: 5 % of the stored vectors replaced by another "model's" (a random rotation of the space),
zero rows and exact duplicates written in, ids the stream saw and the table lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.deadline import Deadline
from monitor.index.connectors.base import ConnectorError
from monitor.index.connectors.lancedb import LanceDbConnector, literal
from monitor.index.probe import IndexProbe
from monitor.index.sampling import ProbeQuery
from monitor.index.settings import IndexProbeSpec, LanceDbSettings
from tests.support import vectorstores as vs
from tests.support.realdata import random_rotation

N, D, K = 3000, 32, 10


def tenant_of(i: int) -> str:
    return "small" if i % 100 == 0 else f"t{i % 2}"


@pytest.fixture(scope="module")
def lance(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    uri = tmp_path_factory.mktemp("lance")
    rows = vs.unit_rows(N, D, seed=5)
    ids = [f"d{i}" for i in range(N)]
    tenants = [tenant_of(i) for i in range(N)]
    vs.load_lance(uri, "docs", ids, rows, tenants, partitions=16, sub_vectors=8)
    return {"uri": str(uri), "rows": rows, "ids": ids, "tenants": np.array(tenants)}


def spec_for(lance: dict[str, Any], **settings: Any) -> IndexProbeSpec:
    return IndexProbeSpec.model_validate({
        "name": "lance", "model": "m", "engine": "lancedb", "k": K,
        "queries": {"scope_field": "tenant", "min_per_scope": 8},
        "budget": {"exact_searches": 120, "census_rows": 2000},
        "census": {"degenerate_rows": 300, "hub_queries": 30, "grace_seconds": 0},
        "lancedb": {"uri": lance["uri"], "table": "docs", "filter_columns": ["tenant"], **settings},
    })


def queries(rows: np.ndarray, n: int = 120, seed: int = 0) -> list[ProbeQuery]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = rows[rng.integers(len(rows))] + 0.3 * rng.normal(size=rows.shape[1])
        tenant = "small" if i % 20 == 0 else f"t{i % 2}"
        out.append(ProbeQuery((v / np.linalg.norm(v)).astype(np.float32), (("tenant", tenant),)))
    return out


def test_exact_search_is_the_engines_flat_scan_under_the_same_filter(lance: dict[str, Any]) -> None:
    connector = LanceDbConnector(spec_for(lance).lancedb)  # type: ignore[arg-type]
    rows, mask = lance["rows"], lance["tenants"] == "small"
    for q in queries(rows, 4, seed=3):
        answer = connector.search(q.vector, K, (("tenant", "small"),), "exact")
        d = 1.0 - rows[mask] @ q.vector
        assert list(answer.ids) == list(np.array(lance["ids"])[mask][np.argsort(d, kind="stable")[:K]])
        assert np.allclose(answer.distances, np.sort(d)[:K], atol=1e-5)
    assert connector.count() == N and connector.dim == D


@pytest.mark.slow  # 9-11.5 s on the 2-core machine, 6 s of it CPU (.cache/test-durations.json)
def test_postfiltered_search_under_returns_for_the_small_tenant_at_the_first_cycle(lance: dict[str, Any]) -> None:
    probe = IndexProbe(spec_for(lance, nprobes=1, prefilter=False), LanceDbConnector(
        spec_for(lance, nprobes=1, prefilter=False).lancedb))  # type: ignore[arg-type]
    for q in queries(lance["rows"]):
        probe.buffer.add(q, 0.0)
    summary = probe.run(Deadline.after(120), now=0.0).recall
    small = summary.row("small")
    assert small is not None and small.under_return >= 0.5 and "small" in summary.flagged
    assert [r.scope for r in summary.rows if r.scope not in ("all", "other")][0] == "small"
    prefiltered = IndexProbe(spec_for(lance, nprobes=16, refine_factor=5), LanceDbConnector(
        spec_for(lance, nprobes=16, refine_factor=5).lancedb))  # type: ignore[arg-type]
    for q in queries(lance["rows"]):
        prefiltered.buffer.add(q, 0.0)
    better = prefiltered.run(Deadline.after(120), now=0.0).recall
    assert better.row("small").under_return == 0.0  # type: ignore[union-attr]
    assert better.row().recall.mean > summary.row().recall.mean  # type: ignore[union-attr]


def test_census_estimates_a_five_percent_stale_share_and_finds_degenerate_rows(tmp_path: Path) -> None:
    n = 2000
    rows = vs.unit_rows(n, D, seed=8)
    ids = [f"d{i}" for i in range(n)]
    rng = np.random.default_rng(4)
    stale = rng.choice(n, size=n // 20, replace=False)
    stored = rows.copy()
    stored[stale] = rows[stale] @ random_rotation(D, seed=2).astype(np.float32)  # another model's space
    stored[[10, 11, 12]] = 0.0  # failed embedding calls written anyway
    stored[21] = stored[20]  # a re-ingest under a new id
    vs.load_lance(tmp_path, "docs", ids[:-50], stored[:-50])  # the last 50 never reached the index
    spec = spec_for({"uri": str(tmp_path)}, filter_columns=[])
    spec.census.degenerate_rows = n  # every stored row
    probe = IndexProbe(spec, LanceDbConnector(spec.lancedb))  # type: ignore[arg-type]
    probe.sketch.add(ids, rows, now=-10.0)  # the stream's latest vectors: the current model
    census = probe.run(Deadline.after(120), now=0.0).census
    assert census is not None and census.sampled == n - 50
    truth = (np.isin(np.arange(n - 50), stale) | np.isin(np.arange(n - 50), [10, 11, 12])).mean()
    assert census.stale.lower <= truth <= census.stale.upper
    assert census.generation_shares[0] == pytest.approx(1 - census.stale.mean)
    assert census.missing == 50 and census.checked_for_missing == n
    assert census.degenerate["zero"] > 0
    assert census.orphans == 0 and census.checked_for_orphans > 0


def test_a_current_index_has_no_stale_vectors(lance: dict[str, Any]) -> None:
    probe = IndexProbe(spec_for(lance), LanceDbConnector(spec_for(lance).lancedb))  # type: ignore[arg-type]
    probe.sketch.add(lance["ids"], lance["rows"], now=-10.0)
    census = probe.run(Deadline.after(120), now=0.0).census
    assert census is not None and census.sampled == 2000 and census.stale.mean == 0.0
    assert census.stale.lower == 0.0 and census.generation_shares == (1.0,)


@pytest.mark.parametrize(("change", "reason"), [
    ({"table": "nosuch"}, "missing_table"),
    ({"vector_column": "nosuch"}, "missing_column"),
    ({"uri": "/nonexistent/lance"}, "missing_table"),
])
def test_engine_failures_carry_their_reason(lance: dict[str, Any], change: dict[str, str], reason: str) -> None:
    settings = LanceDbSettings.model_validate({"uri": lance["uri"], "table": "docs", **change})
    with pytest.raises(ConnectorError) as caught:
        LanceDbConnector(settings).search(np.ones(D, np.float32), K, (), "served")
    assert caught.value.reason == reason


def test_a_query_of_another_dimension_is_refused_as_dimension(lance: dict[str, Any]) -> None:
    connector = LanceDbConnector(spec_for(lance).lancedb)  # type: ignore[arg-type]
    with pytest.raises(ConnectorError) as caught:
        connector.search(np.ones(D + 1, np.float32), K, (), "exact")
    assert caught.value.reason == "dimension"


def test_filter_literals_are_quoted() -> None:
    assert literal("o'brien") == "'o''brien'" and literal(True) == "true" and literal(3) == "3"


def test_the_probe_sees_rows_written_after_it_opened_the_table(tmp_path: Path) -> None:
    rows = vs.unit_rows(300, D, seed=9)
    ids = [f"d{i}" for i in range(300)]
    table = vs.load_lance(tmp_path, "docs", ids[:30], rows[:30])
    spec = spec_for({"uri": str(tmp_path)}, filter_columns=[])
    probe = IndexProbe(spec, LanceDbConnector(spec.lancedb))  # type: ignore[arg-type]
    probe.sketch.add(ids, rows, now=-10.0)
    assert probe.run(Deadline.after(60), now=0.0).census.sampled == 30  # type: ignore[union-attr]
    import pyarrow as pa

    table.add(pa.table({"id": ids[30:], "tenant": ["t0"] * 270, "body": ["x"] * 270,
                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(rows[30:].ravel()), D)}))
    census = probe.run(Deadline.after(60), now=0.0).census  # the application wrote on: the probe reads on
    assert census is not None and census.sampled == 300 and census.missing == 0


@pytest.mark.slow
def test_census_with_an_encoder_re_embeds_the_stored_text(tmp_path: Path) -> None:
    """census.encoder: the stored text re-embedded by the current model (MiniLM) is the reference."""
    from tests.support.realdata import minilm_encode, minilm_path

    texts = [f"text of d{i}" for i in range(200)]
    current = np.asarray(minilm_encode(tuple(texts), normalize=True), dtype=np.float32)
    stored = current.copy()
    stored[:20] = current[:20] @ random_rotation(current.shape[1], seed=5).astype(np.float32)  # an old generation
    vs.load_lance(tmp_path, "docs", [f"d{i}" for i in range(200)], stored)  # body = "text of <id>"
    spec = IndexProbeSpec.model_validate({
        "name": "enc", "model": "m", "engine": "lancedb", "budget": {"census_rows": 500},
        "census": {"encoder": {"path": minilm_path()}, "grace_seconds": 0, "hub_queries": 0},
        "lancedb": {"uri": str(tmp_path), "table": "docs", "text_column": "body"}})
    from monitor.index.component import build_probe

    probe = build_probe(spec)
    probe.sketch.add([f"d{i}" for i in range(200)], np.ones((200, current.shape[1]), np.float32), now=-1.0)
    census = probe.run(Deadline.after(120), now=0.0).census  # the sketch's own vectors are not used
    assert census is not None and census.sampled == 200
    assert census.stale.mean == pytest.approx(0.1)
