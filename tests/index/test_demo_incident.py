"""The demo's index incident (monitor/index/demo.py): a tenth of the catalog re-indexed by another model.

The demo's indexer writes catalog batches into an embedded LanceDB table; during the incident a
tenth of the ids get the other model's vectors. The demo's own index probe, on the stream's
latest vectors, must read about 10 % stale then, and 0 % once the backfill wrote them again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from monitor.cli.demo import DEMO_SETTINGS, with_index_incident
from monitor.config import load_settings
from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch
from monitor.index import demo
from monitor.index.connectors import build_connector
from monitor.index.probe import IndexProbe
from monitor.index.settings import IndexProbeSpec
from tests.support import vectorstores as vs
from tests.support.probes import probe_context


@pytest.mark.slow
def test_the_incident_makes_a_tenth_of_the_index_stale_and_the_backfill_clears_it(tmp_path: Path) -> None:
    now = [0.0]
    settings = load_settings(overrides={"state_dir": str(tmp_path)})
    indexer = demo.DemoIndexer(probe_context(settings, clock=lambda: now[0]), "m", "catalog", 32, period=240.0)
    rows = vs.unit_rows(500, 32, seed=1)
    ids = tuple(f"item-{i}" for i in range(500))
    spec = IndexProbeSpec.model_validate({**demo.probe_settings(tmp_path, "m", "catalog"), "model": "m"})
    probe = IndexProbe(spec, build_connector(spec))

    def cycle_at(t: float) -> float:
        now[0] = t
        batch = EmbeddingBatch("m", "catalog", rows, ids=ids)
        indexer.on_embeddings(batch, t)
        probe.on_embeddings(batch, t - 100)  # the stream's latest vectors, long enough ago to be indexed
        indexer.write()
        census = probe.run(Deadline.after(60), now=t).census
        assert census is not None and census.sampled == 500
        return census.stale.mean

    assert cycle_at(10.0) == 0.0
    expected = np.mean([demo.stale_id(i) for i in ids])
    assert 0.05 < expected < 0.15
    assert cycle_at(demo.INCIDENT[0] + 1) == expected  # the tenth re-indexed by the other model
    assert cycle_at(demo.INCIDENT[1] + 1) == 0.0  # the backfill wrote the right vectors again


def test_the_demo_adds_its_index_probe_and_indexer(tmp_path: Path) -> None:
    settings = load_settings(overrides={**DEMO_SETTINGS, "state_dir": str(tmp_path)})
    with_incident, factories = with_index_incident(settings)
    assert [p.name for p in with_incident.index.probes] == [demo.PROBE]
    assert factories is not None and len(factories) >= 4  # the indexer and the daemon's own components
    own = load_settings(overrides={**DEMO_SETTINGS, "state_dir": str(tmp_path), "index": {"probes": [
        {"name": "mine", "model": "m", "engine": "lancedb", "lancedb": {"uri": str(tmp_path), "table": "t"}}]}})
    assert with_index_incident(own) == (own, None)  # a configured index probe wins: no demo incident
