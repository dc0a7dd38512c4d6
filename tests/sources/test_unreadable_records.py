"""Records a Kafka client cannot read, through the real tansu broker, with both clients.

Kafka header keys are bytes and any producer can write one that is not UTF-8. kafka-python raised
from every poll at such a record and the partition never moved past it (nor on any replica that
took it over); librdkafka's consumer dropped the whole poll around it, whose positions it had
already moved past (101 records lost, nothing counted). Now the record alone is counted under
``bad_header`` and skipped: every record around it is counted exactly, in the same producer batch
and in the other partition, and the offsets move past it.

The second part fuzzes what a producer controls besides the value: header keys (any text, bytes
that are not UTF-8), header values (any bytes), repeated headers, record keys (any bytes,
null), around the values of the field fuzz (``tests/decoding/test_fuzz_fields.py``) and binary
batches, produced to the broker and consumed by a running daemon on each client: each record
counts exactly what decoding it alone gives (``bad_header`` for an unreadable one), nothing
stalls, and the daemon answers throughout.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from monitor.config import load_settings
from monitor.decoding.decoder import Decoder
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.json_fuzz import DIMS, LIMITS, messages, weighted
from tests.support.producers import RawHeaderKey
from tests.support.scrape import Samples, http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
DIM = 4
CLIENTS = [
    pytest.param("kafka-python"),
    pytest.param("confluent", marks=pytest.mark.slow),  # the fast tier runs one client (kafka-python)
]


def by_reason(samples: Samples) -> Counter[str]:
    out: Counter[str] = Counter()
    for (name, labels), n in samples.items():
        if name == "embmon_records_invalid_total":
            out[dict(labels)["reason"]] += int(n)
    return out


def records_total(samples: Samples) -> int:
    return int(sum(n for (name, _labels), n in samples.items() if name == "embmon_records_total"))


def event(i: int, rng: np.random.Generator) -> bytes:
    return orjson.dumps({"id": f"e{i}", "model": "json-model", "vector": rng.standard_normal(DIM).tolist()})


@pytest.mark.slow  # 4.5 s idle, 7 s in the tier: the group join waits out max_poll_interval_ms
@pytest.mark.parametrize("client", CLIENTS)
def test_a_record_with_a_header_key_that_is_not_utf8_is_counted_once_and_its_neighbours_exactly(
    client: str, broker: Broker, tmp_path: Path
) -> None:
    topic, group = f"unreadable-{client}", f"unreadable-{client}-group"
    broker.create_topics(topic, partitions=2)
    rng = np.random.default_rng(27)
    producer = broker.producer()
    # partition 0: 30 JSON events in one producer batch, unreadable ones first, in the middle and last;
    # each is a valid event, so counting it as a record would show
    poison_json = {0, 15, 29}
    for i in range(30):
        headers = [(RawHeaderKey(b"\xff\xfe"), b"v")] if i in poison_json else []
        producer.send(topic, event(i, rng), headers=headers, partition=0)
    # partition 1: 10 binary batches of 10 rows; the unreadable one has valid model and dim headers too
    rows = rng.standard_normal((10, 10, DIM)).astype("<f4")
    for i, batch in enumerate(rows):
        headers = [("model", b"bin-model"), ("dim", b"%d" % DIM)]
        if i == 5:
            headers.append((RawHeaderKey(b"\xc3\x28"), b"x"))
        producer.send(topic, batch.tobytes(), headers=headers, partition=1)
    producer.flush()
    producer.close()

    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, group, tmp_path / "state", client=client))
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port
        expected = (30 - len(poison_json)) + 9 * 10
        wait_until(lambda: records_total(scrape(port)) >= expected, timeout=60, message="the valid records counted")
        for partition, end in ((0, 30), (1, 10)):
            wait_until(lambda p=partition, e=end: broker.committed(group, topic, p) == e, timeout=20,
                       message=f"partition {partition} committed past every record")  # fmt: skip
        samples = scrape(port)
        assert records_total(samples) == expected
        assert value(samples, "embmon_records_total", model="json-model", stream="default") == 27
        assert value(samples, "embmon_records_total", model="bin-model", stream="default") == 90
        assert by_reason(samples) == {"bad_header": 4}  # each unreadable record counted once, nothing else
        assert value(samples, "embmon_source_errors_total", reason="poll") == 0
        assert http_status(port, "/healthz") == 200 and monitor.pipeline.alive
        assert monitor.status.internal_error_counts() == {}
        stats = monitor.registry.get("bin-model", "default").window.snapshot(time.time()).stats
        kept = np.delete(rows, 5, axis=0).reshape(-1, DIM).astype(np.float64)
        np.testing.assert_allclose(stats.vector_sum, kept.sum(axis=0), rtol=1e-9)  # the right rows, not just as many


@pytest.mark.parametrize("client", CLIENTS)
def test_a_batch_that_fails_its_checksum_never_stalls_its_partition(
    client: str, broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tansu stores a batch whose checksum is wrong as a producer sends it. kafka-python refused it
    on every poll, for good; now its records count as one ``corrupt_record`` (none of them can be
    trusted) and the partition reads on. librdkafka does not check checksums (``check.crcs`` is
    off by default): it reads the records as they are."""
    import kafka.record.default_records as records_module

    topic, group = f"bad-crc-{client}", f"bad-crc-{client}-group"
    broker.create_topics(topic)
    rng = np.random.default_rng(5)
    producer = broker.producer()
    for i in range(10):
        producer.send(topic, event(i, rng))
    producer.flush()
    with monkeypatch.context() as patch:  # the next batch's checksum written wrong
        patch.setattr(records_module, "calc_crc32c", lambda data: 12345)
        for i in range(10, 15):
            producer.send(topic, event(i, rng))
        producer.flush()
    for i in range(15, 25):
        producer.send(topic, event(i, rng))
    producer.flush()
    producer.close()
    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, group, tmp_path / "state", client=client))
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port
        wait_until(lambda: broker.committed(group, topic) == 25, timeout=60, message="committed past every record")
        samples = scrape(port)
        if client == "kafka-python":
            assert records_total(samples) == 20 and by_reason(samples) == {"corrupt_record": 1}
        else:
            assert records_total(samples) == 25 and by_reason(samples) == {}
        assert value(samples, "embmon_source_errors_total", reason="poll") == 0
        assert http_status(port, "/healthz") == 200 and monitor.pipeline.alive


# -- the fuzz -------------------------------------------------------------------------------------

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]  # key, value, headers
NOT_UTF8 = st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Not model, dim or stream: those decide a record's model and dimension, which the daemon's history
# (a model's first dimension, the label budget) would then judge, and decoding a record alone cannot.
DECIDING = {"model", "dim", "stream"}
header_keys = weighted(
    (4, st.sampled_from(["content-type", "", "trace-id", "Model", "dim "])),
    (4, st.text(max_size=12).filter(lambda t: _is_utf8(t.encode("utf-8", "surrogatepass")) and t not in DECIDING)),
    (1, NOT_UTF8.map(RawHeaderKey)),
)
# kafka-python's producer writes no null header value (librdkafka's reading of one is its own test)
header_values = st.one_of(st.binary(max_size=12), st.sampled_from([b"m1", b"m2", b"3", b"4", b"\xff", b"1e9"]))
extra_headers = st.lists(st.tuples(header_keys, header_values), max_size=4)


@st.composite
def records(draw: st.DrawFn) -> Record:
    """(key, value, headers) of one record: a field-fuzz JSON value or a binary batch, fuzzed headers."""
    key = draw(st.one_of(st.none(), st.binary(max_size=16)))
    if draw(st.integers(0, 3)) == 0:  # a binary batch, its headers mostly right
        model = draw(st.sampled_from(["m1", "m2"]))
        rows = draw(st.integers(0, 3))
        value = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal((rows, DIMS[model]))
        raw = value.astype("<f4").tobytes() + draw(st.sampled_from([b"", b"", b"\x00"]))
        dim = draw(st.sampled_from([str(DIMS[model]).encode()] * 4 + [b"3", b"4", b"x", b"0", b"99999"]))
        headers = [("model", model.encode()), ("dim", dim)]
        headers = draw(st.permutations(headers + draw(extra_headers)))
        return key, raw, headers
    raw_value = draw(st.one_of(messages("embeddings"), st.just(None)))
    if raw_value is None and key is None:
        key = b"k"  # a tombstone needs a key
    return key, raw_value, draw(extra_headers)


def expected_counts(record: Record) -> Counter[str]:
    """What decoding this record alone counts: rows applied, and each rejection reason."""
    _key, raw_value, headers = record
    if any(isinstance(k, RawHeaderKey) for k, _ in headers):
        return Counter({"bad_header": 1})
    result = Decoder(LIMITS, declared_dims=DIMS).decode_embeddings([(raw_value, headers)])  # type: ignore[list-item]
    out: Counter[str] = Counter({"applied": sum(b.size for b in result.batches)})
    for (_stream, reason), n in result.rejected.items():
        out[reason] += n
    return +out


def daemon_counts(port: int) -> Counter[str]:
    samples = scrape(port)
    return +(by_reason(samples) + Counter({"applied": records_total(samples)}))


def run_fuzz(client: str, broker: Broker, tmp_path: Path, examples: int) -> Counter[str]:
    topic, group = f"fuzz-records-{client}-{examples}", f"fuzz-records-{client}-{examples}-group"
    broker.create_topics(topic)
    overrides = kafka_daemon_overrides(
        broker, topic, group, tmp_path / "state", client=client,
        limits=LIMITS.model_dump(), models={m: {"dim": d} for m, d in DIMS.items()},
        checkpoint={"enabled": False}, drift={"enabled": False},
    )  # fmt: skip
    producer = broker.producer()
    expected: Counter[str] = Counter()
    written = 0
    with daemons.monitor(load_settings(overrides=overrides)) as monitor:
        port = monitor.http.port

        @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(st.lists(records(), min_size=1, max_size=12))
        def produce_and_count(batch: list[Record]) -> None:
            nonlocal written
            for key, raw_value, headers in batch:
                producer.send(topic, raw_value, key=key, headers=headers)
                expected.update(expected_counts((key, raw_value, headers)))
            producer.flush()
            written += len(batch)
            wait_until(lambda: daemon_counts(port) == +expected, timeout=30,
                       message=f"counted as decoding each record alone gives: {dict(+expected)}")  # fmt: skip
            assert http_status(port, "/healthz") == 200

        try:
            produce_and_count()
        finally:
            producer.close()
        wait_until(lambda: broker.committed(group, topic) == written, timeout=20, message="committed past every record")
        samples = scrape(port)
        assert value(samples, "embmon_source_errors_total", reason="poll") == 0
        assert monitor.status.internal_error_counts() == {}
        assert monitor.pipeline.alive
    return expected


# kafka-python's I/O thread draws from the global `random` (node choice) while hypothesis generates the
# next batch in this thread; hypothesis sees the global state move and warns, about the client, not the strategy
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@pytest.mark.slow  # over 5 s on the idle 2-core machine (.cache/test-durations.json)
@pytest.mark.parametrize("client", CLIENTS)
def test_fuzzed_headers_and_keys_through_the_broker_count_each_record_as_alone(
    client: str, broker: Broker, tmp_path: Path
) -> None:
    seen = run_fuzz(client, broker, tmp_path, examples=15)
    assert seen["bad_header"] > 0 and seen["applied"] > 0  # the strategies reach both outcomes


@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")  # as above
@pytest.mark.slow
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_fuzzed_headers_and_keys_through_the_broker_many(client: str, broker: Broker, tmp_path: Path) -> None:
    seen = run_fuzz(client, broker, tmp_path, examples=150)
    assert seen["bad_header"] > 10 and seen["applied"] > 20


# -- the scale-out readers of the partials topic share kafka-python's record reading ------------------


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_partials_reader_moves_past_a_record_it_cannot_read(broker: Broker, tmp_path: Path, client: str) -> None:
    """A reducer's or replica's consumer (``scaleout.intake.consumer_config``, on the library
    ``kafka.client`` names) gets the unreadable record as one with no key, value or headers, which
    the partials parser refuses (counted ``corrupt`` by the merge table), and reads the records
    after it: before, every poll failed at it and the reducer's partition halted for good."""
    from monitor.scaleout.intake import consumer_config
    from monitor.scaleout.partials import PartialError, parse_record
    from monitor.sources.kafka.clients import TopicPartition, new_consumer
    from monitor.sources.kafka.internals import unreadable_reason

    topic = f"partials-unreadable-{client}"
    broker.create_topics(topic)
    producer = broker.producer()
    for i in range(10):
        headers = [(RawHeaderKey(b"\xfe"), b"x")] if i == 4 else [("kind", b"manifest")]
        producer.send(topic, b"v%d" % i, key=b"k%d" % i, headers=headers)
    producer.flush()
    producer.close()
    settings = load_settings(overrides=kafka_daemon_overrides(broker, "embeddings", "g", tmp_path / "state",
                                                              client=client))
    consumer = new_consumer(consumer_config(settings), settings.kafka)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += records
    finally:
        consumer.close()
    assert [r.offset for r in got] == list(range(10))
    assert [unreadable_reason(r.headers) for r in got] == [None] * 4 + ["bad_header"] + [None] * 5
    assert [r.value for r in got] == [b"v%d" % i for i in range(4)] + [None] + [b"v%d" % i for i in range(5, 10)]
    poison = got[4]
    with pytest.raises(PartialError):
        parse_record(poison.key, poison.value, poison.headers or ())


GENERATE_ONLY = (Phase.explicit, Phase.generate)  # a shrink step waits on the broker: report the first failure


@pytest.mark.slow  # over 5 s on the idle 2-core machine (.cache/test-durations.json)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_fuzzed_partials_records_reach_the_partials_reader_each_as_written_or_unreadable(
    client: str, broker: Broker, tmp_path: Path
) -> None:
    """Fuzzed keys, values and headers through the broker to a partials reader on either library
    (``scaleout.intake.poll_past_unreadable`` over the consumer ``kafka.client`` builds): every
    record arrives once, in offset order, as written or (a header key that is not UTF-8) as an
    unreadable placeholder, and the partials parser refuses what it cannot take with a PartialError."""
    from monitor.scaleout.intake import consumer_config, poll_past_unreadable
    from monitor.scaleout.partials import Bounds, PartialError, parse_record
    from monitor.sources.kafka.clients import TopicPartition, new_consumer
    from monitor.sources.kafka.internals import unreadable_reason

    topic = f"partials-fuzz-{client}"
    broker.create_topics(topic)
    config = load_settings(overrides=kafka_daemon_overrides(broker, "embeddings", "g", tmp_path / "state",
                                                            client=client, scale_out={"partials_topic": topic}))
    bounds = Bounds.of(config)
    producer = broker.producer()
    consumer = new_consumer(consumer_config(config), config.kafka)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    written: list[Record] = []
    outcomes: Counter[str] = Counter()

    @settings(max_examples=15, deadline=None, derandomize=True, database=None, phases=GENERATE_ONLY,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.lists(records(), min_size=1, max_size=8))
    def produce_and_read(batch: list[Record]) -> None:
        for key, raw_value, headers in batch:
            producer.send(topic, raw_value, key=key, headers=headers, partition=0)
        producer.flush()
        first = len(written)
        written.extend(batch)
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < len(batch) and time.monotonic() < deadline:
            for records_of in poll_past_unreadable(consumer, 300).values():
                got += records_of
        assert [r.offset for r in got] == list(range(first, len(written)))
        for (key, raw_value, headers), record in zip(batch, got, strict=True):
            if any(isinstance(k, RawHeaderKey) for k, _ in headers):
                assert unreadable_reason(record.headers) == "bad_header" and record.value is None
                outcomes["unreadable"] += 1
                continue
            assert (record.key, record.value) == (key, raw_value)
            assert [(k, bytes(v)) for k, v in record.headers] == [(str(k), v) for k, v in headers]
            outcomes["read"] += 1
            try:
                parse_record(record.key, record.value, record.headers or (), bounds)
            except PartialError:
                outcomes["refused"] += 1

    try:
        produce_and_read()
    finally:
        producer.close()
        consumer.close()
    assert outcomes["unreadable"] > 0 and outcomes["read"] > 0 and outcomes["refused"] > 0
