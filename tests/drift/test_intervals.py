"""Drift that fires at any cycle length: real MiniLM embeddings at 5 s, 60 s and 900 s cycles.

The knob is the production one (one false alarm a month), so the per-test alpha runs from
4.8e-7 (5 s) to 8.7e-5 (900 s): far below what a permutation test could reach at 5 s and 60 s,
where the MMD and centroid tests use their held-out nulls. Through the drift component with a
real state registry and an injected clock: records arrive at a steady rate (1,500 per cycle),
the window spans two cycles, and the change starts half-way through a cycle, so the first cycle
after it sees a quarter of the window changed and the second three quarters. The two changes
of issue 10:

- a topic shift of 3,000 records: the stream's sentences come from two help topics the reference
  never had (the debugger's commands, the format-string mini-language) for the two cycles;
- a model swap: a rotated copy of the model (a random orthogonal rotation of the same real
  embeddings, ``realdata.random_rotation``): every norm, angle and spectrum stays, every vector
  moves.

Both must be flagged within 2 cycles at each interval; the null false-alarm rate must stay
within its binomial bound (tests/test_drift_null_rate.py measures it where it can be counted).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from monitor.config import Settings, load_settings
from monitor.drift.export import CycleResult
from monitor.drift.settings import DriftSettings
from monitor.drift.suite import run_drift_suite
from monitor.records import EmbeddingBatch
from tests.support import topics
from tests.support.realdata import random_rotation
from tests.test_drift_component import Harness

PER_CYCLE = 1500  # records per cycle: the 3,000-record shift spans the two cycles after it
SAMPLE = 600  # window and reference sample rows per cycle
INTERVALS = (5.0, 60.0, 900.0)
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


@pytest.mark.parametrize("interval", INTERVALS)
@pytest.mark.parametrize("change", ["topic_shift", "model_swap"])
def test_a_topic_shift_and_a_model_swap_are_flagged_within_two_cycles(
    tmp_path: Path, interval: float, change: str
) -> None:
    stream = TopicStream(tmp_path / "state", interval)
    try:
        before, after = stream.until_changed(change)
    finally:
        stream.close()
    assert [c.report.detected for c in before] == [False, False, False]
    assert any(c.report.detected for c in after), f"{change} not flagged within 2 cycles of {interval:g}s"


@pytest.mark.parametrize(("interval", "null"), [(5.0, "heldout"), (60.0, "heldout"), (900.0, "permutation")])
def test_the_knob_picks_a_null_that_reaches_the_per_test_alpha(interval: float, null: str) -> None:
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d")
    assert settings.null_for("mmd") == settings.null_for("centroid") == null
    if null == "permutation":
        assert 1 / (1 + settings.permutations_for("mmd")) <= settings.test_alpha


def binomial_bound(cycles: int, alpha: float, confidence: float = 0.999) -> int:
    """The most false alarms ``cycles`` null cycles at ``alpha`` give, at ``confidence``."""
    return int(stats.binom.ppf(confidence, cycles, alpha))


@pytest.mark.parametrize("interval", INTERVALS)
def test_no_false_alarm_on_null_splits_at_each_interval(interval: float) -> None:
    """40 null cycles per interval: at alphas of 2e-6 to 3.5e-4 the bound is 0 or 1 false alarm."""
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=300,
                             reference_sample_size=300, threads=1)
    vectors = topics.embeddings()
    cycles = 40
    alarms = 0
    for seed in range(cycles):
        rng = np.random.default_rng(1000 + seed)
        report = run_drift_suite(vectors[topics.draw(rng, 300)], vectors[topics.draw(rng, 300)], settings, seed=seed)
        alarms += report.detected
    assert alarms <= binomial_bound(cycles, settings.cycle_alpha) <= 1
    assert math.isclose(settings.cycle_alpha, interval / 2_592_000)
