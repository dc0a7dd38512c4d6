"""Canaries in a group of two reducer processes: compared and exported by the owner of the stream
they arrive on, and compared again by the reducer that takes that stream over.

Two replica processes consume a 2-partition topic of JSON events of model m on two streams whose
partials are on different partitions of the partials topic: ``a`` (m's first stream by name) and
``canary``, the stream the canary records ``c0`` and ``c1`` are produced on: twice the pinned
vectors (the first arrivals pin them), then twice the vectors of a rotated model. Two reducer
processes of one ``reducer_group`` each own one partition, so the reducer that compares the
canaries is not the owner of m's first stream: it exports ``embmon_canary_*`` for m with the
mismatches (``COMPARED_HERE`` in ``monitor/scaleout/export.py``; filtered to the model's owner,
they were dropped), and the other reducer exports no mismatch of m. The comparing reducer is
SIGKILLed: the survivor takes the ``canary`` stream over and compares every arrival still in its
window, counted per (replica, model, stream), so it exports the mismatches of m within 60 s (the
time from the SIGKILL is printed).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.scaleout.partials import partition_of
from tests.support.broker import Broker
from tests.support.scaleout import WINDOW, reducer_process, replica
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

TOPIC, MODEL, DIM = "emb-group-canaries", "m", 16
FIRST, CANARY_STREAM = "a", "canary"  # m's first stream by name; the stream the canaries arrive on
CANARIES = ("c0", "c1")
Event = tuple[int, str, str, np.ndarray]  # (embeddings partition, stream, id, vector)
ROUNDS = 2  # of the pinned vectors (the first pins), then of the changed ones
TAKE_OVER_LIMIT_SECONDS = 60


def send(broker: Broker, events: list[Event]) -> None:
    """JSON events of model m."""
    producer = broker.producer()
    for partition, stream, ident, vector in events:
        payload = {"id": ident, "model": MODEL, "stream": stream, "vector": vector.astype(np.float32).tolist()}
        producer.send(TOPIC, orjson.dumps(payload), partition=partition)
    producer.flush()
    producer.close()



def docs(rng: np.random.Generator, partition: int, stream: str, count: int = 3) -> list[Event]:
    return [(partition, stream, f"doc-{rng.integers(1 << 30)}", rng.standard_normal(DIM)) for _ in range(count)]


def canary_round(rng: np.random.Generator, vectors: np.ndarray) -> list[Event]:
    """Both canaries, among a few ordinary records, on the canary stream (one embeddings partition:
    one replica forwards them, in order)."""
    return [*docs(rng, 0, CANARY_STREAM),
            *[(0, CANARY_STREAM, ident, vector) for ident, vector in zip(CANARIES, vectors, strict=True)]]


def owned(port: int) -> set[str]:
    samples = scrape(port)
    return {s for s in (FIRST, CANARY_STREAM)
            if value(samples, "embmon_reducer_stream_owned", model=MODEL, stream=s) == 1}


def mismatches(port: int) -> float | None:
    return value(scrape(port), "embmon_canary_mismatches_total", model=MODEL)


def compared(port: int) -> tuple[float | None, float | None, float | None]:
    """(pins, records compared, mismatches) of m this reducer exports."""
    samples = scrape(port)
    return tuple(value(samples, f"embmon_canary_{name}", model=MODEL)  # type: ignore[return-value]
                 for name in ("pins", "records_total", "mismatches_total"))


@pytest.mark.slow
def test_canaries_are_exported_by_the_reducer_that_compared_them_and_by_the_one_taking_their_stream_over(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    partials = f"{TOPIC}-partials"
    broker.create_topics(TOPIC, partitions=2)
    broker.create_topics(partials, partitions=2)
    assert FIRST < CANARY_STREAM and partition_of(MODEL, FIRST, [0, 1]) != partition_of(MODEL, CANARY_STREAM, [0, 1])
    for key, setting in WINDOW.items():
        monkeypatch.setenv(f"EMBMON_WINDOW__{key.upper()}", str(setting))
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_TOPIC", partials)
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")  # the reducers' environment says reducer
    monkeypatch.setenv("EMBMON_CANARIES__IDS", json.dumps({MODEL: list(CANARIES)}))  # replicas and reducers
    rng = np.random.default_rng(21)
    pinned = rng.standard_normal((len(CANARIES), DIM))
    changed = pinned @ np.linalg.qr(rng.standard_normal((DIM, DIM)))[0]  # a rotated space: same norms
    with contextlib.ExitStack() as running:
        replicas = [running.enter_context(replica(broker, TOPIC, f"replica-{i}", tmp_path / f"r{i}",
                                                  tmp_path / f"r{i}.log", group=f"{TOPIC}-replicas"))
                    for i in range(2)]
        reducers = [running.enter_context(reducer_process(broker, TOPIC, partials, tmp_path / f"reducer-{i}",
                                                          tmp_path / f"reducer-{i}.log"))
                    for i in range(2)]

        # both replicas in their group, one embeddings partition each, before any canary is sent
        def both_consuming() -> bool:
            send(broker, [*docs(rng, 0, FIRST, 1), *docs(rng, 1, FIRST, 1)])
            return all((value(scrape(r.port), "embmon_records_total", model=MODEL, stream=FIRST) or 0) > 0
                       for r in replicas)

        wait_until(both_consuming, timeout=90, interval=1.0, message="both replicas consuming a partition")
        for _ in range(ROUNDS):
            send(broker, [*docs(rng, 1, FIRST), *canary_round(rng, pinned)])
        wait_until(lambda: sorted(map(owned, (r.port for r in reducers)), key=sorted) == [{FIRST}, {CANARY_STREAM}],
                   timeout=90, message="each reducer owns one of m's streams")
        (comparing,) = [r for r in reducers if owned(r.port) == {CANARY_STREAM}]
        (other,) = [r for r in reducers if r is not comparing]
        pins_only = (len(CANARIES), len(CANARIES) * (ROUNDS - 1), 0)
        wait_until(lambda: compared(comparing.port) == pins_only, timeout=60,
                   message="the pinned rounds compared by the owner of the canary stream",
                   on_timeout=lambda: f"(pins, compared, mismatches) exported: {compared(comparing.port)}")

        for _ in range(ROUNDS):
            send(broker, canary_round(rng, changed))
        expected = (len(CANARIES), len(CANARIES) * (2 * ROUNDS - 1), len(CANARIES) * ROUNDS)
        # (1) the owner of the canary stream, not of m's first stream, exports m's mismatches
        wait_until(lambda: compared(comparing.port) == expected, timeout=60,
                   message="the changed canaries' mismatches exported by the reducer that compared them")
        # (2) the owner of m's first stream compared none and exports no mismatch of m
        assert not mismatches(other.port)
        assert owned(other.port) == {FIRST}

        # (3) the comparing reducer dies: the survivor takes the canary stream over and compares
        # every arrival still in the window
        assert comparing.kill() == -signal.SIGKILL
        killed_at = time.monotonic()
        wait_until(lambda: (mismatches(other.port) or 0) > 0, timeout=TAKE_OVER_LIMIT_SECONDS + 30, interval=0.1,
                   message="the survivor exports m's canary mismatches")
        take_over = time.monotonic() - killed_at
        print(f"reducer group canaries: the survivor exported m's canary mismatches {take_over:.1f} s after the "
              "SIGKILL of the reducer that compared them")
        assert take_over <= TAKE_OVER_LIMIT_SECONDS
        # it pinned the first arrivals (the pinned vectors) and compared the rest, each once
        wait_until(lambda: compared(other.port) == expected, timeout=30,
                   message="the survivor compared every arrival in the window once")
        wait_until(lambda: owned(other.port) == {FIRST, CANARY_STREAM}, timeout=30,
                   message="the survivor exports both streams once a refresh followed their rebuild")
        assert all(r.returncode is None for r in replicas)
