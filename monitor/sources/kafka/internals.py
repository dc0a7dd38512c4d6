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

Where a partition's position is checked against its log (``monitor/sources/kafka/positions.py``):

* :func:`topic_id` reads the topic's id (KIP-516, metadata v10+) from the client's cluster
  metadata, which ``KafkaConsumer`` does not expose: a changed id is a deleted and recreated topic;
* :func:`forget_highwater` clears the partition's last high watermark after a seek, so that the
  next one the consumer reports comes from a fetch at the new position (kafka-python keeps the
  old one until then, and takes a new one only from a fetch at the current position);
* :func:`current_position` reads the position the consumer holds, without the network round
  trips ``KafkaConsumer.position`` may make.

Committing on revocation uses the public ``KafkaConsumer.commit_async``, awaited. Also here:
:func:`close_consumer`, which closes the network client that ``KafkaConsumer.close`` leaves open
when leaving the group raises, :func:`close_failed_connect_sockets`, a fix for a file-descriptor
leak in kafka-python 3.0.x,
:func:`take_fetch_failure`, which keeps a partition whose records cannot be read (a compression
codec whose library is missing) from hanging the next poll, and :func:`read_unreadable_records`,
which turns a record kafka-python cannot parse (a header key that is not UTF-8) into a placeholder
the source counts and skips: kafka-python would raise from the whole poll at it, every time, and
the partition would never move past it.
``tests/sources/test_kafka_internals.py`` checks that each internal still exists, so an upgrade
that moves one fails a test rather than a rebalance.
"""

from __future__ import annotations

import gc
import logging
import socket
import types
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

logger = logging.getLogger(__name__)


async def fetch_committed(consumer: KafkaConsumer, partitions: list[Any], timeout_ms: int) -> dict[Any, Any]:
    """The group's committed ``OffsetAndMetadata`` per partition, awaited on the IO loop."""
    return await consumer._coordinator.fetch_committed_offsets_async(partitions, timeout_ms)


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


def topic_id(consumer: KafkaConsumer, topic: str) -> Any:
    """The topic's id (a ``uuid.UUID``) from the last metadata, None when unknown or not sent."""
    try:
        return consumer._client.cluster.topic_id(topic)
    except Exception:  # noqa: BLE001 - an id is a check's input, never worth breaking a poll
        return None


def forget_highwater(consumer: KafkaConsumer, partition: TopicPartition) -> None:
    """Drop the partition's last known high watermark (after a seek: it described the old position)."""
    state = consumer._subscription.assignment.get(partition)
    if state is not None:
        state.highwater = None


def current_position(consumer: KafkaConsumer, partition: TopicPartition) -> int | None:
    """The next offset the consumer will return for ``partition``; None while it has none (a reset pending)."""
    state = consumer._subscription.assignment.get(partition)
    position = getattr(state, "position", None)
    return None if position is None else int(position.offset)


def close_consumer(consumer: KafkaConsumer, timeout_ms: int | None = None) -> None:
    """``consumer.close(autocommit=False)``, and its network client closed whatever that raised.

    ``KafkaConsumer.close`` closes its client only after the coordinator has left the group: when
    leaving raises (a rebalance under way, a coordinator gone, under load), the client's connections
    and selector stay open until the garbage collector finds them. Closing the client again after a
    clean close does nothing. The close's own exception propagates.
    """
    transports = client_transports(getattr(consumer, "_client", None))
    try:
        consumer.close(autocommit=False, timeout_ms=timeout_ms)
    finally:
        client = getattr(consumer, "_client", None)
        if client is not None:
            try:
                client.close()
            except Exception:  # closing what is left; the first error is the one to report
                logger.debug("closing the Kafka consumer's network client", exc_info=True)
        close_sockets(transports)


def client_transports(client: object) -> list[Any]:
    """The transports of a kafka-python network client's connections, taken before it is closed.

    A transport whose close comes while it still has bytes to send defers closing its socket until
    the selector has flushed them, and the client's close ends the selector's loop: the socket then
    stays open for the collector (a ``ResourceWarning`` in whichever later code collects).
    :func:`close_sockets` closes them after the client's close."""
    conns = getattr(getattr(client, "_manager", None), "_conns", None)
    if not isinstance(conns, dict):
        return []
    return [t for t in (getattr(c, "transport", None) for c in list(conns.values())) if t is not None]


def close_sockets(transports: list[Any]) -> None:
    """Close the sockets of ``transports`` that their closed client left open (:func:`client_transports`)."""
    for transport in transports:
        sock = getattr(transport, "_sock", None)
        if isinstance(sock, socket.socket):
            sock.close()


def close_abandoned_sockets(client: object) -> None:
    """Close the sockets a closed kafka-python network client ``client`` abandoned, wherever they are.

    Two kinds outlive kafka-python 3.0's close, closed only when the collector finds them:

    * a connection attempt under way: its socket is a local of ``KafkaNetSocket.sock_connect``,
      whose frame a suspended coroutine or an exception's traceback keeps (a log record or a failed
      future of that client holds the exception);
    * a connection whose transport still had bytes to send (:func:`client_transports`), including
      one the client had dropped already.

    Found by a scan of the collector's objects for those of this client's selector only (another
    client's may be connecting now): 60 ms with the test suite's imports, so on a rare path only (a
    producer that could not deliver)."""
    net = getattr(client, "_net", None)
    if net is None:
        return
    from kafka.net.inet import KafkaNetSocket
    from kafka.net.transport import KafkaTCPTransport

    code = KafkaNetSocket.sock_connect.__code__
    for thing in gc.get_objects():
        # type(), not isinstance(): a weak proxy whose object is gone (kafka-python's cluster metadata
        # keeps one of a dropped client's connection manager) raises ReferenceError when asked its class
        kind = type(thing)
        if kind is types.CoroutineType or kind is types.FrameType:
            frame = thing.cr_frame if kind is types.CoroutineType else thing
            if frame is not None and frame.f_code is code and frame.f_locals.get("net") is net:
                sock = frame.f_locals.get("sock")
                if isinstance(sock, socket.socket):
                    sock.close()
        elif issubclass(kind, KafkaTCPTransport) and thing._net is net:
            sock = thing._sock
            if isinstance(sock, socket.socket):
                sock.close()


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
    KafkaNetSocket.connect = connect


@dataclass(frozen=True)
class FetchFailure:
    """Fetched records of ``partition`` from ``offset`` on could not be read, because of ``error``."""

    partition: TopicPartition
    offset: int
    error: BaseException


def take_fetch_failure(consumer: KafkaConsumer, raised: BaseException | None) -> FetchFailure | None:
    """The partition whose fetched records the last poll could not read, taken out of the fetcher.

    ``raised`` is what ``poll`` raised (None when it returned). kafka-python 3.0 reads a partition's
    records through a generator; when decoding raises (``UnsupportedCodecError``,
    ``CorruptRecordError``) the generator is dead but the fetcher keeps it as the next records in
    line, and the next ``poll`` loops on it forever without a timeout (it yields nothing and is
    never drained): one core pinned, the poll thread stuck. When other partitions' records came
    first, the error is instead parked for the next ``poll`` to raise (and dropped, leaving the
    dead generator in line, if the partition is paused meanwhile). Both are taken here: the dead
    records are drained, so nothing hangs. Nothing is lost: the partition's position only moves
    past records ``poll`` returned, so a later fetch reads the same records again.
    """
    fetcher = consumer._fetcher
    error, partition, offset = raised, None, None
    if error is None:
        parked = fetcher._next_in_line_exception_metadata
        if parked is None:
            return None
        fetcher._next_in_line_exception_metadata = None
        error, partition, offset = parked.exception, parked.partition, parked.fetched_offset
    records = fetcher._next_partition_records
    if records and (partition is None or records.topic_partition == partition):
        partition, offset = records.topic_partition, records.next_fetch_offset
        records.drain()
    if partition is None or offset is None:
        return None
    return FetchFailure(partition, int(offset), error)


# -- records kafka-python cannot parse ---------------------------------------------------------------


class UnreadableRecord(list):
    """The headers of a placeholder record: empty, with the reason its record could not be read.

    A list (kafka-python sums the sizes of a record's headers), and a type no parsed record has,
    so no producer can forge one: ``isinstance`` is the test, never a header name."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        super().__init__()
        self.reason = reason


def unreadable_reason(headers: Any) -> str | None:
    """The reason a record from a consumer could not be read (None for a record that was)."""
    return headers.reason if isinstance(headers, UnreadableRecord) else None


class _CorruptBatch(tuple):
    """A batch's header fields, marking a batch none of whose records can be trusted or read."""


def read_unreadable_records() -> None:
    """Make kafka-python hand over a placeholder for a record it cannot parse, and read on.

    kafka-python 3.0 decodes a header key with ``bytes.decode("utf-8")`` while it reads a record
    of a fetched batch; any producer can write a key that is not UTF-8, and the error ends the
    batch's record generator: ``poll`` raises ``CorruptRecordError`` at that record on every call,
    and the partition (and every replica or reducer that takes it over) never moves past it. A
    batch whose checksum fails (a broker such as tansu stores what a producer sends), or whose
    compressed payload cannot be decompressed, stalls its partition the same way. Wrapped here:

    * a record whose reading raises, but whose frame (its length, its offset within the batch) is
      sound, becomes a record with no key, no value and :class:`UnreadableRecord` headers
      (``bad_header`` for a key that is not UTF-8, ``corrupt_record`` otherwise), and the batch reads
      on after it;
    * a broken frame hides where the next record starts, and a batch that fails its checksum or its
      decompression cannot be trusted at all: the rest of the batch becomes one ``corrupt_record``
      placeholder at the batch's last offset, and the partition reads on after it.

    Control batches (the broker's transaction markers) and a codec whose library is missing
    (``UnsupportedCodecError``: paused and retried, see ``sources/kafka/source.py``) keep kafka-python's
    behaviour. Applied once, only to kafka-python 3.0.x.
    """
    import kafka
    from kafka.errors import UnsupportedCodecError
    from kafka.record.default_records import DefaultRecord, DefaultRecordBatch
    from kafka.record.util import decode_varint

    validate, iterate, read = DefaultRecordBatch.validate_crc, DefaultRecordBatch.__iter__, DefaultRecordBatch.__next__
    if not str(kafka.__version__).startswith("3.0.") or getattr(read, "_embmon", False):
        return

    def placeholder(batch: Any, reason: str, offset: int, size: int) -> Any:
        return DefaultRecord(size, offset, batch.first_timestamp, batch.timestamp_type, None, None,
                             UnreadableRecord(reason))

    def end_batch(batch: Any, start: int) -> Any:
        """One placeholder for the rest of ``batch``, which then ends."""
        batch._header_data = tuple(batch._header_data)
        batch._pos, batch._num_records = len(batch._buffer), batch._next_record_index
        return placeholder(batch, "corrupt_record", batch.last_offset, max(1, len(batch._buffer) - start))

    def skip_record(batch: Any, start: int, error: BaseException) -> Any:
        """A placeholder for the record at ``start`` whose reading raised ``error``, the batch read on
        after it; the end of the batch when the record's frame is broken."""
        try:
            length, pos = decode_varint(batch._buffer, start)
            end = pos + length
            _attributes, pos = decode_varint(batch._buffer, pos)
            _timestamp_delta, pos = decode_varint(batch._buffer, pos)
            offset_delta, pos = decode_varint(batch._buffer, pos)
        except (ValueError, IndexError):
            return end_batch(batch, start)
        if length <= 0 or end > len(batch._buffer) or pos > end or not 0 <= offset_delta <= batch.last_offset_delta:
            return end_batch(batch, start)
        batch._pos = end
        batch._next_record_index += 1
        cause = error.__context__ if error.__context__ is not None else error  # kafka-python wraps it
        reason = "bad_header" if isinstance(cause, UnicodeDecodeError) else "corrupt_record"
        return placeholder(batch, reason, batch.base_offset + offset_delta, end - start)

    def validate_or_mark(self: Any) -> bool:
        valid = bool(validate(self))
        if valid or self.is_control_batch:
            return valid
        self._header_data = _CorruptBatch(self._header_data)  # its records: one placeholder
        return True

    def iterate_or_mark(self: Any) -> Any:
        if isinstance(self._header_data, _CorruptBatch):
            self._decompressed = True  # never decompress what failed its checksum
            return self
        try:
            return iterate(self)
        except UnsupportedCodecError:
            raise
        except Exception:  # a payload its codec cannot decompress
            if self.is_control_batch:
                raise
            self._header_data = _CorruptBatch(self._header_data)
            self._decompressed = True
            return self

    def read_or_placeholder(self: Any) -> Any:
        start = self._pos
        if isinstance(self._header_data, _CorruptBatch):
            return end_batch(self, start)
        try:
            return read(self)
        except StopIteration:
            raise
        except Exception as error:  # any record kafka-python cannot read
            if self.is_control_batch:
                raise
            if self._next_record_index >= self._num_records:
                if self._next_record_index > 0:
                    raise  # bytes after the last record, all read: the partition reads on after them
                return end_batch(self, start)  # a batch of bytes and no records
            return skip_record(self, start, error)

    read_or_placeholder._embmon = True  # type: ignore[attr-defined]
    for wrapper, wrapped in ((validate_or_mark, validate), (iterate_or_mark, iterate), (read_or_placeholder, read)):
        wrapper.__wrapped__ = wrapped  # type: ignore[union-attr]
    DefaultRecordBatch.validate_crc = validate_or_mark
    DefaultRecordBatch.__iter__ = iterate_or_mark
    DefaultRecordBatch.__next__ = DefaultRecordBatch.next = read_or_placeholder
