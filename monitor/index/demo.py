"""The demo's index incident: an embedded LanceDB index fed from the catalog stream, a tenth of it
re-indexed by another model for a while.

:class:`DemoIndexer` plays the application's indexer: it keeps the latest vector of every catalog
item the synthetic source emits (``catalog_stream``) and writes them to a LanceDB table in the
state directory every :data:`WRITE_EVERY` seconds. During the incident (:data:`INCIDENT` seconds
of every loop of the demo's script) a tenth of the items (those whose id hashes to 0 mod 10) are
written as another model embeds them (a fixed random rotation of the space: same norms, different
directions), as a re-index job with the wrong model version would; after it the backfill writes
the right vectors again. The index probe ``demo-index`` (:func:`probe_settings`) measures it:
its census reads the stale share climb to about 0.1 and fall back, and
``EmbeddingMonitorIndexStale`` would fire in between.
"""

from __future__ import annotations

import logging
import threading
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import EmbeddingBatch

logger = logging.getLogger(__name__)

TABLE = "catalog"
PROBE = "demo-index"
WRITE_EVERY = 2.0
# (from, until) seconds into each loop of the demo's script: the second healthy phase (105-150 s)
INCIDENT = (105.0, 150.0)
STALE_EVERY = 10  # one id in ten is re-indexed by the other model


def probe_settings(state_dir: Path, model: str, catalog_stream: str) -> dict[str, Any]:
    """The demo's index probe: recall on the live interaction queries, the census on the catalog."""
    return {
        "name": PROBE, "model": model, "engine": "lancedb", "k": 10, "interval_seconds": 10.0,
        "timeout_seconds": 20.0, "budget": {"exact_searches": 20, "census_rows": 500},
        "census": {"stream": catalog_stream, "tracked_ids": 500, "grace_seconds": 10.0, "degenerate_rows": 50,
                   "hub_queries": 0},
        "lancedb": {"uri": str(state_dir / "lance"), "table": TABLE},
    }


def stale_id(ident: str) -> bool:
    return zlib.crc32(ident.encode()) % STALE_EVERY == 0


class DemoIndexer(Component):
    """The demo application's indexer (see the module doc)."""

    name = "demo-indexer"

    def __init__(self, context: MonitorContext, model: str, stream: str, dim: int, period: float):
        import lancedb
        import pyarrow as pa

        self.context = context
        self.model, self.stream, self.dim, self.period = model, stream, dim, period
        self._pending: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self._started = context.clock()
        rng = np.random.default_rng(7)
        q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
        self._other_model = (q * np.sign(np.diag(r))).astype(np.float32)
        self._schema = pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32(), dim))])
        self._table = lancedb.connect(str(Path(context.state_dir) / "lance")).create_table(
            TABLE, schema=self._schema, mode="overwrite")
        self.written = 0

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        if batch.model != self.model or batch.stream != self.stream or batch.ids is None:
            return
        with self._lock:
            for ident, row in zip(batch.ids, batch.vectors, strict=True):
                self._pending[ident] = row

    def incident(self) -> bool:
        """Whether the re-index with the other model is under way now (never when ``period`` is 0)."""
        if self.period <= 0:
            return False
        at = (self.context.clock() - self._started) % self.period
        return INCIDENT[0] <= at < INCIDENT[1]

    def write(self) -> None:
        """Upsert the items seen since the last write (the wrong model's vectors for a tenth during the incident)."""
        import pyarrow as pa

        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        ids = list(pending)
        vectors = np.stack([pending[i] for i in ids]).astype(np.float32)
        if self.incident():
            wrong = np.array([stale_id(i) for i in ids])
            vectors[wrong] = vectors[wrong] @ self._other_model
        data = pa.table({"id": ids, "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), self.dim)},
                        schema=self._schema)
        self._table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(data)
        self.written += len(ids)

    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob("demo-indexer", self.write, WRITE_EVERY, 30.0, outbound=True)]
