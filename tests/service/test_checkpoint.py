"""Checkpoint format and restore: exact round trip (RNG state included), corrupt, truncated,
incompatible and hostile files fall back to the previous checkpoint (or empty state), never crash."""

from __future__ import annotations

import hashlib
import io
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import generate_latest

from monitor import checkpoint as ckpt
from monitor.config import load_settings
from monitor.records import SourcePosition
from monitor.service import Monitor
from monitor.sources import SourceMessage


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


MONITORS: list[Monitor] = []


@pytest.fixture(autouse=True)
def _stop_monitors() -> Iterator[None]:
    yield
    while MONITORS:
        MONITORS.pop().stop()  # idempotent; closes the HTTP socket of monitors never started


def make_monitor(state_dir: Path, clock: Clock | None = None, **extra: object) -> Monitor:
    settings = load_settings(
        overrides={
            "source": "synthetic",
            "checkpoint": {"enabled": True},
            "http": {"host": "127.0.0.1", "port": 0},
            "state_dir": str(state_dir),
            "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 60},
            **extra,
        }
    )
    monitor = Monitor(settings, clock=clock or Clock())
    MONITORS.append(monitor)
    return monitor


def feed(monitor: Monitor, rng: np.random.Generator, offset: int, n: int = 40, dim: int = 6) -> int:
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    messages = [
        SourceMessage(rows[i : i + 10].tobytes(), (("model", b"m"), ("dim", str(dim).encode())), "embeddings",
                      SourcePosition("t", 0, offset + k))
        for k, i in enumerate(range(0, n, 10))
    ]
    messages.append(SourceMessage(b"{bad", (), "embeddings", SourcePosition("t", 1, offset)))
    messages.append(SourceMessage(orjson.dumps({"id": "x", "model": "j", "vector": [1.0, 2.0], "pair_id": "p"}), (),
                                  "embeddings", SourcePosition("t", 1, offset + 1)))
    monitor.pipeline.apply_messages(messages)
    return offset + len(messages)


def window_state(monitor: Monitor, model: str = "m") -> dict:
    state = monitor.registry.get(model, monitor.decoder.default_stream)
    assert state is not None
    return state.window.state_dict()


def assert_same(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)  # type: ignore[arg-type]
        for x, y in zip(a, b):  # type: ignore[call-overload]
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)  # type: ignore[arg-type]
    else:
        assert a == b


def test_round_trip_is_exact_and_sampling_continues_identically(tmp_path: Path) -> None:
    clock, rng = Clock(), np.random.default_rng(0)
    first = make_monitor(tmp_path, clock)
    offset = 0
    for step in range(5):
        clock.now += 100 * step  # spread over several sub-windows
        offset = feed(first, rng, offset)
    assert first.checkpointer.checkpoint()
    second = make_monitor(tmp_path, Clock(clock.now))
    assert second.checkpointer.restore()
    assert_same(window_state(first), window_state(second))
    assert_same(window_state(first, "j"), window_state(second, "j"))
    assert second.registry.get("m", "documents").records_total == first.registry.get("m", "documents").records_total == 200
    assert second.status.invalid_counts() == first.status.invalid_counts() == {("documents", "bad_json"): 5}
    assert second.decoder.dims == {"m": 6, "j": 2}
    assert second.offsets.applied() == first.offsets.applied() == {("t", 0): 27, ("t", 1): 25}
    # the reservoirs' RNG state came back: the same next batch is sampled identically
    feed(first, np.random.default_rng(9), offset)
    feed(second, np.random.default_rng(9), offset)
    assert_same(window_state(first), window_state(second))
    for monitor in (first, second):
        monitor.stop()


def test_previous_checkpoint_is_kept_and_used_when_the_current_is_corrupt(tmp_path: Path) -> None:
    monitor, rng = make_monitor(tmp_path), np.random.default_rng(1)
    feed(monitor, rng, 0)
    assert monitor.checkpointer.checkpoint()
    feed(monitor, rng, 100)
    assert monitor.checkpointer.checkpoint()
    monitor.stop()
    store = ckpt.CheckpointStore(tmp_path)
    assert store.current.exists() and store.previous.exists()
    data = bytearray(store.current.read_bytes())
    data[len(data) // 2] ^= 0xFF
    store.current.write_bytes(bytes(data))
    restored = make_monitor(tmp_path)
    assert restored.checkpointer.restore()
    assert restored.checkpointer.restored_from == str(store.previous)
    assert restored.registry.get("m", "documents").records_total == 40  # the older state
    assert restored.checkpointer.restore_failures.snapshot() == {"corrupt": 1}
    assert (tmp_path / ckpt.REJECTED).exists() and not store.current.exists()
    text = generate_latest(restored.metrics_registry).decode()
    assert 'embmon_checkpoint_restore_failures_total{reason="corrupt"} 1.0' in text
    # the next write keeps the good previous one as .prev
    assert restored.checkpointer.checkpoint()
    assert store.current.exists() and store.previous.exists()
    restored.stop()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[: len(d) - 10], "corrupt"),  # truncated (crash mid-copy, full disk)
        (lambda d: b"NOTACKPT" + d[8:], "corrupt"),
        (lambda d: d[:8] + struct.pack("<H", ckpt.FORMAT_VERSION + 1) + d[10:], "incompatible"),
        (lambda d: b"", "corrupt"),
    ],
)
def test_unusable_files_fall_back_and_never_crash(tmp_path: Path, damage, reason: str) -> None:  # type: ignore[no-untyped-def]
    monitor = make_monitor(tmp_path)
    feed(monitor, np.random.default_rng(2), 0)
    assert monitor.checkpointer.checkpoint()
    monitor.stop()
    store = ckpt.CheckpointStore(tmp_path)
    store.current.write_bytes(damage(store.current.read_bytes()))
    restored = make_monitor(tmp_path)
    assert restored.checkpointer.restore() is False  # no previous one: empty state, and the daemon starts
    assert len(restored.registry) == 0
    assert restored.checkpointer.restore_failures.snapshot() == {reason: 1}
    restored.start()
    restored.stop()


def test_a_checkpoint_from_another_window_configuration_is_incompatible(tmp_path: Path) -> None:
    monitor = make_monitor(tmp_path)
    feed(monitor, np.random.default_rng(3), 0)
    assert monitor.checkpointer.checkpoint()
    monitor.stop()
    other = make_monitor(tmp_path, window={"seconds": 600, "subwindows": 3, "reservoir_size": 60})
    assert other.checkpointer.restore() is False
    assert other.checkpointer.restore_failures.snapshot() == {"incompatible": 1}
    assert len(other.registry) == 0
    other.stop()


def test_a_pickle_inside_a_valid_envelope_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(b"{}", dtype=np.uint8), a0=np.array([object()], dtype=object))
    payload = buffer.getvalue()
    header = struct.pack("<8sHHQ32s", ckpt.MAGIC, ckpt.FORMAT_VERSION, 0, len(payload), hashlib.sha256(payload).digest())
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.decode(header + payload)
    assert info.value.reason == "corrupt" and "pickle" in str(info.value).lower()


def test_tree_encoding_round_trips_the_types_state_dicts_use() -> None:
    rng = np.random.default_rng(0)
    state = {"ids": ["a", None], "big": 2**100, "nan": float("nan"), "rng": rng.bit_generator.state,
             "arr": np.arange(6, dtype=np.float32).reshape(2, 3), "keys": {1: "x", (2, 3): "y"}, "b": b"\x00\x01",
             "__nd__": 5, "empty": np.empty((0, 4))}
    arrays: list[np.ndarray] = []
    data = ckpt.encode(ckpt.flatten(state, arrays), arrays)
    back = ckpt.decode(data)
    assert back["rng"] == state["rng"] and back["big"] == 2**100 and np.isnan(back["nan"])
    assert back["keys"] == {1: "x", (2, 3): "y"} and back["b"] == b"\x00\x01" and back["__nd__"] == 5
    np.testing.assert_array_equal(back["arr"], state["arr"])
    assert back["arr"].dtype == np.float32 and back["empty"].shape == (0, 4)
    with pytest.raises(TypeError):
        ckpt.flatten({"x": object()}, [])


def test_checkpoint_size_and_time_at_dimension_768(tmp_path: Path) -> None:
    """Full state of one (model, stream) at d=768: 10 sub-windows, a 10,000-row reservoir."""
    clock = Clock()
    monitor = make_monitor(tmp_path, clock, window={"seconds": 900, "subwindows": 10, "reservoir_size": 10_000})
    rng = np.random.default_rng(4)
    for k in range(10):
        clock.now += 90
        rows = rng.standard_normal((1000, 768)).astype(np.float32)
        monitor.pipeline.apply_messages([SourceMessage(rows.tobytes(), (("model", b"big"), ("dim", b"768")), "embeddings",
                                                      SourcePosition("t", 0, k))])
    started = time.perf_counter()
    assert monitor.checkpointer.checkpoint()
    elapsed = time.perf_counter() - started
    size = ckpt.CheckpointStore(tmp_path).current.stat().st_size
    started = time.perf_counter()
    restored = make_monitor(tmp_path, Clock(clock.now), window={"seconds": 900, "subwindows": 10, "reservoir_size": 10_000})
    assert restored.checkpointer.restore()
    restore_elapsed = time.perf_counter() - started
    print(f"\ncheckpoint d=768: {size / 1e6:.1f} MB written in {elapsed:.2f} s, restored in {restore_elapsed:.2f} s")
    # 10 packed Gram triangles (768*769/2 float64) + 10,000 float32 reservoir rows, plus small change
    payload = 10 * (768 * 769 // 2) * 8 + 10_000 * 768 * 4
    assert payload < size < 1.05 * payload + 1_000_000
    assert elapsed < 10 and restore_elapsed < 10
    assert restored.registry.get("big", "documents").records_total == 10_000
    monitor.stop()
    restored.stop()
