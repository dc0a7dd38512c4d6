"""A shift one daemon's change detectors catch is caught scaled out too.

Two replica processes and a reducer on tansu, and a single daemon on the same topic, both against
one pinned reference. The stream's mean turns by 40 degrees (as in tests/drift/test_e2e.py). The
reducer feeds its detectors one observation per closed sub-window (monitor/scaleout/detectors.py):
the shift is in the first fully shifted sub-window, which closes at most one sub-window after the
first shifted record; Page-Hinkley needs up to 3 updates for this shift (tests/scaleout/
test_detectors.py), and a sub-window is fed once the replicas published a capture after its end
(a checkpoint interval) and the reducer's job ran (a refresh interval). So the documented bound is
``(3 + 1) × sub-window + checkpoint interval + refresh interval``, plus a sub-window of slack for
a loaded machine. Both delays are printed.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np
import pytest

from monitor.config import deep_merge, load_settings
from monitor.scaleout.detectors import SubwindowDetectors
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.drift import BASE_DRIFT
from tests.support.producers import Message, SteadyProducer
from tests.support.scaleout import replica, scaled_settings
from tests.support.scrape import Samples, scrape
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

DIM, MODEL = 16, "emb"
HEADERS = [("model", MODEL.encode()), ("dim", str(DIM).encode())]
WINDOW = {"seconds": 8, "subwindows": 4, "reservoir_size": 400}
SUBWINDOW = WINDOW["seconds"] / WINDOW["subwindows"]
CHECKPOINT, REFRESH = 0.3, 0.5  # the replicas' (daemons.crash_tested) and the reducer's
UPDATES = 3  # Page-Hinkley's updates for this shift at most
BOUND = (UPDATES + 1) * SUBWINDOW + CHECKPOINT + REFRESH
SLACK = SUBWINDOW
BASE = np.eye(DIM)[0]
SHIFTED = np.cos(np.radians(40)) * BASE + np.sin(np.radians(40)) * np.eye(DIM)[1]


def unit_rows(rng: np.random.Generator, n: int, direction: np.ndarray) -> np.ndarray:
    x = direction + 0.4 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class ShiftingBatches(SteadyProducer):
    def messages(self, rng: np.random.Generator, shifted: bool) -> list[Message]:
        return [(unit_rows(rng, self.batch, SHIFTED if shifted else BASE).tobytes(), HEADERS)]


def change_points(samples: Samples) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "embmon_drift_change_points_total" and dict(labels).get("model") == MODEL)


@pytest.mark.slow
def test_a_shift_the_single_daemon_catches_is_caught_scaled_out_within_the_stated_delay(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = "emb-detectors-scaled"
    reference = tmp_path / "reference.npy"
    np.save(reference, unit_rows(np.random.default_rng(1), 400, BASE))
    drift = deep_merge(BASE_DRIFT, {"interval_seconds": 1.0, "reference": {"path": str(reference)},
                                    "window_sample_size": 300, "reference_sample_size": 300})
    settings = scaled_settings(monkeypatch, broker, topic, "detectors-scaled", tmp_path, window=WINDOW,
                               extra={"drift": {**drift, "enabled": True}, "refresh_seconds": REFRESH})
    single_settings = load_settings(overrides=kafka_daemon_overrides(
        broker, topic, "detectors-single", tmp_path / "single", window=WINDOW, drift=drift,
        scale_out={"role": "single"}))
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        single = running.enter_context(daemons.monitor(single_settings))
        for i in range(2):
            running.enter_context(replica(broker, topic, f"replica-{i}", tmp_path / f"r{i}", tmp_path / f"r{i}.log",
                                          "detectors-scaled"))
        producer = running.enter_context(ShiftingBatches(broker, topic, rate=200.0, batch=20))
        detectors = next(c for c in reducer.components if isinstance(c, SubwindowDetectors))

        # quiet: the reducer feeds 6 sub-windows (Page-Hinkley may detect from its 5th), no change point
        def fed() -> int:
            assert change_points(scrape(reducer.http.port)) == 0, "a change point before the shift (reducer)"
            assert change_points(scrape(single.http.port)) == 0, "a change point before the shift (single)"
            return detectors.status().get((MODEL, "default"), (0, 0))[0]

        wait_until(lambda: fed() >= 6, timeout=90, interval=0.5, message="6 quiet sub-windows fed at the reducer")
        producer.shift()
        wait_until(lambda: producer.shifted_at is not None, timeout=5)
        caught: dict[str, float] = {}

        def both_caught() -> bool:
            for name, port in (("reducer", reducer.http.port), ("single", single.http.port)):
                if name not in caught and change_points(scrape(port)) > 0:
                    caught[name] = time.time() - producer.shifted_at  # type: ignore[operator]
            return len(caught) == 2

        wait_until(both_caught, timeout=BOUND + SLACK + 30, interval=0.1, message=f"change points ({caught})")
        print(f"change detected {caught['single']:.2f}s after the shift by one daemon, {caught['reducer']:.2f}s "
              f"scaled out (2 replicas, sub-window {SUBWINDOW:.0f}s; stated bound {BOUND:.1f}s)")
        assert caught["reducer"] <= BOUND + SLACK
        fed_count, records = detectors.status()[(MODEL, "default")]
        assert fed_count >= 7 and records > 0
