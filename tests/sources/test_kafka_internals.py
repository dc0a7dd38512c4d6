"""The kafka-python internals the Kafka source relies on still exist in the installed version.

monitor/sources/kafka/internals.py says why each is needed; an upgrade that moves one must fail
here, not during a rebalance in production.
"""

from __future__ import annotations

import inspect
import struct

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


# -- records kafka-python cannot parse -------------------------------------------------------


def _batch(headers_of: list[list[tuple[str, bytes]]], compression: int = 0) -> bytearray:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)  # fmt: skip
    for offset, headers in enumerate(headers_of):
        builder.append(offset, timestamp=1_763_700_000_000, key=None, value=b"v%d" % offset, headers=headers)
    return builder.build()


def _read(buffer: bytearray) -> list[tuple[int, bytes | None, str | None]]:
    """The records of one batch as the fetcher reads them: its checksum checked, then each record."""
    from kafka.record.default_records import DefaultRecordBatch

    from monitor.sources.kafka.internals import read_unreadable_records, unreadable_reason

    read_unreadable_records()
    batch = DefaultRecordBatch(buffer)
    assert batch.validate_crc()  # a failed checksum marks the batch, read as one placeholder
    return [(r.offset, r.value, unreadable_reason(r.headers)) for r in batch]


def _with_checksum(buffer: bytearray) -> bytearray:
    """``buffer`` with its batch checksum made right again (what a producer sending it computes)."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.util import calc_crc32c

    crc = calc_crc32c(memoryview(buffer)[DefaultRecordBatch.ATTRIBUTES_OFFSET:])
    struct.pack_into(">I", buffer, DefaultRecordBatch.CRC_OFFSET, crc)
    return buffer


def test_a_record_whose_header_key_is_not_utf8_becomes_one_placeholder_and_the_batch_reads_on() -> None:
    from tests.support.producers import RawHeaderKey

    buffer = _batch([[("model", b"m")], [(RawHeaderKey(b"\xff"), b"x")], [], [("k", b"")]])
    assert _read(buffer) == [(0, b"v0", None), (1, None, "bad_header"), (2, b"v2", None), (3, b"v3", None)]


def test_a_broken_record_frame_ends_its_batch_in_one_corrupt_placeholder() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    buffer = _batch([[], [], []])
    first = DefaultRecordBatch(buffer)
    next(first)
    buffer[first._pos] = 1  # the second record's length: -1 (zigzag); where it ends, and what follows, is unknown
    assert _read(_with_checksum(buffer)) == [(0, b"v0", None), (2, None, "corrupt_record")]  # one, at the batch's end


def test_a_record_whose_inside_is_broken_but_frame_sound_is_one_corrupt_placeholder() -> None:
    buffer = _batch([[], [("k", b"abc")], []])
    at = bytes(buffer).index(b"k\x06abc")  # the header key "k" (then the value's length, 3), after its length
    assert buffer[at - 1] == 2  # zigzag varint of 1
    buffer[at - 1] = 1  # a negative key length: kafka-python raises CorruptRecordError inside the record
    assert _read(_with_checksum(buffer)) == [(0, b"v0", None), (1, None, "corrupt_record"), (2, b"v2", None)]


def test_a_batch_that_fails_its_checksum_is_one_corrupt_placeholder_at_its_last_offset() -> None:
    buffer = _batch([[], [], [], []])
    buffer[-1] ^= 0xFF  # a byte of the last record's value: the records cannot be trusted (tansu stores it)
    assert _read(buffer) == [(3, None, "corrupt_record")]


def test_a_payload_its_codec_cannot_decompress_is_one_corrupt_placeholder() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    buffer = _batch([[], [], []], compression=DefaultRecordBatch.CODEC_GZIP)
    start = DefaultRecordBatch.HEADER_STRUCT.size + 10  # the deflate stream, after the gzip header
    buffer[start : start + 12] = b"\xff" * 12  # not deflate; the batch checksum made right
    *records, last = _read(_with_checksum(buffer))
    assert last == (2, None, "corrupt_record")  # the rest of the batch, from where its payload broke
    assert all(value == b"v%d" % offset and why is None for offset, value, why in records), records


def test_a_batch_of_bytes_and_no_records_is_one_corrupt_placeholder() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    buffer = _batch([[], []])
    count_at = DefaultRecordBatch.HEADER_STRUCT.size - 4  # records count, the header's last field
    struct.pack_into(">i", buffer, count_at, 0)
    assert _read(_with_checksum(buffer)) == [(1, None, "corrupt_record")]


def test_the_record_reading_internals_exist() -> None:
    from kafka.record.default_records import DefaultRecordBatch

    source = inspect.getsource(inspect.unwrap(DefaultRecordBatch.__next__))
    assert "self._read_msg()" in source and "self._next_record_index += 1" in source
    for attribute in ("_buffer", "_header_data", "_pos", "_num_records", "_next_record_index", "_decompressed"):
        assert attribute in DefaultRecordBatch.__slots__, attribute
    assert 'decode("utf-8")' in inspect.getsource(DefaultRecordBatch._read_msg)
    assert "_maybe_uncompress" in inspect.getsource(inspect.unwrap(DefaultRecordBatch.__iter__))
    assert "calc_crc32c" in inspect.getsource(inspect.unwrap(DefaultRecordBatch.validate_crc))
    assert "self._header_data[" in inspect.getsource(DefaultRecordBatch)  # the header fields read from it
