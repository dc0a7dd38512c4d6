"""The drift component on its own: a real ``StateRegistry``, an injected clock, the windows a refresh
would publish (no broker, no daemon); fed small embedding-like clouds or, in :class:`TopicStream`,
real sentence embeddings whose topics or model change half-way through a cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from monitor.component import MonitorContext
from monitor.config import Settings, deep_merge, load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.drift.component import DriftComponent
from monitor.drift.export import CycleResult
from monitor.state.registry import StateRegistry
from monitor.state.window import WindowSnapshot
from tests.support import topics
from tests.support.realdata import random_rotation

DIM = 16
BASE_DRIFT: dict[str, Any] = {
    "interval_seconds": 10.0,
    "false_alarm_every": "1h",
    "window_sample_size": 200,
    "reference_sample_size": 200,
    "threads": 1,
    "ks": {"components": 8},
    "classifier": {"squared_components": 4},
    "reference": {"records": 300},
    "online": {"aggregate": 16},
}


def unit_rows(rng: np.random.Generator, n: int, direction: np.ndarray, spread: float = 0.6) -> np.ndarray:
    """Unit vectors scattered around ``direction`` (an embedding-like cloud)."""
    x = direction + spread * rng.standard_normal((n, len(direction)))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def axis(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim)
    v[i] = 1.0
    return v


class Harness:
    """A component wired to a real registry, an injected clock and the windows a refresh would publish."""

    def __init__(self, settings: Settings, now: float = 1_000.0):
        self.settings = settings
        self.now = now
        self.registry = StateRegistry(settings)
        self.windows: dict[tuple[str, str], WindowSnapshot] = {}
        self.routes: dict[str, Any] = {}
        self.context = MonitorContext(
            settings=settings,
            registry=self.registry,
            clock=lambda: self.now,
            state_dir=settings.state_dir,
            latest_windows=lambda: self.windows,
            add_route=lambda path, handler, methods=("GET",), bearer_token=None: self.routes.__setitem__(path, handler),
        )
        self.component = DriftComponent(self.context)

    def feed(self, model: str, stream: str, vectors: np.ndarray, batch: int = 50) -> None:
        for start in range(0, len(vectors), batch):
            b = EmbeddingBatch(model, stream, np.ascontiguousarray(vectors[start : start + batch]))
            self.registry.apply(b, self.now)
            self.component.on_embeddings(b, self.now)

    def publish(self) -> None:
        self.windows = self.registry.snapshot_windows(self.now)

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        registry = CollectorRegistry()
        component = self.component

        class _C(Collector):
            def collect(self):  # type: ignore[no-untyped-def]
                return component.collect()

        registry.register(_C())
        out = {}
        for family in registry.collect():
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples().get((name, frozenset(labels.items())))

    def close(self) -> None:
        self.component.close()


def settings_for(state_dir: Path, **drift: Any) -> Settings:
    return load_settings(
        overrides={
            "source": "synthetic",
            "state_dir": str(state_dir),
            "window": {"seconds": 60.0, "subwindows": 2, "reservoir_size": 400},
            "drift": deep_merge(BASE_DRIFT, drift),
        }
    )


PER_CYCLE = 1500  # records per cycle: the 3,000-record shift spans the two cycles after it
SAMPLE = 600  # window and reference sample rows per cycle
MODEL, STREAM = "minilm", "docs"


def interval_settings(state_dir: Path, interval: float, **drift: Any) -> Settings:
    return load_settings(
        overrides={
            "source": "synthetic",
            "state_dir": str(state_dir),
            "window": {"seconds": 2 * interval, "subwindows": 4, "reservoir_size": 2 * SAMPLE},
            "drift": {
                "interval_seconds": interval,
                "false_alarm_every": "30d",
                "window_sample_size": SAMPLE,
                "reference_sample_size": SAMPLE,
                "threads": 1,
                "reference": {"records": 2 * PER_CYCLE},
                **drift,
            },
        }
    )


class TopicStream:
    """A (model, stream) of real sentences fed to a drift component on an injected clock."""

    def __init__(self, state_dir: Path, interval: float, seed: int = 0):
        self.interval = interval
        self.rng = np.random.default_rng(seed)
        self.vectors = topics.embeddings()
        self.rotation = random_rotation(self.vectors.shape[1], seed=7).astype(np.float32)
        self.h = Harness(interval_settings(state_dir, interval))

    def feed(self, change: str | None, count: int, seconds: float, batches: int = 10) -> None:
        """``count`` records spread evenly over ``seconds``: usual ones, or after ``change``."""
        picked = topics.draw(self.rng, count, new_share=1.0 if change == "topic_shift" else 0.0)
        vectors = self.vectors[picked] @ self.rotation.T if change == "model_swap" else self.vectors[picked]
        ids = topics.ids_of(picked)
        for rows in np.array_split(np.arange(count), batches):
            batch = EmbeddingBatch(MODEL, STREAM, np.ascontiguousarray(vectors[rows]), ids=tuple(ids[i] for i in rows))
            self.h.registry.apply(batch, self.h.now)
            self.h.component.on_embeddings(batch, self.h.now)
            self.h.now += seconds / batches

    def cycle(self) -> CycleResult:
        self.h.publish()
        return self.h.component.run_cycle()[(MODEL, STREAM)]

    def until_changed(self, change: str) -> tuple[list[CycleResult], list[CycleResult]]:
        """The reference (first 3,000 records), 3 usual cycles, then the change from half-way through
        a cycle: the cycles before it and the 2 cycles after it starts."""
        self.feed(None, 2 * PER_CYCLE, self.interval)
        before = []
        for _ in range(3):
            self.feed(None, PER_CYCLE, self.interval)
            before.append(self.cycle())
        self.feed(None, PER_CYCLE // 2, self.interval / 2, batches=5)
        self.feed(change, PER_CYCLE // 2, self.interval / 2, batches=5)
        after = [self.cycle()]
        self.feed(change, PER_CYCLE, self.interval)
        after.append(self.cycle())
        return before, after

    def close(self) -> None:
        self.h.close()
