"""A topic shift and a model swap as a user meets them: real MiniLM embeddings through the broker, 5 s cycles.

Before: the first cycle ran for over 90 s (the per-test alpha of 5e-7 asked the permutation tests
for two million relabellings, and a drifted window spends them all), every later run was skipped,
and the topic shift was not flagged within 90 s. Now: the knob picks held-out nulls at this alpha,
every cycle ends within its budget, and the shift is flagged within the documented delay
(window + refresh + 2 cycles). Wall time is only used for what a user would see; the budget
itself is tested on a fake clock (tests/drift/test_budget.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from tests.support import daemons, topics
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.producers import Message, SteadyProducer
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

MODEL, STREAM = "minilm", "docs"
LABELS = {"model": MODEL, "stream": STREAM}
INTERVAL, WINDOW, REFRESH = 5.0, 10.0, 1.0
DOCUMENTED_DELAY = WINDOW + REFRESH + 2 * INTERVAL


class SentenceProducer(SteadyProducer):
    """Real sentence embeddings (JSON, with ids) at a steady rate; ``shift()`` switches to the new topics."""

    def __init__(self, broker: Broker, topic: str):
        super().__init__(broker, topic, rate=200.0, batch=20)
        self.vectors = topics.embeddings()

    def messages(self, rng: np.random.Generator, shifted: bool) -> list[Message]:
        picked = topics.draw(rng, self.batch, new_share=1.0 if shifted else 0.0)
        events = [{"id": f"s{i}", "model": MODEL, "stream": STREAM, "vector": self.vectors[i].tolist()} for i in picked]
        return [(orjson.dumps(event), []) for event in events]


@pytest.mark.slow
def test_a_topic_shift_of_real_embeddings_is_flagged_at_five_second_cycles(broker: Broker, state_dir: Path) -> None:
    topic = "drift-minilm"
    broker.create_topics(topic)
    settings = load_settings(overrides=kafka_daemon_overrides(
        broker, topic, "drift-minilm", state_dir, refresh_seconds=REFRESH,
        window={"seconds": WINDOW, "subwindows": 5, "reservoir_size": 1000},
        drift={"interval_seconds": INTERVAL, "false_alarm_every": "30d", "window_sample_size": 600,
               "reference_sample_size": 600, "threads": 1, "reference": {"records": 1500}},
    ))
    producer = SentenceProducer(broker, topic)
    with daemons.monitor(settings) as monitor, producer:
        port = monitor.http.port
        wait_until(lambda: value(scrape(port), "embmon_reference_records", **LABELS) == 1500, timeout=60,
                   message="the reference from the first 1,500 records")
        started = time.monotonic()
        wait_until(lambda: (value(scrape(port), "embmon_job_runs_total", job="drift", outcome="success") or 0) >= 4,
                   timeout=60, message="drift cycles")
        s = scrape(port)
        assert value(s, "embmon_drift_detected", test="suite", **LABELS) == 0
        producer.shift()
        wait_until(lambda: producer.shifted_at is not None, timeout=5)
        wait_until(lambda: value(scrape(port), "embmon_drift_detected", test="suite", **LABELS) == 1,
                   timeout=DOCUMENTED_DELAY + 30, interval=0.2, message="drift after the topic shift")
        delay = time.time() - producer.shifted_at  # type: ignore[operator]
        print(f"topic shift flagged {delay:.1f}s after it started (documented bound {DOCUMENTED_DELAY:.0f}s)")
        assert delay <= DOCUMENTED_DELAY + 5  # consumer lag on a loaded machine
        s = scrape(port)
        elapsed = time.monotonic() - started
        runs = {outcome: value(s, "embmon_job_runs_total", job="drift", outcome=outcome) or 0
                for outcome in ("success", "failure", "timeout")}
        # no run overran its interval, none was skipped for a run still going
        assert runs["failure"] == runs["timeout"] == 0
        assert runs["success"] >= elapsed / INTERVAL - 2
        assert value(s, "embmon_drift_p_value_floor", test="mmd", **LABELS) == 0.0  # the held-out null
        assert sum(value(s, "embmon_drift_tests_cut_total", test=t, **LABELS) or 0
                   for t in ("mmd", "ks", "centroid", "classifier")) == 0
        # the explanation's novel share grows as new-topic rows fill the window: read at the verdict it
        # raced the verdict (0.018 once, when the suite fired early); within a window it is well above 0.02
        wait_until(lambda: (value(scrape(port), "embmon_drift_novel_ratio", **LABELS) or 0) > 0.02,
                   timeout=WINDOW + 2 * INTERVAL + 10, interval=0.5, message="the new topics' share named novel")
