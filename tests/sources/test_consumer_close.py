"""A consumer whose group leave raises at close still closes its connections (``close_consumer``).

``KafkaConsumer.close`` closes its network client only after the coordinator has left the group.
When leaving raises (a rebalance under way, a coordinator gone: seen under load while two replicas
handed partitions over), the client's sockets stayed open until the garbage collector found them,
and the suite's leak check failed whichever test was running then.
"""

from __future__ import annotations

import gc
import warnings

import pytest
from kafka.errors import KafkaError

from monitor.sources.kafka.clients import TopicPartition, new_consumer
from monitor.sources.kafka.internals import close_consumer
from tests.support.broker import FAST_GROUP_OPTIONS, Broker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker]


def connected_consumer(broker: Broker, topic: str) -> object:
    """A consumer of ``topic`` in a group, connected to the broker (by assignment: no join to wait for)."""
    broker.create_topics(topic)
    consumer = new_consumer({"bootstrap_servers": broker.bootstrap, "group_id": f"{topic}-group",
                             "auto_offset_reset": "earliest", "enable_auto_commit": False, **FAST_GROUP_OPTIONS})
    consumer.assign([TopicPartition(topic, 0)])
    consumer.poll(timeout_ms=500)
    wait_until(lambda: bool(consumer._client._manager._conns), timeout=30,  # type: ignore[attr-defined]
               message="the consumer connected")
    return consumer


@pytest.mark.parametrize("closer", ["source", "reducer"])
@pytest.mark.parametrize("failure", ["kafka-error", "other"])
def test_a_consumer_whose_group_leave_raises_closes_its_connections(broker: Broker, failure: str, closer: str) -> None:
    # the reducer's intake closes its partials consumers through the same close (a fresh-clone run found one
    # left open behind three replicas and a reducer); its _close_all swallows the error, as at shutdown
    from monitor.scaleout.intake import _close_all

    consumer = connected_consumer(broker, f"close-leave-{failure}-{closer}")
    client = consumer._client  # type: ignore[attr-defined]

    def leave(*args: object, **kwargs: object) -> None:
        raise KafkaError("leaving the group failed") if failure == "kafka-error" else RuntimeError("the loop broke")

    consumer._coordinator.close = leave  # type: ignore[attr-defined]
    if closer == "reducer":
        _close_all((consumer, None))  # type: ignore[arg-type]
    else:
        with pytest.raises((KafkaError, RuntimeError)):
            close_consumer(consumer, timeout_ms=1000)  # type: ignore[arg-type]
    assert not client._manager._conns, "every broker connection closed"
    del consumer, client
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()  # an unclosed socket would raise here


def test_a_clean_close_then_the_client_again_raises_nothing(broker: Broker) -> None:
    consumer = connected_consumer(broker, "close-clean")
    close_consumer(consumer, timeout_ms=1000)  # type: ignore[arg-type]
    assert not consumer._client._manager._conns  # type: ignore[attr-defined]



def test_a_connection_with_bytes_still_to_send_is_closed_with_its_client(broker: Broker) -> None:
    """kafka-python's transport defers its close until its write buffer is flushed, by the selector
    whose loop the client's close ends: the socket stayed open for the collector (a fresh-clone run's
    leak behind three replicas and a reducer, made connected). Closed with its client instead."""
    consumer = connected_consumer(broker, "close-unflushed")
    conns = list(consumer._client._manager._conns.values())  # type: ignore[attr-defined]
    transports = [c.transport for c in conns if getattr(c, "transport", None) is not None]
    assert transports
    for transport in transports:  # as if the kernel's send buffer was full when the close came
        transport._write_buffer.append(b"\0" * 64)
    sockets = [t._sock for t in transports]
    close_consumer(consumer, timeout_ms=1000)  # type: ignore[arg-type]
    assert all(s.fileno() == -1 for s in sockets), "every socket closed with its client"
    del consumer, conns, transports, sockets
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()
