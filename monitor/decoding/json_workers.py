"""JSON decoding in worker processes, so that parsing no longer shares the GIL with kafka-python.

One poll's JSON values go to a worker as one frame; the worker runs the stateless half of
decoding (:class:`~monitor.decoding.json_decoding.JsonCollector`) and answers with the pickled
:class:`~monitor.decoding.json_decoding.JsonCollection`. The poll thread sends a poll, polls Kafka for
the next one while the worker parses, then collects the answer: parsing runs on another core
while kafka-python keeps this interpreter.

A worker that dies, hangs or answers garbage never loses records: the poll it had is decoded
in-process instead, the failure is counted (``embmon_internal_errors_total{stage="json_worker"}``)
and a fresh worker starts for the next poll. Bad input does not get that far: the worker runs the
same :meth:`~monitor.decoding.json_decoding.JsonCollector.collect` as the fallback, which contains any
exception to its record (``decode_error``), so the answer is the same wherever a poll is decoded.

Frames (little-endian): request ``u32 count, u32 length × count, bytes``; answer ``u64 length,
pickle``. A worker imports numpy, orjson and simdjson only (≈ 70 MB resident after a poll of
2,000 events; not the daemon's torch).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monitor.decoding.json_decoding import JsonCollection, JsonCollector

logger = logging.getLogger(__name__)

__all__ = ["JsonWorkerPool", "WorkerFailed"]

ANSWER_TIMEOUT_SECONDS = 60.0
"""A worker that has not answered one poll in this long is taken for hung and replaced."""


class WorkerFailed(RuntimeError):
    """The worker process died, hung or answered something unreadable."""


class _Worker:
    """One worker process and the pipes to it."""

    def __init__(self, collector_args: dict[str, Any]):
        package_root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["OPENBLAS_NUM_THREADS"] = "1"  # the worker needs no BLAS pool
        self.process = subprocess.Popen(  # noqa: S603 - this interpreter running our own worker module
            [sys.executable, "-m", "monitor.decoding.json_workers", json.dumps(collector_args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._out = self.process.stdin.fileno()
        self._in = self.process.stdout.fileno()
        os.set_blocking(self._out, False)

    def send(self, values: Sequence[bytes], deadline: float) -> None:
        lengths = np.fromiter((len(v) for v in values), dtype="<u4", count=len(values))
        frame = memoryview(b"".join((struct.pack("<I", len(values)), lengths.tobytes(), *values)))
        while frame:
            if not select.select([], [self._out], [], _remaining(deadline))[1]:
                raise WorkerFailed("worker did not read its request in time")
            try:
                frame = frame[os.write(self._out, frame) :]
            except (BrokenPipeError, OSError) as exc:
                raise WorkerFailed(f"worker pipe closed ({exc})") from exc

    def receive(self, deadline: float) -> JsonCollection:
        (size,) = struct.unpack("<Q", self._read(8, deadline))
        try:
            answer = pickle.loads(self._read(size, deadline))  # noqa: S301 - our own worker, its private pipe
        except Exception as exc:  # any unreadable answer is a worker fault
            raise WorkerFailed(f"unreadable answer ({exc})") from exc
        if not isinstance(answer, JsonCollection):
            raise WorkerFailed(f"unexpected answer of type {type(answer).__name__}")
        return answer

    def _read(self, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        while size:
            if not select.select([self._in], [], [], _remaining(deadline))[0]:
                raise WorkerFailed("worker did not answer in time")
            chunk = os.read(self._in, min(size, 1 << 20))
            if not chunk:
                raise WorkerFailed(f"worker exited (status {self.process.poll()})")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=2.0)


class JsonWorkerPool:
    """``workers`` worker processes taking polls in turn; each has at most one poll in flight.

    :meth:`submit` is what ``Decoder.start_embeddings`` takes as ``collect_json``: it sends the
    values and returns a call that waits for the collection. Calls must be made in submission
    order (the poll thread finishes polls in order).
    """

    def __init__(
        self,
        collector: JsonCollector,
        workers: int,
        on_failure: Callable[[], None] = lambda: None,
        timeout: float = ANSWER_TIMEOUT_SECONDS,
    ):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.collector = collector
        self.timeout = timeout
        self.failures = 0
        self._on_failure = on_failure
        self._args = {
            "max_rows_per_message": collector.max_rows_per_message,
            "max_dimension": collector.max_dimension,
            "default_stream": collector.default_stream,
            "label_pattern": collector._label.pattern,
        }
        self._workers: list[_Worker | None] = [None] * workers
        self._turn = 0

    @property
    def size(self) -> int:
        return len(self._workers)

    def submit(self, values: list[bytes]) -> Callable[[], JsonCollection]:
        slot = self._turn
        self._turn = (self._turn + 1) % len(self._workers)
        deadline = time.monotonic() + self.timeout
        try:
            worker = self._worker(slot)
            worker.send(values, deadline)
        except Exception as exc:  # noqa: BLE001 - any failure of the worker path: decode here
            collection = self._fall_back(slot, values, exc)
            return lambda: collection

        def wait() -> JsonCollection:
            try:
                return worker.receive(time.monotonic() + self.timeout)
            except Exception as exc:  # noqa: BLE001 - any failure of the worker path: decode here
                return self._fall_back(slot, values, exc)

        return wait

    def _worker(self, slot: int) -> _Worker:
        worker = self._workers[slot]
        if worker is None:
            worker = self._workers[slot] = _Worker(self._args)
        return worker

    def _fall_back(self, slot: int, values: list[bytes], exc: BaseException) -> JsonCollection:
        """Decode this poll here, replace the worker, and count the failure."""
        self.failures += 1
        self._on_failure()
        logger.error("JSON worker failed (%s); decoding its poll in-process and starting a new worker", exc)
        worker = self._workers[slot]
        self._workers[slot] = None
        if worker is not None:
            with contextlib.suppress(Exception):  # already gone, or cannot be reaped: the poll matters
                worker.process.kill()
                worker.close()
        return self.collector.collect(values)

    def pids(self) -> list[int]:
        """Process ids of the running workers (tests kill them)."""
        return [w.process.pid for w in self._workers if w is not None]

    def close(self) -> None:
        for slot, worker in enumerate(self._workers):
            if worker is not None:
                worker.close()
            self._workers[slot] = None


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


# -- the worker process -------------------------------------------------------------------------


def _read_exactly(stream: Any, size: int) -> bytes | None:
    data = stream.read(size)
    return data if data is not None and len(data) == size else None


def serve(args: dict[str, Any]) -> None:
    """Answer frames on stdin until it closes."""
    collector = JsonCollector(**args)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = _read_exactly(stdin, 4)
        if header is None:
            return
        (count,) = struct.unpack("<I", header)
        raw_lengths = _read_exactly(stdin, 4 * count)
        if raw_lengths is None:
            return
        lengths = np.frombuffer(raw_lengths, dtype="<u4")
        payload = _read_exactly(stdin, int(lengths.sum(dtype=np.int64)))
        if payload is None:
            return
        ends = np.cumsum(lengths, dtype=np.int64)
        values = [payload[int(end - length) : int(end)] for end, length in zip(ends, lengths, strict=True)]
        answer = pickle.dumps(collector.collect(values), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            stdout.write(struct.pack("<Q", len(answer)))
            stdout.write(answer)
            stdout.flush()
        except BrokenPipeError:  # the daemon is gone (killed, or it gave up on this worker): nobody to answer
            # stdout still holds unwritten bytes: point it at /dev/null so the exit's flush raises nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
