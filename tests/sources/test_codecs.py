"""Every Kafka compression codec is read: gzip, snappy, lz4 and zstd, each written by two foreign
producers (kafka-python's and librdkafka's), counted exactly by one daemon over a real scrape.

And a codec that cannot be decoded (its library missing: kafka-python's codec check made to say so,
the one thing a test cannot otherwise arrange) stalls only its partition: counted by reason, one
ERROR naming the package, ``embmon_source_up`` 0, no core spinning, and read once it can be.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kafka.codec
import kafka.record.default_records
import kafka.record.legacy_records
import numpy as np
import pytest

from monitor.config import load_settings
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

CODECS = ("gzip", "snappy", "lz4", "zstd")
PRODUCERS = ("kafka-python", "librdkafka")
DIM, ROWS, MESSAGES = 8, 25, 20  # per codec and producer: 20 messages of 25 rows
RECORDS = ROWS * MESSAGES


def rows(model: str) -> np.ndarray:
    """Rows of small whole numbers: compressible, so no producer has a reason to send them uncompressed."""
    rng = np.random.default_rng(zlib.crc32(model.encode()))
    return rng.integers(-3, 4, size=(MESSAGES, ROWS, DIM)).astype(np.float32)


def headers(model: str) -> list[tuple[str, bytes]]:
    return [("model", model.encode()), ("dim", str(DIM).encode())]


def produce_kafka_python(broker: Broker, topic: str, codec: str, model: str, partition: int | None = None) -> None:
    producer = broker.producer(compression_type=codec)
    try:
        for batch in rows(model):
            producer.send(topic, batch.tobytes(), headers=headers(model), partition=partition)
        producer.flush()
    finally:
        producer.close()


def produce_librdkafka(broker: Broker, topic: str, codec: str, model: str) -> None:
    from confluent_kafka import Producer

    failed: list[object] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 5})
    for batch in rows(model):
        producer.produce(topic, batch.tobytes(), headers=headers(model),
                         on_delivery=lambda error, _message: failed.append(error) if error else None)
    assert producer.flush(15) == 0 and failed == [], failed


PRODUCE: dict[str, Callable[[Broker, str, str, str], None]] = {
    "kafka-python": produce_kafka_python,
    "librdkafka": produce_librdkafka,
}


def model_of(codec: str, producer: str) -> str:
    return f"{codec}-{producer}"


class DecompressedBatches:
    """Counts the record batches kafka-python decompresses, by codec: proof that a producer really
    compressed with the codec asked for (librdkafka, say, may send a batch that does not shrink as is)."""

    NAMES = {f"{codec}_decode": codec for codec in CODECS}

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.counts: Counter[str] = Counter()
        for module in (kafka.record.default_records, kafka.record.legacy_records):
            for name, codec in self.NAMES.items():
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, self._counting(codec, getattr(module, name)))

    def _counting(self, codec: str, decode: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[codec] += 1
            return decode(*args, **kwargs)

        return counted


def records_of(samples: dict, model: str) -> float | None:  # type: ignore[type-arg]
    return value(samples, "embmon_records_total", model=model, stream="default")


@pytest.fixture(scope="module")
def codec_run(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One daemon on one topic; each producer writes every codec under its own model label, one
    producer after the other, so the batches decompressed while each is read are its own."""
    topic = "codecs"
    broker.create_topics(topic)
    settings = load_settings(
        overrides=kafka_daemon_overrides(broker, topic, "codecs-group", tmp_path_factory.mktemp("state"))
    )
    result: dict[str, Any] = {"decompressed": {}}
    with pytest.MonkeyPatch.context() as monkeypatch, daemons.monitor(settings) as monitor:
        batches = DecompressedBatches(monkeypatch)
        started = time.monotonic()
        for producer in PRODUCERS:
            before = Counter(batches.counts)
            for codec in CODECS:
                PRODUCE[producer](broker, topic, codec, model_of(codec, producer))
            models = [model_of(codec, producer) for codec in CODECS]
            wait_until(lambda models=models: all(records_of(scrape(monitor.http.port), m) == RECORDS for m in models),
                       timeout=60, message=f"every codec of {producer} counted")
            result["decompressed"][producer] = batches.counts - before
        result["seconds"] = time.monotonic() - started
        result["samples"] = scrape(monitor.http.port)
    yield result


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_is_read_exactly_from_both_producers(codec_run: dict[str, Any], codec: str) -> None:
    samples = codec_run["samples"]
    for producer in PRODUCERS:
        assert records_of(samples, model_of(codec, producer)) == RECORDS, producer
        # the producer compressed with this codec, and the daemon decompressed it
        assert codec_run["decompressed"][producer][codec] > 0, (producer, codec_run["decompressed"])
    assert value(samples, "embmon_source_up") == 1
    assert value(samples, "embmon_source_errors_total", reason="unsupported_codec") == 0
    assert value(samples, "embmon_source_errors_total", reason="poll") == 0
    assert not [labels for (name, labels), v in samples.items() if name == "embmon_records_invalid_total" and v]


@pytest.mark.slow
def test_a_codec_without_its_library_stalls_only_its_partition_until_it_can_be_read(
    broker: Broker, state_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0 holds lz4 batches, partition 1 gzip ones; kafka-python is made to find no lz4 library."""
    topic = "lz4-stalled"
    broker.create_topics(topic, partitions=2)
    produce_kafka_python(broker, topic, "lz4", "stalled", partition=0)
    produce_kafka_python(broker, topic, "gzip", "readable", partition=1)
    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, "stalled-group", state_dir))
    with pytest.MonkeyPatch.context() as no_lz4, caplog.at_level(logging.INFO):
        no_lz4.setattr(kafka.codec, "has_lz4", lambda: False)
        with daemons.monitor(settings) as monitor:
            port = monitor.http.port

            def unsupported() -> float:
                return value(scrape(port), "embmon_source_errors_total", reason="unsupported_codec") or 0.0

            # the gzip partition is read; the lz4 one is tried again with backoff (0.5 s, 1 s, 2 s, ...)
            wait_until(lambda: records_of(scrape(port), "readable") == RECORDS and unsupported() >= 3, timeout=60,
                       message="the gzip partition read and the lz4 one retried twice")
            cpu, wall = time.process_time(), time.monotonic()
            time.sleep(2.0)  # a measured interval, not a wait for something
            busy = (time.process_time() - cpu) / (time.monotonic() - wall)
            stalled = scrape(port)
            tries = value(stalled, "embmon_source_errors_total", reason="unsupported_codec")
            no_lz4.undo()  # the library is back: the next retry reads the partition
            wait_until(lambda: records_of(scrape(port), "stalled") == RECORDS, timeout=60, message="lz4 partition read")
            recovered = scrape(port)

    assert records_of(stalled, "stalled") is None and records_of(stalled, "readable") == RECORDS
    assert value(stalled, "embmon_source_up") == 0
    assert tries is not None and 3 <= tries <= 6, tries  # retried with backoff, not once per poll
    assert busy < 0.5, f"the daemon used {busy:.2f} of a core while the partition was stalled"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("monitor")]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "cannot read lz4-stalled partition 0 from offset 0" in message and "pip install lz4" in message, message
    assert value(stalled, "embmon_source_errors_total", reason="poll") == 0
    assert not any("Kafka poll failed" in r.getMessage() for r in caplog.records)
    assert records_of(recovered, "stalled") == RECORDS and records_of(recovered, "readable") == RECORDS
    assert value(recovered, "embmon_source_up") == 1
    assert any("its records decode again" in r.getMessage() for r in caplog.records)
