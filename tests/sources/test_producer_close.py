"""A producer closed with records it cannot deliver stops its I/O thread (``close_producer``).

kafka-python's ``close`` flushes first; with the broker gone the flush raises before the I/O thread
is told to stop, and that thread retried for the life of the process. The partials publisher drops
its producer on every failed publication, so a replica whose broker was away leaked one such thread
(and its sockets) per failure; the thread-leak check of the test suite caught it on a loaded machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

from monitor.sources.kafka.clients import close_producer, new_producer
from tests.support.broker import Broker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker]


def io_thread(client_id: str) -> weakref.ref[threading.Thread]:
    """The producer's I/O thread, weakly: a reference would keep its client, and its sockets, alive."""
    return weakref.ref(next(t for t in threading.enumerate() if t.name == f"{client_id}-network-thread"))


def ended(thread: weakref.ref[threading.Thread]) -> bool:
    alive = thread()
    return alive is None or not alive.is_alive()


@pytest.mark.slow  # a broker of its own, stopped under the producer: 6 s
def test_a_producer_holding_records_for_a_stopped_broker_closes_and_its_io_thread_ends() -> None:
    client_id = "close-with-pending"
    broker = Broker().start()
    try:
        broker.create_topics("pending")
        producer = new_producer({"bootstrap_servers": broker.bootstrap, "client_id": client_id,
                                 "allow_auto_create_topics": False, "max_block_ms": 5000})
        producer.send("pending", b"delivered").get(timeout=30)  # the topic's metadata is now known
    finally:
        broker.stop()
    pending = producer.send("pending", b"never delivered")  # waits in the accumulator: no broker to take it
    thread = io_thread(client_id)
    # a weak proxy whose object is gone, as kafka-python's cluster metadata keeps of the connection
    # manager of a producer dropped before: the close's scan of the collector's objects must pass it
    gone = weakref.proxy(threading.Event())
    close_producer(producer, timeout=1.0)
    assert gone is not None
    wait_until(lambda: ended(thread), timeout=30, interval=0.1, message="the I/O thread to end")
    assert pending.is_done and pending.failed()  # the record a close could not wait for failed, visibly


def test_a_producer_with_nothing_pending_closes_as_before(broker: Broker) -> None:
    client_id = "close-with-nothing-pending"
    broker.create_topics("nothing-pending")
    producer = new_producer({"bootstrap_servers": broker.bootstrap, "client_id": client_id,
                             "allow_auto_create_topics": False})
    producer.send("nothing-pending", b"delivered").get(timeout=30)
    thread = io_thread(client_id)
    close_producer(producer, timeout=5.0)
    wait_until(lambda: ended(thread), timeout=30, interval=0.1, message="the I/O thread to end")


NEVER_CONNECTED = textwrap.dedent(
    """
    import gc, os, time
    from monitor.sources.kafka.clients import KafkaError, close_producer, new_producer

    try:  # its bootstrap finds no broker
        new_producer({"bootstrap_servers": "127.0.0.1:1", "bootstrap_timeout_ms": 1000})
    except KafkaError:
        pass
    # told the broker's version, it does not bootstrap: built, it keeps trying to connect
    producer = new_producer({"bootstrap_servers": "127.0.0.1:1", "api_version": (2, 5)})
    time.sleep(1.0)
    close_producer(producer, timeout=1.0)
    del producer
    gc.collect()
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the listing's own descriptor, closed by now
    print(sum(link.startswith("socket:") for link in links))
    """
)


def test_a_producer_that_never_connected_leaves_no_socket_open() -> None:
    """Neither a producer whose bootstrap fails nor one closed before it ever connected leaves a socket
    for the collector, in a process whose only Kafka clients are built by these factories (a reducer:
    the refused attempts' sockets were closed only once the Kafka source had started, and a failed
    constructor left its selector's wake-up sockets)."""
    run = subprocess.run([sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", NEVER_CONNECTED],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ResourceWarning" not in run.stderr, run.stderr[-3000:]
    assert run.stdout.strip() == "0", run.stderr[-3000:]


def test_a_producer_connection_with_bytes_still_to_send_is_closed_with_it(broker: Broker) -> None:
    """kafka-python's transport defers closing its socket until its write buffer is flushed, by the
    loop the producer's close ends: the socket stayed open for the collector. Closed with the producer."""
    import gc
    import warnings

    producer = new_producer({"bootstrap_servers": broker.bootstrap, "client_id": "close-unflushed"})
    broker.create_topics("unflushed")
    producer.send("unflushed", b"delivered").get(timeout=30)
    conns = list(producer._sender._client._manager._conns.values())  # type: ignore[attr-defined]
    transports = [c.transport for c in conns if getattr(c, "transport", None) is not None]
    assert transports
    for transport in transports:  # as if the kernel's send buffer was full when the close came
        transport._write_buffer.append(b"\0" * 64)
    sockets = [t._sock for t in transports]
    close_producer(producer, timeout=2)
    assert all(s.fileno() == -1 for s in sockets), "every socket closed with the producer"
    del producer, conns, transports, sockets
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        gc.collect()
