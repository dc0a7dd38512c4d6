"""A replica and a reducer on librdkafka (``kafka.client: confluent``) through the real broker.

Every client either builds comes from the same options on the same library: the replica's source,
its partials producer and its resume reader, and the reducer's intake. The replica publishes the
partials of what it consumed, is SIGKILLed, and resumes from its checkpoint and the manifests it
published; the reducer's window ends holding every record exactly once.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from monitor.sources.kafka.rdkafka import LibrdkafkaConsumer
from tests.support import daemons
from tests.support.broker import Broker, client_settings
from tests.support.logs import tracebacks
from tests.support.scaleout import PARTITIONS, exported, produce, replica, scaled_settings
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

STREAMS = ("s0", "s1")


def merged(port: int) -> dict[str, float]:
    return {s: n for s, n in exported(port).items() if s in STREAMS}


@pytest.mark.slow
def test_a_replica_on_librdkafka_publishes_partials_and_resumes_after_a_restart(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = "emb-librdkafka", "librdkafka-replicas"
    settings = scaled_settings(monkeypatch, broker, topic, group, tmp_path,
                               extra={"kafka": client_settings("confluent")})
    logs = [tmp_path / "a-1.log", tmp_path / "a-2.log"]
    with daemons.reducer(settings) as reducer:
        with replica(broker, topic, "lib-a", tmp_path / "a", logs[0], group=group, client="confluent") as first:
            wait_until(lambda: "assigned partitions: [(" in first.output(), timeout=60,
                       message="the replica got its partitions")
            expected = produce(broker, topic, 1, STREAMS, PARTITIONS, batches=4)
            wait_until(lambda: merged(reducer.http.port) == expected, timeout=90,
                       message=f"the reducer merged {expected}")
            assert first.kill() == -signal.SIGKILL
        assert isinstance(reducer.intake._consumer, LibrdkafkaConsumer)  # the reducer's intake: librdkafka too
        more = produce(broker, topic, 2, STREAMS, PARTITIONS, batches=4)
        expected = {s: expected[s] + more[s] for s in STREAMS}
        with replica(broker, topic, "lib-a", tmp_path / "a", logs[1], group=group, client="confluent") as second:
            wait_until(lambda: merged(reducer.http.port) == expected, timeout=90,
                       message=f"the restarted replica's publications bring the reducer to {expected}")
            restarted = second.output()
    text = [log.read_text() for log in logs]
    # the partials producer and the resume reader were librdkafka's, built from the same options as its source
    for name in ("partials-lib-a", "resume-lib-a"):
        assert all(f"Kafka {kind} " in t for t in text for kind in ("producer", "consumer")), name
        assert all(any(name in line and "on librdkafka" in line for line in t.splitlines()) for t in text), name
    assert "restored state from" in restarted and not [tb for t in text for tb in tracebacks(t)]
