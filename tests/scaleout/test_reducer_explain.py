"""The reducer explains a drift verdict on the merged state, with the replicas' record ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.drift.attribution.explain import explanation
from monitor.scaleout.publisher import PartialsPublisher
from monitor.state.registry import StateRegistry
from tests.support import daemons
from tests.support.drift import axis, unit_rows
from tests.support.scaleout import T0, MemoryProducer, feed, reducer

DIM = 16


def publish_with_ids(table, rows: dict[str, tuple[np.ndarray, list[str]]], now: list[float]) -> None:  # type: ignore[no-untyped-def]
    """Each replica ingests its rows, with their ids, over 100 s and publishes its whole state once."""
    for name, (matrix, ids) in rows.items():
        settings = load_settings(overrides={"scale_out": {"replica_id": name},
                                            "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 600}})
        registry = StateRegistry(settings)
        for i, block in enumerate(np.array_split(np.arange(len(matrix)), 10)):
            batch = EmbeddingBatch("m", "s", matrix[block].astype(np.float32), ids=tuple(ids[j] for j in block))
            registry.apply(batch, now[0] - 100 + 10 * i)
        producer = MemoryProducer()
        publisher = PartialsPublisher(settings, producer_factory=lambda p=producer: p, clock=lambda: now[0])
        publisher.stage(publisher.epochs.next(), {}, registry.state_dict()["streams"])
        assert publisher.flush()
        feed(table, producer.take())


def blobs(rng: np.random.Generator, centres: list[int], rows: int) -> np.ndarray:
    return np.concatenate([unit_rows(rng, rows, axis(c, DIM), spread=0.2) for c in centres])


def test_the_reducer_names_what_moved_with_the_replicas_ids(tmp_path: Path) -> None:
    now = [T0 + 120]
    with daemons.stopped_after(reducer(tmp_path, now, reference={"records": 500})) as daemon:
        drift = next(c for c in daemon.components if c.name == "drift")
        rng = np.random.default_rng(3)
        publish_with_ids(daemon.table, {
            r: (blobs(rng, [0, 1, 2], 100), [f"{r}-old-{i}" for i in range(300)]) for r in ("r0", "r1")
        }, now)
        daemon.refresh()
        assert drift.reference("m", "s").count == 600  # type: ignore[attr-defined]  # the merged first window
        # each replica's window now: the usual blobs and a new one (axis 5), a third of its rows
        now[0] += 1000
        publish_with_ids(daemon.table, {
            r: (np.concatenate([blobs(rng, [0, 1], 100), blobs(rng, [5], 100)]),
                [f"{r}-old-{i}" for i in range(300, 500)] + [f"{r}-new-{i}" for i in range(100)])
            for r in ("r0", "r1")
        }, now)
        daemon.refresh()
        cycle = drift.run_cycle()[("m", "s")]  # type: ignore[attr-defined]
        assert cycle.report.detected
        explained = explanation("m", "s", cycle)["regions"]
        assert explained["novel_shifted"] and explained["novel_share"] > 0.2
        novel = explained["novel_exemplars"]
        assert novel and all("-new-" in i for i in novel)
        # the exemplars are the replicas' own ids, from the merged sample of both
        window_ids = {i for r in explained["ranked"] for i in r["window_exemplars"]} | set(novel)
        assert {i.split("-")[0] for i in window_ids} == {"r0", "r1"}
        gained = [r for r in explained["ranked"] if r["shifted"] and r["change"] > 0]
        assert all("-new-" in i for r in gained for i in r["window_exemplars"])
