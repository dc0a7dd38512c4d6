"""No input stops consumption: a poison message between valid ones, through a real broker.

The poison is the event that once stopped consumption, an embedding event and an interaction event whose ``ts`` is
``1`` followed by 400 zeros: ``float()`` of it raised OverflowError, which killed the JSON worker,
then the in-process fallback, then the poll thread, lost the valid events of the poll, turned
/healthz 503, and met every restart again (nothing past it was committed). Here each poison is
one invalid record, every valid record around it counts once, /healthz stays 200, the offsets
move past it, and a restart (same state, same group) counts nothing twice.

The second part keeps the guarantee for what is not input: a daemon thread that dies for any
reason turns /healthz 503 and the log says which thread and why.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.decoding.records import SourcePosition
from monitor.sources.base import Source, SourceMessage
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scrape import Samples, http_status, scrape, value
from tests.support.waiting import wait_until

DIM = 8
POISON_TS = b"1" + b"0" * 400


def poison_embedding(i: int) -> bytes:
    return b'{"id": "poison-%d", "model": "json-model", "stream": "docs", "vector": [%s], "ts": %s}' % (
        i, b", ".join([b"0.5"] * DIM), POISON_TS)  # fmt: skip


def poison_interaction(i: int) -> bytes:
    return b'{"query_id": "poison-%d", "model": "json-model", "results": ["doc-1"], "ts": %s}' % (i, POISON_TS)


def produce_round(broker: Broker, topics: tuple[str, str], rng: np.random.Generator, first: int) -> dict[str, int]:
    """40 JSON embedding events and a binary batch of 25 rows on one topic, 20 interaction events on
    the other, each with a poison in the middle; returns the messages written per topic."""
    embeddings, interactions = topics
    producer = broker.producer()
    for i in range(first, first + 40):
        event = {"id": f"doc-{i}", "model": "json-model", "stream": "docs", "ts": 1763700000.0 + i,
                 "vector": rng.standard_normal(DIM).tolist()}  # fmt: skip
        producer.send(embeddings, orjson.dumps(event))
        if i == first + 20:
            producer.send(embeddings, poison_embedding(i))
            rows = rng.standard_normal((25, DIM)).astype("<f4").tobytes()
            headers = [("model", b"bin-model"), ("dim", b"%d" % DIM), ("stream", b"docs")]
            producer.send(embeddings, rows, headers=headers)
    for i in range(first, first + 20):
        producer.send(interactions, orjson.dumps({"query_id": f"q-{i}", "model": "json-model", "results": ["doc-1"],
                                                  "clicks": ["doc-1"], "ts": 1763700000.0 + i}))  # fmt: skip
        if i == first + 10:
            producer.send(interactions, poison_interaction(i))
    producer.flush()
    producer.close()
    return {embeddings: 40 + 2, interactions: 20 + 1}


def invalid_by_reason(samples: Samples) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, labels), n in samples.items():
        if name == "embmon_records_invalid_total":
            reason = dict(labels)["reason"]
            out[reason] = out.get(reason, 0) + n
    return out


def counts(samples: Samples) -> tuple[float | None, float | None, float | None, dict[str, float]]:
    return (
        value(samples, "embmon_records_total", model="json-model", stream="docs"),
        value(samples, "embmon_records_total", model="bin-model", stream="docs"),
        value(samples, "embmon_interactions_total", model="json-model"),
        invalid_by_reason(samples),
    )


@pytest.mark.slow
@pytest.mark.broker
def test_a_poison_message_is_one_invalid_record_and_consumption_goes_on(
    broker: Broker, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topics = ("poison-emb", "poison-int")
    group = "poison-group"
    broker.create_topics(*topics)
    rng = np.random.default_rng(18)
    written = produce_round(broker, topics, rng, first=0)

    def settings(json_workers: int):  # type: ignore[no-untyped-def]
        return load_settings(overrides=kafka_daemon_overrides(
            broker, topics[0], group, state_dir, kafka={"interactions_topic": topics[1]},
            decoding={"json_workers": json_workers}))  # fmt: skip

    def caught_up(port: int) -> Samples:
        """The scrape once every assigned partition of both topics measured no lag, else {}."""
        samples = scrape(port)
        lags = [value(samples, "embmon_consumer_lag_records", topic=t) for t in topics]
        return samples if lags == [0, 0] else {}

    def committed_all(expected: dict[str, int]) -> None:
        for topic, n in expected.items():
            wait_until(functools.partial(lambda t, m: broker.committed(group, t) == m, topic, n), timeout=20,
                       message=f"offsets of {topic} committed up to {n}")  # fmt: skip

    def first_round_counted(port: int) -> bool:
        samples = caught_up(port)
        return bool(samples) and counts(samples)[:3] == (40, 25, 20)

    # First run: JSON parsed in a worker process (the default), where it once stopped consumption.
    with caplog.at_level(logging.WARNING), daemons.monitor(settings(json_workers=1)) as monitor:
        port = monitor.http.port
        wait_until(lambda: first_round_counted(port), timeout=60, message="the first round counted")
        first = counts(scrape(port))
        assert first == (40, 25, 20, {"bad_timestamp": 2})  # one invalid record per poison, nothing else
        assert http_status(port, "/healthz") == 200 and monitor.pipeline.alive
        assert monitor.errors.counts.snapshot() == {}  # no worker fell over, no internal error
        committed_all(written)  # the offsets moved past the poison
    assert "skipping invalid record (bad_timestamp)" in caplog.text
    assert "died" not in caplog.text and "Traceback" not in caplog.text

    # Restart on the same state and group (JSON in-process this time, the workers' fallback path):
    # nothing is counted twice, and a second round with its own poisons is counted once.
    with daemons.monitor(settings(json_workers=0)) as monitor:
        port = monitor.http.port
        restarted = counts(wait_until(lambda: caught_up(port), timeout=60, message="partitions assigned, no lag"))
        assert restarted == first
        assert http_status(port, "/healthz") == 200
        written2 = produce_round(broker, topics, rng, first=1000)
        wait_until(lambda: counts(scrape(port))[:3] == (80, 50, 40), timeout=60,
                   message="every valid record of the second round counted")  # fmt: skip
        assert counts(scrape(port)) == (80, 50, 40, {"bad_timestamp": 4})
        assert http_status(port, "/healthz") == 200 and monitor.pipeline.alive
        committed_all({topic: written[topic] + written2[topic] for topic in topics})


# -- a thread that dies is not hidden ----------------------------------------------------------------


class _Trickle(Source):
    """Valid JSON events, one per poll, forever."""

    name = "trickle"

    def __init__(self) -> None:
        self.offset = 0

    def poll(self, timeout: float) -> list[SourceMessage]:
        self.offset += 1
        value = orjson.dumps({"id": self.offset, "model": "m", "vector": [1.0, 2.0, 3.0, 4.0]})
        return [SourceMessage(value, (), "embeddings", SourcePosition("t", 0, self.offset))]


@pytest.mark.parametrize("thread", ["embmon-poll", "embmon-apply"])
def test_a_thread_that_dies_turns_healthz_503_and_logs_why(
    thread: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(overrides={"http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path),
                                        "checkpoint": {"enabled": False}, "drift": {"enabled": False},
                                        "kafka": {"poll_timeout_seconds": 0.05}})  # fmt: skip
    with caplog.at_level(logging.WARNING), daemons.monitor(settings, source=_Trickle()) as monitor:
        port = monitor.http.port
        wait_until(lambda: (s := monitor.registry.get("m", "default")) is not None and s.records_total > 3,
                   timeout=20, message="consuming")  # fmt: skip
        assert http_status(port, "/healthz") == 200

        def die(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug nobody foresaw")

        # Past the record boundary: the poll thread's decoding as a whole, the apply thread's offset bookkeeping.
        target = monitor.pipeline.decoder if thread == "embmon-poll" else monitor.pipeline.offsets
        monkeypatch.setattr(target, "finish_embeddings" if thread == "embmon-poll" else "mark_applied", die)
        wait_until(lambda: http_status(port, "/healthz") == 503, timeout=20, message="healthz 503")
        assert not monitor.pipeline.alive
    deaths = [r for r in caplog.records if r.levelno == logging.CRITICAL and "died" in r.getMessage()]
    assert [r.getMessage() for r in deaths] == [f"thread {thread} died; /healthz now fails"]
    assert deaths[0].exc_info is not None and "a bug nobody foresaw" in str(deaths[0].exc_info[1])
