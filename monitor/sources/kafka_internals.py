"""Every use of kafka-python internals, in one place, each for want of a public API.

kafka-python 3 runs rebalance listeners on its IO loop, where blocking consumer calls (such as
``KafkaConsumer.committed``) are forbidden. What a listener needs there has no public async form:

* :func:`fetch_committed` awaits the coordinator's ``fetch_committed_offsets_async``: the public
  ``KafkaConsumer.committed`` blocks the loop;
* :func:`yield_to_loop` awaits the loop's ``sleep``: nothing public lets a listener wait for a
  worker thread while heartbeats go on (a kafka ``Future`` completed from another thread would
  resume the listener without waking the loop);
* :func:`any_broker_connected` asks the client which brokers have a live connection: the public
  ``bootstrap_connected`` only covers the bootstrap connection, which is closed once metadata is
  known.

Committing on revocation uses the public ``KafkaConsumer.commit_async``, awaited. Also here:
:func:`close_failed_connect_sockets`, a fix for a file-descriptor leak in kafka-python 3.0.x.
``tests/sources/test_kafka_internals.py`` checks that each internal still exists, so an upgrade
that moves one fails a test rather than a rebalance.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaConsumer


async def fetch_committed(consumer: KafkaConsumer, partitions: list[Any], timeout_ms: int) -> dict[Any, Any]:
    """The group's committed ``OffsetAndMetadata`` per partition, awaited on the IO loop."""
    return await consumer._coordinator.fetch_committed_offsets_async(partitions, timeout_ms)  # type: ignore[no-any-return]


async def yield_to_loop(consumer: KafkaConsumer, seconds: float) -> None:
    """Let the IO loop run (heartbeats, fetches) for ``seconds`` before resuming."""
    await consumer._net.sleep(seconds)


def any_broker_connected(consumer: KafkaConsumer, default: bool) -> bool:
    """Whether the consumer holds a live connection to some broker (``default`` when unknown)."""
    client = getattr(consumer, "_client", None)
    if client is None:
        return default
    try:
        brokers = client.cluster.brokers()
        if not brokers:
            return False
        ids = [getattr(b, "node_id", getattr(b, "nodeId", None)) for b in brokers]
        return any(client.connected(node) for node in ids if node is not None)
    except Exception:  # noqa: BLE001 - a diagnostics probe must never break polling
        return default


def close_failed_connect_sockets() -> None:
    """kafka-python 3.0 leaks the socket of every failed connection attempt (closed only when
    the garbage collector finds it), so a long broker outage piles up file descriptors. Close it
    on failure instead. Applied once, only to the version whose ``connect`` has the leak."""
    import kafka
    from kafka.net.inet import KafkaNetSocket

    if not str(kafka.__version__).startswith("3.0.") or getattr(KafkaNetSocket.connect, "_embmon", False):
        return

    async def connect(self: Any, net: Any, addrinfo: Any, socket_options: Any = (), timeout_at: Any = None) -> Any:
        family, sock_type, proto, _canonname, sockaddr = addrinfo
        sock = self.socket(family, sock_type, proto)
        try:
            sock.setblocking(False)
            for option in socket_options:
                sock.setsockopt(*option)
            return await self.sock_connect(net, sock, sockaddr, timeout_at=timeout_at)
        except BaseException:
            sock.close()
            raise

    connect._embmon = True  # type: ignore[attr-defined]
    KafkaNetSocket.connect = connect  # type: ignore[method-assign]
