"""The accumulating detector scaled out, on a real broker: two replica processes and a reducer on
tansu against one pinned reference. The reducer feeds its detector each closed sub-window's merged
samples (monitor/scaleout/evidence.py): no alarm while the stream is the reference's, an alarm a few
sub-windows after one cluster's share rises from 25% to 50%, and the evidence exported as one
daemon exports it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest

from monitor.drift.component import DriftComponent
from monitor.scaleout.evidence import SubwindowEvidence
from tests.support import daemons
from tests.support.broker import Broker
from tests.support.drift import BASE_DRIFT
from tests.support.producers import Message, SteadyProducer
from tests.support.scaleout import replica, scaled_settings
from tests.support.scrape import scrape
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

DIM, MODEL, CLUSTERS = 16, "emb", 4
HEADERS = [("model", MODEL.encode()), ("dim", str(DIM).encode())]
WINDOW = {"seconds": 8, "subwindows": 4, "reservoir_size": 400}
CENTRES = 4.0 * np.random.default_rng(0).standard_normal((CLUSTERS, DIM))
EQUAL, MOVED = np.full(CLUSTERS, 0.25), np.r_[0.5, np.full(CLUSTERS - 1, 0.5 / 3)]
QUIET = 8  # sub-windows fed before the shift (the bag has taken in their rows)


def draw(rng: np.random.Generator, n: int, shares: np.ndarray) -> np.ndarray:
    picked = rng.choice(CLUSTERS, n, p=shares)
    return (CENTRES[picked] + rng.standard_normal((n, DIM))).astype(np.float32)


class ShiftingShares(SteadyProducer):
    def messages(self, rng: np.random.Generator, shifted: bool) -> list[Message]:
        return [(draw(rng, self.batch, MOVED if shifted else EQUAL).tobytes(), HEADERS)]


def value(port: int, name: str) -> float | None:
    return next((v for (n, labels), v in scrape(port).items() if n == name and dict(labels).get("model") == MODEL),
                None)


@pytest.mark.slow
def test_the_reducer_adds_up_a_share_shift_from_the_replicas_samples(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = "emb-evidence-scaled"
    reference = tmp_path / "reference.npy"
    np.save(reference, draw(np.random.default_rng(1), 400, EQUAL))
    drift = {**BASE_DRIFT, "interval_seconds": 1.0, "false_alarm_every": "1h", "reference": {"path": str(reference)},
             "window_sample_size": 300, "reference_sample_size": 300, "online": {"enabled": False}}
    settings = scaled_settings(monkeypatch, broker, topic, "evidence-scaled", tmp_path, window=WINDOW,
                               extra={"drift": {**drift, "enabled": True}, "refresh_seconds": 0.5})
    assert settings.drift.evidence_threshold == pytest.approx(7200)
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        for i in range(2):
            running.enter_context(replica(broker, topic, f"replica-{i}", tmp_path / f"r{i}", tmp_path / f"r{i}.log",
                                          "evidence-scaled"))
        producer = running.enter_context(ShiftingShares(broker, topic, rate=200.0, batch=20))
        feeder = next(c for c in reducer.components if isinstance(c, SubwindowEvidence))
        drift_component = next(c for c in reducer.components if isinstance(c, DriftComponent))
        key = (MODEL, "default")
        wait_until(lambda: key in feeder.status(), timeout=90, interval=0.5, message="the reducer's evidence starts")
        start = feeder.status()[key]

        def quiet_fed() -> bool:
            assert not value(reducer.http.port, "embmon_drift_evidence_alarms_total"), "an alarm before the shift"
            return feeder.status()[key] >= start + QUIET

        wait_until(quiet_fed, timeout=120, interval=0.5, message=f"{QUIET} quiet sub-windows fed at the reducer")
        feed = drift_component.evidence_feed(*key)
        assert feed is not None and feed.detector.cycles >= 3
        rows = int(feed.detector.bag.sum()) - feed.regions.reference_rows
        assert rows >= (QUIET - 2) * 300  # about 400 records a sub-window, every one of them bet on
        assert value(reducer.http.port, "embmon_drift_log_evidence") is not None
        assert value(reducer.http.port, "embmon_drift_log_evidence_threshold") == pytest.approx(np.log(7200))
        producer.shift()
        wait_until(lambda: producer.shifted_at is not None, timeout=5)
        wait_until(lambda: (value(reducer.http.port, "embmon_drift_evidence_alarms_total") or 0) > 0,
                   timeout=90, interval=0.2, message="an evidence alarm at the reducer")
        delay = time.time() - producer.shifted_at  # type: ignore[operator]
        print(f"\nthe reducer's evidence alarmed {delay:.1f}s after the shift (sub-windows of 2 s)")
