"""JSON decoding in worker processes: the same result as in-process, and no record lost when a worker dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.decoding.decoder import Decoder
from monitor.decoding.json_workers import ANSWER_TIMEOUT_SECONDS, JsonWorkerPool
from monitor.decoding.records import SourcePosition
from monitor.decoding.settings import LimitSettings
from monitor.sources.base import Source, SourceMessage
from tests.support import daemons
from tests.support.waiting import wait_until


def _messages(n: int = 200, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    good = [
        orjson.dumps({"id": f"d{i}", "model": "m", "vector": rng.standard_normal(8).tolist(), "stream": "s",
                      "ts": 1.5 * i, "slice": "head" if i % 2 else None, "pair_id": f"p{i // 2}"})
        for i in range(n)
    ]  # fmt: skip
    odd = [
        b"{not json", b"[1, 2]", b'{"id": "x", "model": "m"}', b'{"id": true, "model": "m", "vector": [1.0]}',
        b'{"id": "a", "model": "m", "vector": [NaN, 1, 2, 3, 4, 5, 6, 7]}',
        b'{"id": "b", "model": "m", "vector": [0,0,0,0,0,0,0,0]}',
        b'{"id": "c", "model": "m", "vector": [[1],[2],[3],[4],[5],[6],[7],[8]]}',
        b'{"id": "d", "model": "m", "vector": [1, 2]}',
        b'{"id": "e", "model": "bad model", "vector": [1.0]}', b'{"id": "f", "model": "m", "vector": "1,2"}',
        b'{"id": "g", "model": "m", "vector": [1,2,3,4,5,6,7,8], "vector": [1,2,3,4,5,6,7,"x"]}',
    ]  # fmt: skip
    return good[: n // 2] + odd + good[n // 2 :]


def _same(a, b) -> None:  # type: ignore[no-untyped-def]
    assert a.rejected == b.rejected
    assert len(a.batches) == len(b.batches)
    for x, y in zip(a.batches, b.batches, strict=True):
        assert (x.model, x.stream, x.ids, x.slices, x.pair_ids) == (y.model, y.stream, y.ids, y.slices, y.pair_ids)
        np.testing.assert_array_equal(x.vectors, y.vectors)
        np.testing.assert_array_equal(x.norms, y.norms)
        np.testing.assert_array_equal(x.timestamps, y.timestamps)


@pytest.fixture
def pool_and_decoders():  # type: ignore[no-untyped-def]
    here, there = Decoder(LimitSettings()), Decoder(LimitSettings())
    failures: list[int] = []
    # the default answer timeout (60 s): a healthy worker under load is never taken for hung here
    pool = JsonWorkerPool(there.json, workers=2, on_failure=lambda: failures.append(1))
    yield here, there, pool, failures
    pool.close()


def test_a_worker_decodes_exactly_as_in_process(pool_and_decoders) -> None:  # type: ignore[no-untyped-def]
    here, there, pool, failures = pool_and_decoders
    for seed in range(3):  # three polls over two workers, finished in order
        pairs = [(m, ()) for m in _messages(seed=seed)]
        _same(there.finish_embeddings(there.start_embeddings(pairs, pool.submit)), here.decode_embeddings(pairs))
    assert failures == [] and len(pool.pids()) == 2
    assert here.dims == there.dims == {"m": 8}


def test_pipelined_polls_keep_their_order(pool_and_decoders) -> None:  # type: ignore[no-untyped-def]
    here, there, pool, _ = pool_and_decoders
    polls = [[(m, ()) for m in _messages(n=40, seed=seed)] for seed in range(4)]
    started = [there.start_embeddings(polls[0], pool.submit), there.start_embeddings(polls[1], pool.submit)]
    results = [there.finish_embeddings(started[0]), there.finish_embeddings(started[1])]
    for poll, result in zip(polls[:2], results, strict=True):
        _same(result, here.decode_embeddings(poll))


@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_dead_or_hung_worker_loses_nothing_and_is_replaced(pool_and_decoders, how: str) -> None:  # type: ignore[no-untyped-def]
    """Only the poll sent to the stopped or killed worker may fail over. The short timeout applies
    to that poll alone: a SIGSTOPped worker never answers, so 1 s only bounds how long the test
    waits for it, while the polls to healthy workers (their start-up included: 0.3-0.5 s at load
    average 21 on 2 cores, and more under heavier load) keep the default 60 s and never fail over."""
    here, there, pool, failures = pool_and_decoders
    pairs = [(m, ()) for m in _messages()]

    def poll():  # type: ignore[no-untyped-def]
        result = there.finish_embeddings(there.start_embeddings(pairs, pool.submit))
        _same(result, here.decode_embeddings(pairs))

    for _ in range(2):  # both workers started; the next poll goes to the first again
        poll()
    assert failures == [] and len(pool.pids()) == 2
    victim = pool.pids()[0]
    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    pool.timeout = 1.0
    try:
        poll()  # decoded in-process: nothing lost
    finally:
        pool.timeout = ANSWER_TIMEOUT_SECONDS
        if how == "hang":
            with contextlib.suppress(ProcessLookupError):  # the pool killed it already
                os.kill(victim, signal.SIGKILL)
    assert failures == [1] and victim not in pool.pids()
    for _ in range(2):  # the second worker, then a fresh one in the victim's place
        poll()
    assert failures == [1] and len(pool.pids()) == 2 and victim not in pool.pids()


class _JsonTopic(Source):
    """A source that serves a fixed list of JSON messages, 50 per poll; from ``hold_at`` on it
    answers empty polls (as an idle topic does) until ``release`` is set."""

    name = "kafka"

    def __init__(self, values: list[bytes], hold_at: int):
        self.values = values
        self.offset = 0
        self.hold_at = hold_at
        self.release = threading.Event()

    def poll(self, timeout: float) -> list[SourceMessage]:
        if self.offset >= len(self.values) or (self.offset >= self.hold_at and not self.release.is_set()):
            time.sleep(min(timeout, 0.01))  # an idle poll blocks for a while, as Kafka's does
            return []
        batch = self.values[self.offset : self.offset + 50]
        first, self.offset = self.offset, self.offset + len(batch)
        return [SourceMessage(value=v, headers=(), kind="embeddings", position=SourcePosition("t", 0, first + i))
                for i, v in enumerate(batch)]  # fmt: skip


def test_the_daemon_survives_a_worker_crash_and_counts_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    values = [
        orjson.dumps({"id": f"d{i}", "model": "m", "vector": rng.standard_normal(16).tolist()}) for i in range(3000)
    ]
    settings = load_settings(overrides={
        "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path), "drift": {"enabled": False},
        "checkpoint": {"enabled": False}, "decoding": {"json_workers": 1}, "kafka": {"default_stream": "s"},
    })  # fmt: skip
    # the worker is killed half-way, at a point the source waits at: the 2,500 records after it are
    # sent to the dead worker whatever the load (a kill after a 0.2 s wait could come after the last poll)
    source = _JsonTopic(values, hold_at=500)
    with daemons.monitor(settings, source=source) as monitor:
        pool = monitor.pipeline._json_workers
        assert pool is not None
        wait_until(lambda: (s := monitor.registry.get("m", "s")) is not None and s.records_total == 500, timeout=30)
        os.kill(pool.pids()[0], signal.SIGKILL)
        source.release.set()
        wait_until(lambda: (s := monitor.registry.get("m", "s")) is not None and s.records_total == 3000, timeout=30)
        assert monitor.errors.counts.snapshot().get("json_worker", 0) == 1
        assert monitor.offsets.applied() == {("t", 0): 2999}


def test_a_worker_whose_daemon_is_gone_exits_quietly() -> None:
    """A worker answering a daemon that was killed (its pipe closed) exits with status 0 and no
    traceback: the worker's stderr is the daemon's log. The crash test (tests/daemon/test_crash.py)
    failed on that traceback at load average 14-19, when a SIGKILL came while a worker was parsing."""
    collector = Decoder(LimitSettings()).json
    args = {"max_rows_per_message": collector.max_rows_per_message, "max_dimension": collector.max_dimension,
            "default_stream": collector.default_stream, "label_pattern": collector._label.pattern}
    value = _messages(n=2)[0]
    with subprocess.Popen([sys.executable, "-m", "monitor.decoding.json_workers", json.dumps(args)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as worker:
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdout.close()  # the reader is gone before the answer is written: the write fails, surely
        worker.stdin.write(struct.pack("<II", 1, len(value)) + value)
        worker.stdin.close()
        assert worker.stderr is not None
        stderr = worker.stderr.read()  # until the worker exits
        worker.wait(timeout=60)
    assert worker.returncode == 0 and stderr == b"", stderr.decode()
