"""The kafka-python internals the Kafka source relies on still exist in the installed version.

monitor/sources/kafka_internals.py says why each is needed; an upgrade that moves one must fail
here, not during a rebalance in production.
"""

from __future__ import annotations

import inspect

import kafka
from kafka import KafkaConsumer
from kafka.coordinator.consumer import ConsumerCoordinator
from kafka.net.selector import NetworkSelector


def test_the_internals_used_on_the_io_loop_exist() -> None:
    assert inspect.iscoroutinefunction(ConsumerCoordinator.fetch_committed_offsets_async)
    assert callable(NetworkSelector.sleep)
    consumer_init = inspect.getsource(KafkaConsumer.__init__)
    for attribute in ("self._coordinator", "self._net", "self._client"):
        assert attribute in consumer_init, attribute


def test_commit_on_revocation_uses_the_public_awaitable_commit() -> None:
    assert "commit_async" in dir(KafkaConsumer)
    assert hasattr(kafka.future.Future, "__await__")
