"""The kafka-python internals the Kafka source relies on still exist in the installed version.

monitor/sources/kafka_internals.py says why each is needed; an upgrade that moves one must fail
here, not during a rebalance in production.
"""

from __future__ import annotations

import inspect

import kafka
from kafka import KafkaConsumer
from kafka.consumer import fetcher
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


def test_the_fetcher_internals_that_take_a_failed_partition_out_exist() -> None:
    """take_fetch_failure reads the records in line and the parked error, and drains the records."""
    consumer_init = inspect.getsource(KafkaConsumer.__init__)
    assert "self._fetcher" in consumer_init
    fetcher_init = inspect.getsource(fetcher.Fetcher.__init__)
    for attribute in ("self._next_partition_records", "self._next_in_line_exception_metadata"):
        assert attribute in fetcher_init, attribute
    assert fetcher.ExceptionMetadata._fields == ("partition", "fetched_offset", "exception")
    records = inspect.getsource(fetcher.Fetcher.PartitionRecords.__init__)
    for attribute in ("self.topic_partition", "self.next_fetch_offset"):
        assert attribute in records, attribute
    assert callable(fetcher.Fetcher.PartitionRecords.drain)
