"""The HTTP template (monitor/index/connectors/qdrant.py) against LanceDB's own answers, by shape.

tests/support/qdrant_shaped.py serves Qdrant's request and response shapes from a real LanceDB
table. The template must give exactly the LanceDB connector's exact answers, run a whole probe
cycle, and turn HTTP failures into counted reasons. Qdrant's own engine (qdrant-edge) answers the
same connector in tests/index/test_connector_suite.py (docs/index.md, "Engines compared").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.deadline import Deadline
from monitor.index.connectors.base import ConnectorError
from monitor.index.connectors.lancedb import LanceDbConnector
from monitor.index.connectors.qdrant import QdrantConnector
from monitor.index.probe import IndexProbe
from monitor.index.sampling import ProbeQuery
from monitor.index.settings import IndexProbeSpec, LanceDbSettings, QdrantSettings
from tests.support import vectorstores as vs
from tests.support.qdrant_shaped import serving

N, D, K = 1500, 24, 10


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object, np.ndarray]:
    uri = tmp_path_factory.mktemp("lance-q")
    rows = vs.unit_rows(N, D, seed=6)
    tenants = ["small" if i % 50 == 0 else "big" for i in range(N)]
    return str(uri), vs.load_lance(uri, "docs", [str(i) for i in range(N)], rows, tenants), rows


def test_the_template_gives_the_engines_exact_answers(table: tuple[str, object, np.ndarray]) -> None:
    uri, tbl, rows = table
    lance = LanceDbConnector(LanceDbSettings(uri=uri, table="docs", filter_columns=["tenant"]))
    with serving(tbl) as server:
        qdrant = QdrantConnector(QdrantSettings(url=server.url, collection="docs", filter_columns=["tenant"]))
        for i in range(5):
            q = rows[i * 7]
            for filter_ in ((), (("tenant", "small"),)):
                a = qdrant.search(q, K, filter_, "exact")
                b = lance.search(q, K, filter_, "exact")
                assert a.ids == b.ids and np.allclose(a.distances, b.distances, atol=1e-5)
        fetched = qdrant.fetch(["3", "4", "99999", "nosuch"])
        assert set(fetched) == {"3", "4"} and np.allclose(fetched["3"], rows[3], atol=1e-6)
        assert qdrant.count() == N and len(qdrant.sample(20)) == 20


def test_a_probe_cycle_through_the_template(table: tuple[str, object, np.ndarray]) -> None:
    _, tbl, rows = table
    with serving(tbl) as server:
        spec = IndexProbeSpec.model_validate({
            "name": "q", "model": "m", "engine": "qdrant", "k": K, "queries": {"scope_field": "tenant"},
            "budget": {"exact_searches": 60}, "census": {"hub_queries": 5, "degenerate_rows": 50, "grace_seconds": 0},
            "qdrant": {"url": server.url, "collection": "docs", "filter_columns": ["tenant"]}})
        probe = IndexProbe(spec, QdrantConnector(spec.qdrant))  # type: ignore[arg-type]
        for i in range(40):
            probe.buffer.add(ProbeQuery(rows[i], (("tenant", "small" if i % 4 == 0 else "big"),)), 0.0)
        probe.sketch.add([str(i) for i in range(300)], rows[:300], now=-1.0)
        result = probe.run(Deadline.after(60), now=0.0)
    assert result.queries > 0 and result.recall.row() is not None
    assert result.census is not None and result.census.sampled == 300 and result.census.stale.mean == 0.0


def test_http_failures_become_reasons(table: tuple[str, object, np.ndarray], tmp_path: Path) -> None:
    _, tbl, rows = table
    with serving(tbl) as server:
        wrong = QdrantConnector(QdrantSettings(url=server.url, collection="other"))
        with pytest.raises(ConnectorError) as caught:
            wrong.search(rows[0], K, (), "exact")
        assert caught.value.reason == "missing_table"
        right = QdrantConnector(QdrantSettings(url=server.url, collection="docs"))
        with pytest.raises(ConnectorError) as caught:
            right.search(np.ones(D + 2, np.float32), K, (), "exact")
        assert caught.value.reason == "dimension"
        with pytest.raises(ConnectorError) as caught:  # a 400 to the facet (no payload index): no fill rates
            right.scope_counts("tenant")
        assert caught.value.reason == "unsupported"
        server.body = b"<html>proxy error</html>"
        with pytest.raises(ConnectorError) as caught:
            right.count()
        assert caught.value.reason == "bad_result"
        url = server.url
    down = QdrantConnector(QdrantSettings(url=url, collection="docs", timeout_seconds=2))
    with pytest.raises(ConnectorError) as caught:
        down.count()
    assert caught.value.reason == "unreachable"


def test_ids_and_filter_values_qdrant_cannot_take_are_absent_or_skipped(
    table: tuple[str, object, np.ndarray]
) -> None:
    """Ids that are not point ids (an unsigned integer, a UUID) are absent, never sent (Qdrant refuses a
    whole request naming one) nor a ValueError; a fractional
    filter value (``match`` takes keywords, integers, booleans) skips its query as bad_filter."""
    _, tbl, rows = table
    with serving(tbl) as server:
        spec = IndexProbeSpec.model_validate({
            "name": "q", "model": "m", "engine": "qdrant", "k": K, "budget": {"exact_searches": 40},
            "census": {"hub_queries": 0, "degenerate_rows": 0, "grace_seconds": 0},
            "qdrant": {"url": server.url, "collection": "docs", "filter_columns": ["tenant"]}})
        connector = QdrantConnector(spec.qdrant)  # type: ignore[arg-type]
        assert set(connector.fetch(["3", "²36", "--23", "1" * 21, "٣٦", "d7"])) == {"3"}
        probe = IndexProbe(spec, connector)
        for i in range(6):
            probe.buffer.add(ProbeQuery(rows[i], (("tenant", "big"),)), 0.0)
        probe.buffer.add(ProbeQuery(rows[7], (("tenant", 1.5),)), 0.0)
        probe.buffer.add(ProbeQuery(rows[8], (("tenant", "a\x00"),)), 0.0)
        probe.sketch.add(["1", "²36", "--23"], rows[[1, 2, 3]], now=-1.0)
        result = probe.run(Deadline.after(60), now=0.0)
    assert result.skipped == {"bad_filter": 2} and result.queries == 6
    assert result.census is not None and result.census.sampled == 1 and result.census.missing == 2
