"""Every field of both event types, fuzzed as raw JSON text, through the real decoders.

The values are written as text because the dangerous ones cannot be written by orjson: integers
of hundreds of digits (a poison pill: ``float()`` of one raises OverflowError),
floats at and past float64's limits, ``NaN``/``Infinity`` tokens, nesting past the parsers'
limits, lone surrogates. Each poll goes through the decoder in-process, through JSON worker
processes, and message by message: nothing may raise, each message is applied or counted under
exactly one reason per record, and the poll's counts are the sum of its messages' counts.

The model strategy never invents a valid label other than the declared ``m1`` and ``m2``, so no
verdict depends on what else the poll held (a model's first record would fix its dimension), and
a message's verdict alone is its verdict within the poll.

A second part injects exceptions that no check foresees, at the record, row, message and batch
boundaries, in-process and in a real worker process: only the record hit is lost, as
``decode_error``, and the log names the exception, not the record.
"""

from __future__ import annotations

import logging
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.decoding import decoder as decoding
from monitor.decoding import json_decoding
from monitor.decoding.decoder import REASONS, Decoder, DecodeResult
from monitor.decoding.json_decoding import parse_json
from monitor.decoding.json_workers import JsonWorkerPool
from monitor.sources.base import SourceMessage
from tests.support import daemons
from tests.support.json_fuzz import DIMS, LIMITS, messages

EXAMPLES = 500
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))  # fmt: skip


# -- checks ---------------------------------------------------------------------------------------


def records_in(value: bytes) -> int:
    """How many records one message holds, as the decoders count them: an array's elements, else one."""
    if len(value) > LIMITS.max_message_bytes:
        return 1
    doc = parse_json(value)
    return len(doc) if isinstance(doc, list) else 1


def decoder() -> Decoder:
    return Decoder(LIMITS, declared_dims=DIMS)


def decode(kind: str, values: list[bytes], dec: Decoder | None = None) -> DecodeResult:
    dec = dec or decoder()
    pairs = [(v, ()) for v in values]
    return dec.decode_embeddings(pairs) if kind == "embeddings" else dec.decode_interactions(pairs)


def accepted(kind: str, result: DecodeResult) -> int:
    return sum(b.size for b in result.batches) if kind == "embeddings" else len(result.interactions)


def by_reason(result: DecodeResult) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_stream, reason), n in result.rejected.items():
        out[reason] += n
    return out


def check_poll(kind: str, values: list[bytes]) -> DecodeResult:
    """Decode ``values`` as one poll and each alone; assert the accounting; return the poll's result."""
    poll = decode(kind, values)
    assert set(by_reason(poll)) <= set(REASONS)
    total_accepted, total_rejected = 0, Counter[str]()
    for value in values:
        alone = decode(kind, [value])
        records, reasons = records_in(value), by_reason(alone)
        # applied or counted, never both, never twice: a one-record message has exactly one outcome
        assert accepted(kind, alone) + sum(reasons.values()) == records, (value[:200], reasons)
        if records == 1:
            assert accepted(kind, alone) + len(reasons) == 1, (value[:200], reasons)
        assert "decode_error" not in reasons, (value[:200], alone.examples)  # every input here has a proper reason
        total_accepted += accepted(kind, alone)
        total_rejected += reasons
    # with every model's dimension declared, a message's verdict does not depend on its poll
    assert accepted(kind, poll) == total_accepted
    assert by_reason(poll) == total_rejected
    for batch in poll.batches:
        assert batch.vectors.dtype == np.float32 and batch.vectors.shape[1] == DIMS[batch.model]
        assert np.isfinite(batch.vectors).all() and (batch.vectors != 0).any(axis=1).all()
        assert batch.timestamps is None or not np.isinf(batch.timestamps).any()
    for event in poll.interactions:
        assert event.ts is None or np.isfinite(event.ts)
        assert all(np.isfinite(g) for g in event.relevance.values())
    return poll


def same(a: DecodeResult, b: DecodeResult) -> None:
    assert a.rejected == b.rejected
    assert [(x.model, x.stream, x.ids, x.slices, x.pair_ids) for x in a.batches] == [
        (y.model, y.stream, y.ids, y.slices, y.pair_ids) for y in b.batches
    ]
    for x, y in zip(a.batches, b.batches, strict=True):
        np.testing.assert_array_equal(x.vectors, y.vectors)
        np.testing.assert_array_equal(x.timestamps, y.timestamps)


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[JsonWorkerPool, list[int]]]:
    failures: list[int] = []
    workers = JsonWorkerPool(decoder().json, workers=2, on_failure=lambda: failures.append(1), timeout=30.0)
    yield workers, failures
    workers.close()


# -- the fuzz -------------------------------------------------------------------------------------


# Every reason the field checks can give (not oversize, bad_header, bad_binary: no such message
# here; not label_limit: no budget; not decode_error: no input may need it).
FIELD_REASONS = {"bad_json", "not_object", "missing_field", "bad_field", "bad_timestamp", "bad_label", "bad_vector",
                 "empty_vector", "non_finite", "zero_vector", "dim_mismatch"}  # fmt: skip


# Polls run before the generated ones, whatever the seed: an empty vector is one value among the
# strategy's many, and an interaction's vector is optional, so 500 generated polls missed it in a CI run.
SEEDS = {
    "embeddings": [b'{"id": "e", "model": "m1", "vector": []}'],
    "interactions": [b'{"query_id": "q", "model": "m1", "query_vector": []}'],
}


def fuzz(kind: str, also: Callable[[list[bytes], DecodeResult], None] = lambda values, result: None) -> Counter[str]:
    """Run the fuzz of ``kind`` (``also`` checks more per poll); what it met: reasons, records applied, polls."""
    seen: Counter[str] = Counter()

    @FUZZ
    @example(SEEDS[kind])
    @given(st.lists(messages(kind), min_size=1, max_size=25))
    def run(values: list[bytes]) -> None:
        result = check_poll(kind, values)
        also(values, result)
        seen.update(by_reason(result))
        seen["applied"] += accepted(kind, result)
        seen["messages"] += len(values)
        seen["polls"] += 1

    run()
    return seen


@pytest.mark.slow
def test_embedding_events_every_field_in_process_and_in_workers(pool) -> None:  # type: ignore[no-untyped-def]
    workers, failures = pool

    def in_workers(values: list[bytes], here: DecodeResult) -> None:
        there = decoder()
        same(there.finish_embeddings(there.start_embeddings([(v, ()) for v in values], workers.submit)), here)
        assert failures == []  # the workers answered every poll: nothing fell back in-process

    seen = fuzz("embeddings", in_workers)
    assert seen["polls"] >= EXAMPLES and seen["applied"] > 0
    assert FIELD_REASONS <= set(seen), FIELD_REASONS - set(seen)  # the strategies reach every check


@pytest.mark.slow
def test_interaction_events_every_field() -> None:
    seen = fuzz("interactions")
    assert seen["polls"] >= EXAMPLES and seen["applied"] > 0
    assert FIELD_REASONS <= set(seen), FIELD_REASONS - set(seen)


def test_the_poison_pill_alone() -> None:
    poison = b'{"id": "p", "model": "m1", "vector": [1, 2, 3, 4], "ts": 1' + b"0" * 400 + b"}"
    assert by_reason(check_poll("embeddings", [poison])) == {"bad_timestamp": 1}
    interaction = b'{"model": "m1", "ts": 1' + b"0" * 400 + b"}"
    assert by_reason(check_poll("interactions", [interaction])) == {"bad_timestamp": 1}


# -- injected faults: exceptions no check foresees -------------------------------------------------

SENTINEL = 13.0  # a vector component that the injected faults react to
FAULTS = textwrap.dedent(
    """
    from monitor.decoding import decoder as decoding, json_decoding

    _collect_event = json_decoding.JsonCollector._collect_event
    _to_matrix = json_decoding.to_matrix
    _fast_events = json_decoding.fast_events
    _validate_rows = decoding.validate_rows
    _id_list = decoding._id_list


    def collect_event(self, event, pending, rejections):
        if isinstance(event, dict) and event.get("id") == "boom-event":
            raise LookupError("injected into an event")
        return _collect_event(self, event, pending, rejections)


    def to_matrix(vectors):
        if any(len(v) and float(v[0]) == 13.0 for v in vectors):
            raise ArithmeticError("injected into a row")
        return _to_matrix(vectors)


    def fast_events(value):
        if b"boom-message" in value:
            raise BufferError("injected into a message")
        return _fast_events(value)


    def validate_rows(matrix):
        if (matrix[:, 0] == 13.0).any():
            raise FloatingPointError("injected into a binary batch")
        return _validate_rows(matrix)


    def id_list(value):
        if value == ["boom-interaction"]:
            raise ZeroDivisionError("injected into an interaction")
        return _id_list(value)
    """
)
INSTALLED = {  # (module, attribute) -> the function of FAULTS that replaces it
    ("json_decoding.JsonCollector", "_collect_event"): "collect_event",
    ("json_decoding", "to_matrix"): "to_matrix",
    ("json_decoding", "fast_events"): "fast_events",
    ("decoding", "validate_rows"): "validate_rows",
    ("decoding", "_id_list"): "id_list",
}
SITECUSTOMIZE = FAULTS + "".join(f"{target}.{attr} = {name}\n" for (target, attr), name in INSTALLED.items())
SECRET = "do-not-log-this-payload"


def _inject_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same faults in this process, undone after the test (``SITECUSTOMIZE`` installs them in a worker)."""
    namespace: dict[str, Any] = {}
    exec(compile(FAULTS, "faults", "exec"), namespace)  # noqa: S102 - the test's own text
    targets = {"json_decoding.JsonCollector": json_decoding.JsonCollector, "json_decoding": json_decoding,
               "decoding": decoding}  # fmt: skip
    for (target, attr), name in INSTALLED.items():
        monkeypatch.setattr(targets[target], attr, namespace[name])


def _poisoned_poll() -> tuple[list[tuple[bytes, tuple]], list[bytes]]:
    good = [orjson.dumps({"id": f"g{i}", "model": "m1", "vector": [1.0, i, 2.0, 3.0], "ts": 1.5, "stream": "docs"})
            for i in range(6)]  # fmt: skip
    embeddings = [
        (good[0], ()),
        (orjson.dumps({"id": "boom-event", "model": "m1", "vector": [1, 2, 3, 4], "stream": "docs",
                       "note": SECRET}), ()),  # fmt: skip
        (good[1], ()),
        (orjson.dumps({"id": "boom-row", "model": "m1", "vector": [SENTINEL, 2, 3, 4], "stream": "docs"}), ()),
        (good[2], ()),
        (orjson.dumps({"id": "boom-message", "model": "m1", "vector": [1, 2, 3, 4], "note": SECRET}), ()),
        (good[3], ()),
        (np.full((3, 4), SENTINEL, np.float32).tobytes(), (("model", b"m1"), ("dim", b"4"), ("stream", b"docs"))),
        (np.ones((5, 4), np.float32).tobytes(), (("model", b"m1"), ("dim", b"4"), ("stream", b"docs"))),
        (good[4], ()),
        (orjson.dumps([{"id": "a1", "model": "m1", "vector": [1, 1, 1, 1]},
                       {"id": "boom-event", "model": "m1", "vector": [1, 1, 1, 1]},
                       {"id": "a2", "model": "m1", "vector": [0, 0, 0, 0]}]), ()),  # fmt: skip
        (good[5], ()),
    ]
    interactions = [
        orjson.dumps({"model": "m1", "query_id": "q1", "results": ["a"]}),
        orjson.dumps({"model": "m1", "query_id": "q2", "results": ["boom-interaction"], "note": SECRET}),
        orjson.dumps({"model": "m1", "query_id": "q3", "results": ["b"], "ts": 2.5}),
    ]
    return embeddings, interactions


def _check_contained(result: DecodeResult) -> None:
    # lost: the event (twice), the row, the message, the 3 rows of the binary message; the zero vector counted as such
    assert by_reason(result) == {"decode_error": 1 + 1 + 1 + 1 + 3, "zero_vector": 1}
    assert result.rejected[("docs", "decode_error")] == 1 + 1 + 3  # counted under the record's own stream
    ids = sorted(i for b in result.batches if b.ids for i in b.ids)
    assert ids == sorted([f"g{i}" for i in range(6)] + ["a1"])
    assert sum(b.size for b in result.batches if b.ids is None) == 5  # the clean binary message
    # one detail per reason: the first fault met, by its type and line, and nothing of the record
    detail = result.examples["decode_error"]
    assert detail.startswith(("LookupError at ", "ArithmeticError at ", "BufferError at ", "FloatingPointError at "))
    assert "while decoding" in detail and "injected" in detail
    assert SECRET not in repr(result.examples)


def test_injected_faults_lose_only_their_records_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    _inject_here(monkeypatch)
    embeddings, interactions = _poisoned_poll()
    _check_contained(decoder().decode_embeddings(embeddings))
    clicks = decoder().decode_interactions([(v, ()) for v in interactions])
    assert by_reason(clicks) == {"decode_error": 1} and [e.query_id for e in clicks.interactions] == ["q1", "q3"]
    assert clicks.examples["decode_error"].startswith("ZeroDivisionError at ")


def test_injected_faults_in_a_worker_process_answer_as_in_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker prepends the package root
    _inject_here(monkeypatch)  # binary batches are decoded here, JSON in the worker
    failures: list[int] = []
    there = decoder()
    workers = JsonWorkerPool(there.json, workers=1, on_failure=lambda: failures.append(1), timeout=30.0)
    try:
        embeddings, _ = _poisoned_poll()
        from_worker = there.finish_embeddings(there.start_embeddings(embeddings, workers.submit))
    finally:
        workers.close()
    assert failures == []  # the worker answered: a fault in a record does not take the worker down
    _check_contained(from_worker)
    same(from_worker, decoder().decode_embeddings(embeddings))


def test_a_decode_error_is_logged_with_its_exception_never_its_record(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    _inject_here(monkeypatch)
    settings = load_settings(overrides={"source": "synthetic", "http": {"host": "127.0.0.1", "port": 0},
                                        "state_dir": str(tmp_path), "models": {"m1": {"dim": 4}}})  # fmt: skip
    embeddings, interactions = _poisoned_poll()
    messages = [SourceMessage(v, h, "embeddings") for v, h in embeddings]
    messages += [SourceMessage(v, (), "interactions") for v in interactions]
    with caplog.at_level(logging.WARNING), daemons.stopped_after(Monitor(settings)) as monitor:
        monitor.pipeline.apply_messages(messages)
        invalid = monitor.status.invalid_counts()
        docs = monitor.registry.get("m1", "docs")
        assert docs is not None and docs.records_total == 6 + 5
        assert monitor.status.interaction_counts() == {"m1": 2}
    assert sum(n for (_, reason), n in invalid.items() if reason == "decode_error") == 7 + 1
    lines = [r.getMessage() for r in caplog.records if "decode_error" in r.getMessage()]
    assert len(lines) == 1  # once per reason per 10 s
    assert "skipping invalid record (decode_error): " in lines[0] and " at " in lines[0]
    assert SECRET not in caplog.text
