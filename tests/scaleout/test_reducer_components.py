"""The reducer's components on merged windows (no broker needed): drift references and cycles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.drift.admin import capture_baseline
from monitor.scaleout.publisher import PartialsPublisher
from monitor.state.registry import StateRegistry
from tests.support import daemons
from tests.support.scaleout import T0, MemoryProducer, feed, reducer

DIM = 16


def publish(table, rows: dict[str, np.ndarray], now: list[float]) -> None:  # type: ignore[no-untyped-def]
    """Each replica ingests its rows over 100 s and publishes once."""
    for name, matrix in rows.items():
        settings = load_settings(overrides={"scale_out": {"replica_id": name},
                                            "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 600}})
        registry = StateRegistry(settings)
        for i, block in enumerate(np.array_split(matrix, 10)):
            registry.apply(EmbeddingBatch("m", "s", block.astype(np.float32)), T0 + 10 * i)
        producer = MemoryProducer()
        publisher = PartialsPublisher(settings, producer_factory=lambda p=producer: p, clock=lambda: now[0])
        publisher.stage(publisher.epochs.next(), {}, registry.state_dict()["streams"])
        assert publisher.flush()
        feed(table, producer.take())


def test_the_first_merged_window_with_enough_records_becomes_the_reference(tmp_path: Path) -> None:
    now = [T0 + 120]
    with daemons.stopped_after(reducer(tmp_path, now, reference={"records": 500}, online={"enabled": True})) as daemon:
        drift = next(c for c in daemon.components if c.name == "drift")
        rng = np.random.default_rng(0)
        publish(daemon.table, {"r0": rng.standard_normal((200, DIM))}, now)
        daemon.refresh()
        assert drift.reference("m", "s") is None  # type: ignore[attr-defined]  # 200 < 500 records
        publish(daemon.table, {"r1": rng.standard_normal((400, DIM))}, now)
        daemon.refresh()
        reference = drift.reference("m", "s")  # type: ignore[attr-defined]
        assert reference is not None and reference.count == 600
        # the drift component's own detectors need the records in order: off in the reducer, whose
        # sub-window detectors (monitor/scaleout/detectors.py) export nothing before they have run
        assert not any(f.samples for f in drift.collect() if f.name.startswith("embmon_drift_change_points"))
        results = drift.run_cycle()  # type: ignore[attr-defined]
        assert ("m", "s") in results and not results[("m", "s")].report.detected


def test_the_admin_capture_pins_the_merged_window(tmp_path: Path) -> None:
    now = [T0 + 120]
    with daemons.stopped_after(reducer(tmp_path, now, reference={"records": 10_000_000})) as daemon:
        drift = next(c for c in daemon.components if c.name == "drift")
        rng = np.random.default_rng(1)
        publish(daemon.table, {"r0": rng.standard_normal((300, DIM)), "r1": rng.standard_normal((300, DIM)) + 2}, now)
        status, _, body = capture_baseline(drift, {"QUERY_STRING": "model=m&stream=s"})  # type: ignore[arg-type]
        assert status == 200, body
        (described,) = json.loads(body)["references"]
        assert drift.reference("m", "s").count == 600  # type: ignore[attr-defined]  # both replicas' records
        assert described["model"] == "m"
