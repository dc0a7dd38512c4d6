"""Producer threads that write to the test broker while a daemon consumes.

:class:`SteadyProducer` writes at a steady rate until stopped, and can switch what it writes
mid-stream (``shift()``, noting when); subclasses say what one batch's messages are.
:class:`KnownSequence` writes a fixed sequence (binary batches, JSON events, some invalid records)
over ~40 s, so a test can compare what was counted with what was written. Both are context
managers: entering starts the thread, leaving stops it and joins it, whatever the test did.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import numpy as np
import orjson

from tests.support.broker import Broker

Message = tuple[bytes, list[tuple[str, bytes]]]  # (value, headers)


def produce_rows(broker: Broker, topic: str, count: int, seed: int, dim: int = 4) -> np.ndarray:
    """``count`` standard normal float32 rows of model ``m``, one binary record each, flushed; returns them."""
    rows = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    headers = [("model", b"m"), ("dim", str(dim).encode())]
    producer = broker.producer()
    try:
        for row in rows:
            producer.send(topic, row.tobytes(), headers=headers)
        producer.flush()
    finally:
        producer.close()
    return rows


class RawHeaderKey(str):
    """A header key written as these exact bytes, UTF-8 or not.

    Kafka header keys are bytes and any producer can write one that is not UTF-8; kafka-python's
    producer takes ``str`` keys and writes ``key.encode("utf-8")``, which this returns as given."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderKey:
        key = super().__new__(cls, raw.decode("latin-1"))
        key.raw = raw
        return key

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


class _ProducerThread(threading.Thread):
    stopped: threading.Event

    def __enter__(self) -> _ProducerThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stopped.set()
        self.join(timeout=10)


class SteadyProducer(_ProducerThread):
    """``rate`` records a second in batches of ``batch``; ``shift()`` switches the distribution and notes when."""

    def __init__(self, broker: Broker, topic: str, rate: float = 400.0, batch: int = 20):
        super().__init__(daemon=True)
        self.broker, self.topic, self.rate, self.batch = broker, topic, rate, batch
        self.stopped = threading.Event()
        self._shifted = threading.Event()
        self.shifted_at: float | None = None

    def shift(self) -> None:
        self._shifted.set()

    def messages(self, rng: np.random.Generator, shifted: bool) -> list[Message]:
        """One batch's messages, before or after ``shift()``."""
        raise NotImplementedError

    def run(self) -> None:
        producer = self.broker.producer()
        rng = np.random.default_rng(3)
        next_send = time.monotonic()
        try:
            while not self.stopped.is_set():
                shifted = self._shifted.is_set()
                if shifted and self.shifted_at is None:
                    self.shifted_at = time.time()
                for message, headers in self.messages(rng, shifted):
                    producer.send(self.topic, message, headers=headers)
                producer.flush()
                next_send += self.batch / self.rate
                time.sleep(max(0.0, next_send - time.monotonic()))  # pacing: ``rate`` records a second
        finally:
            producer.close()


class KnownSequence(_ProducerThread):
    """Writes :data:`MESSAGES` binary batches of 20 rows (model ``bin``, :data:`DIM_BIN`), as many JSON
    events (model ``json``, :data:`DIM_JSON`) and an invalid record every tenth step, over ~40 s,
    alternating two partitions."""

    MESSAGES = 150
    DIM_BIN, DIM_JSON = 16, 8

    def __init__(self, broker: Broker, topic: str, gate: threading.Event | None = None):
        super().__init__(name="test-producer", daemon=True)
        self.broker, self.topic = broker, topic
        self.stopped = threading.Event()
        self.gate = gate  # when given, a message is written only while it is set (a test paces the stream by it)
        rng = np.random.default_rng(11)
        self.bin_rows = rng.standard_normal((self.MESSAGES, 20, self.DIM_BIN)).astype(np.float32) + 0.3
        self.json_rows = rng.standard_normal((self.MESSAGES, self.DIM_JSON)).astype(np.float32)
        self.invalid = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = self.broker.producer()
            headers = [("model", b"bin"), ("dim", str(self.DIM_BIN).encode())]
            for i in range(self.MESSAGES):
                while self.gate is not None and not self.gate.wait(0.1) and not self.stopped.is_set():
                    pass
                if self.stopped.is_set():
                    break
                partition = i % 2
                producer.send(self.topic, self.bin_rows[i].tobytes(), headers=headers, partition=partition)
                event = {"id": f"e{i}", "model": "json", "vector": self.json_rows[i].tolist()}
                producer.send(self.topic, orjson.dumps(event), partition=1 - partition)
                if i % 10 == 0:
                    producer.send(self.topic, b"\x01\x02\x03", headers=headers, partition=partition)  # bad_binary
                    self.invalid += 1
                if i % 5 == 0:
                    producer.flush()
                time.sleep(0.25)  # pacing: the sequence spans ~40 s, so that daemons are killed mid-stream
            producer.flush()
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
