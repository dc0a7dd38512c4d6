"""Helpers for the scale-out tests: an in-memory producer, feeding publications to a merge table, and
replica processes with their reducer on the real broker (the crash and publish-gap tests), and
reducer processes of a group (the group tests)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from monitor.config import Settings, deep_merge, load_settings
from monitor.scaleout import signing
from monitor.scaleout.partials import (
    CHUNK_HEADER,
    EPOCH_HEADER,
    KIND_HEADER,
    SUBWINDOW,
    Manifest,
    StreamManifest,
    WindowGeometry,
    encode_manifest,
    partition_of,
    subwindow_key,
)
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.reducer import Reducer
from monitor.scaleout.table import MergeTable
from monitor.state.registry import StateRegistry
from monitor.storage import checkpoint_format as ckpt
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.daemons import QUICK_SESSION, DaemonProcess
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until


class _Done:
    def get(self, timeout: float | None = None) -> None:
        return None


@dataclass
class MemoryProducer:
    """Stands in for KafkaProducer: keeps what was sent; ``fail`` makes sends raise."""

    sent: list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]] = field(default_factory=list)
    fail: bool = False
    partitions: tuple[int, ...] = (0,)
    placed: list[int] = field(default_factory=list)  # the partition of each record in ``sent``

    def send(self, topic: str, key: bytes, value: bytes | None, headers: Any, partition: int) -> _Done:
        if self.fail:
            raise ConnectionError("broker unreachable")
        self.sent.append((key, value, list(headers)))
        self.placed.append(partition)
        return _Done()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def partitions_for(self, topic: str) -> set[int]:
        return set(self.partitions)

    def close(self, timeout: float | None = None) -> None:
        pass

    def take(self) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]:
        out, self.sent, self.placed = self.sent, [], []
        return out

    def take_by_partition(self) -> dict[int, list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]]:
        """What was sent since the last take, per partition, in order."""
        out: dict[int, list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]] = {p: [] for p in self.partitions}
        for partition, record in zip(self.placed, self.sent, strict=True):
            out[partition].append(record)
        self.sent, self.placed = [], []
        return out


def feed(table: MergeTable, records: Iterable[tuple[bytes, bytes | None, Any]], partition: int = 0,
         first_offset: int = 0) -> None:
    """Apply records of the partials topic to ``table`` as the reducer's intake does."""
    for offset, (key, payload, headers) in enumerate(records, start=first_offset):
        table.offer_record(key, payload, headers, ("partials", partition, offset))


# ---------------------------------------------------------------- replica processes on the real broker
PARTITIONS = 2  # one partition per replica while both run; both on one while the victim is down
EXACT = ("partition_isotropy", "effective_dimension", "mean_cosine_similarity", "vector_norm_mean",
         "vector_norm_stddev", "effective_rank", "stable_rank", "top10_variance_ratio")
WINDOW = {"seconds": 3600, "subwindows": 4, "reservoir_size": 500}


def replica(broker: Broker, topic: str, name: str, state_dir: Path, log: Path, group: str = "crash-scaled",
            env: dict[str, str] | None = None, client: str = "kafka-python") -> AbstractContextManager[DaemonProcess]:
    """``embedding-monitor run`` as the crash tests start it (``daemons.crash_tested``: fast commits and
    checkpoints, a short session, through ``client``), as replica ``name`` of the scaled deployment
    (the environment says so)."""
    return daemons.crash_tested(broker, topic, group, state_dir, log,
                                env={"EMBMON_SCALE_OUT__REPLICA_ID": name, **(env or {})}, client=client)


def reducer_process(broker: Broker, topic: str, partials: str, state_dir: Path,
                    log: Path, client: str = "kafka-python") -> AbstractContextManager[DaemonProcess]:
    """``embedding-monitor run`` as a reducer of the group ``{topic}-reducers`` on ``partials`` (the
    window :data:`WINDOW`) through ``client`` (``kafka.client``), its consumer leaving the group
    quickly when killed."""
    env = {
        "EMBMON_KAFKA__CLIENT": client,
        "EMBMON_SCALE_OUT__ROLE": "reducer", "EMBMON_SCALE_OUT__PARTIALS_TOPIC": partials,
        "EMBMON_SCALE_OUT__REDUCER_GROUP": f"{topic}-reducers", "EMBMON_DRIFT__ENABLED": "false",
        "EMBMON_KAFKA__POLL_TIMEOUT_SECONDS": "0.2", "EMBMON_CHECKPOINT__INTERVAL_SECONDS": "1",
        **{f"EMBMON_WINDOW__{k.upper()}": str(v) for k, v in WINDOW.items()},
    }
    return daemons.process(
        "--bootstrap-servers", broker.bootstrap, "--embeddings-topic", topic, "--group-id", f"{topic}-replicas",
        "--state-dir", str(state_dir), "--refresh-seconds", "0.3",
        *[f"--kafka-option={k}={v}" for k, v in QUICK_SESSION.items()], log=log, env=env,
    )


# ---------------------------------------------------------------- a group of reducers: four streams, two on each
# of two partials partitions (the group tests)
STREAMS = ("s0", "s1", "s2", "s3")  # two on each partials partition
DIM, ROWS, BATCHES = 16, 20, 6


def produce(broker: Broker, topic: str, seed: int, streams: tuple[str, ...] = STREAMS, partitions: int = 3,
            batches: int = BATCHES) -> dict[str, int]:
    """Binary batches of every stream over partitions 0 to ``partitions - 1`` of ``topic``; rows produced per stream."""
    rng = np.random.default_rng(seed)
    producer = broker.producer()
    counts = dict.fromkeys(streams, 0)
    for i in range(batches):
        for stream in streams:
            block = rng.standard_normal((ROWS, DIM)).astype(np.float32) + streams.index(stream)
            producer.send(topic, block.tobytes(), partition=i % partitions,
                          headers=[("model", b"m"), ("dim", str(DIM).encode()), ("stream", stream.encode())])
            counts[stream] += ROWS
    producer.flush()
    producer.close()
    return counts


def exported(port: int) -> dict[str, float]:
    """The window records of every stream this reducer exports."""
    samples = scrape(port)
    return {s: n for s in STREAMS if (n := value(samples, "embmon_window_records", model="m", stream=s)) is not None}


def differences(port: int, single: int, streams: set[str], worst: dict[str, float]) -> None:
    """Every exact gauge of ``streams`` on this reducer against the single daemon's: equal to 1e-9
    relative; ``worst`` keeps the largest relative difference per gauge."""
    got, want = scrape(port), scrape(single)
    for stream in sorted(streams):
        for name in EXACT:
            a = value(got, f"embmon_{name}", model="m", stream=stream)
            b = value(want, f"embmon_{name}", model="m", stream=stream)
            assert a is not None and b is not None, (stream, name)
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (stream, name)
            worst[name] = max(worst.get(name, 0.0), abs(a - b) / max(abs(b), 1e-300))


def owned(port: int) -> set[str]:
    samples = scrape(port)
    return {s for s in STREAMS if value(samples, "embmon_reducer_stream_owned", model="m", stream=s) == 1}


def start_reducer_group(running: ExitStack, broker: Broker, topic: str, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch, replicas: int, client: str = "kafka-python",
                        ) -> tuple[list[DaemonProcess], list[DaemonProcess], DaemonProcess]:
    """``topic`` (3 partitions) and ``{topic}-partials`` (2, two of :data:`STREAMS` on each), the
    replicas' settings in the environment, and entered into ``running``: ``replicas`` replica
    processes and two reducer processes of one group, all through ``client``, and a single daemon
    (kafka-python) that reads everything."""
    partials = f"{topic}-partials"
    broker.create_topics(topic, partitions=3)
    broker.create_topics(partials, partitions=2)
    assert sorted(partition_of("m", s, [0, 1]) for s in STREAMS) == [0, 0, 1, 1]
    for key, setting in WINDOW.items():
        monkeypatch.setenv(f"EMBMON_WINDOW__{key.upper()}", str(setting))
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_TOPIC", partials)
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")
    started = [running.enter_context(replica(broker, topic, f"replica-{i}", tmp_path / f"r{i}",
                                             tmp_path / f"r{i}.log", group=f"{topic}-replicas", client=client))
               for i in range(replicas)]
    reducers = [running.enter_context(reducer_process(broker, topic, partials, tmp_path / f"reducer-{i}",
                                                      tmp_path / f"reducer-{i}.log", client=client))
                for i in range(2)]
    single = running.enter_context(daemons.crash_tested(broker, topic, f"{topic}-single", tmp_path / "single",
                                                        tmp_path / "single.log",
                                                        env={"EMBMON_SCALE_OUT__ROLE": "single"}))
    return started, reducers, single


def shared_exactly(reducers: list[DaemonProcess], expected: dict[str, int]) -> bool:
    """Each of the two reducers exports two streams, every stream once, with the records ``expected``."""
    views = [exported(r.port) for r in reducers]
    return (all(len(v) == 2 for v in views) and set(views[0]) | set(views[1]) == set(STREAMS)
            and {**views[0], **views[1]} == expected)


def scaled_settings(monkeypatch: pytest.MonkeyPatch, broker: Broker, topic: str, group: str,
                    tmp_path: Path, extra: dict[str, Any] | None = None,
                    window: dict[str, float] | None = None) -> Settings:
    """The topic and its partials topic, the reducer's settings, and the replica processes'
    settings in the environment: the reducer's window and partials topic, role replica;
    ``extra``: more reducer settings, merged over these (``{"canaries": ...}``); ``window``: a
    window other than :data:`WINDOW` (the replicas' and the reducer's)."""
    partials = f"{topic}-partials"
    geometry = {**WINDOW, **(window or {})}
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(partials, partitions=2)
    for key, setting in geometry.items():
        monkeypatch.setenv(f"EMBMON_WINDOW__{key.upper()}", str(setting))
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_TOPIC", partials)
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")
    return load_settings(overrides=deep_merge(kafka_daemon_overrides(
        broker, topic, group, tmp_path / "reducer", window=geometry, drift={"enabled": False},
        scale_out={"role": "reducer", "partials_topic": partials},
    ), extra or {}))


def exact_counts_in(samples: dict, expected: dict[str, int]) -> bool:  # type: ignore[type-arg]
    return all(value(samples, "embmon_window_records", model=m, stream="default") == n for m, n in expected.items())


def wait_for_exact_counts(port: int, expected: dict[str, int], timeout: float = 120) -> None:
    """Until the reducer's window records equal what was produced (the failure says what it last held)."""
    seen: dict[str, float | None] = {}

    def exact_counts() -> bool:
        s = scrape(port)
        seen.update({m: value(s, "embmon_window_records", model=m, stream="default") for m in expected})
        return all(seen[m] == n for m, n in expected.items())

    try:
        wait_until(exact_counts, timeout=timeout, message="the reducer's counts reach what was produced")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; produced {expected}, the reducer's window last held {seen}") from None


def produced(producer: Any) -> dict[str, int]:
    """What the crash tests' producer (``KnownSequence``) wrote per model, once it is done."""
    producer.join(timeout=90)
    assert producer.error is None
    return {"bin": producer.MESSAGES * 20, "json": producer.MESSAGES}


def wait_for_further_publications(reducer: Reducer, count: int = 10) -> None:
    """Until the reducer applied ``count`` more manifests: a doubled or lost publication would show."""
    settled = reducer.table.status(time.time()).applied.get("manifest", 0)
    wait_until(lambda: reducer.table.status(time.time()).applied.get("manifest", 0) >= settled + count,
               timeout=60, message="further publications")


# ---------------------------------------------------------------- a reducer without broker
T0 = 3_000_000.0


WIDTH = 100.0  # the sub-window of :func:`reducer`'s window: 600 s in 6


class Replica:
    """A replica without broker: its own registry and publisher, publishing into a reducer's table."""

    def __init__(self, name: str, now: list[float]):
        self.settings = load_settings(overrides={"scale_out": {"replica_id": name},
                                                 "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 600}})
        self.registry = StateRegistry(self.settings)
        self.producer = MemoryProducer()
        self.publisher = PartialsPublisher(self.settings, producer_factory=lambda: self.producer, clock=lambda: now[0])

    def publish(self, daemon: Reducer) -> None:
        self.publisher.stage(self.publisher.epochs.next(), {}, self.registry.state_dict()["streams"])
        assert self.publisher.flush()
        feed(daemon.table, self.producer.take())


def reducer(tmp_path: Path, now: list[float], extra: dict[str, Any] | None = None, **drift: object) -> Reducer:
    """A reducer (no broker: fed through its table) on a clock the test moves, small drift samples;
    ``extra``: more settings, merged over these (``{"canaries": ...}``)."""
    settings = load_settings(overrides=deep_merge({
        "source": "kafka", "state_dir": str(tmp_path / "reducer"), "http": {"port": 0, "admin_token": "x" * 20},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 600},
        "scale_out": {"role": "reducer"},
        "drift": {"interval_seconds": 3600, "window_sample_size": 200, "reference_sample_size": 200, "threads": 1,
                  "ks": {"components": 4}, "classifier": {"squared_components": 2}, **drift},
    }, extra or {}))
    return Reducer(settings, clock=lambda: now[0])


# ---------------------------------------------------------------- forged and poisoned records
PartialsRecord = tuple[bytes, "bytes | None", list[tuple[str, bytes]]]


def partial_tree(records: list[PartialsRecord]) -> tuple[bytes, dict[str, Any], list[np.ndarray]]:
    """The key and the decoded tree (with its arrays) of the first single-chunk sub-window in ``records``."""
    for key, payload, headers in records:
        found = dict(headers)
        if payload is not None and found.get(KIND_HEADER) == SUBWINDOW.encode() and found[CHUNK_HEADER] == b"0/1":
            arrays: list[np.ndarray] = []
            return key, ckpt.flatten(ckpt.decode(payload), arrays), arrays
    raise AssertionError("no single-chunk sub-window")


def chunk_record(replica: str, model: str, stream: str, index: int, epoch: int, payload: bytes,
                 piece: str = "0/1") -> PartialsRecord:
    """A sub-window record as a replica writes it (unsigned)."""
    return (subwindow_key(replica, (model, stream, index), int(piece.split("/")[0])), payload,
            [(KIND_HEADER, SUBWINDOW.encode()), (EPOCH_HEADER, str(epoch).encode()), (CHUNK_HEADER, piece.encode())])


def forged_partial(records: list[PartialsRecord], change: Any) -> PartialsRecord:
    """A genuine sub-window record whose tree ``change`` edited (the container rebuilt: a valid sha256)."""
    key, flat, arrays = partial_tree(records)
    change(flat)
    _, replica, model, stream, index, _ = orjson.loads(key)
    return chunk_record(replica, model, stream, index, flat["epoch"], ckpt.encode(flat, arrays))


def manifest_record(replica: str, epoch: int, geometry: WindowGeometry, streams: tuple[StreamManifest, ...] = (),
                    offsets: dict[tuple[str, int], int] | None = None) -> PartialsRecord:
    """A manifest record (unsigned) of ``replica`` at ``epoch``."""
    record = encode_manifest(Manifest(replica, epoch, "forger", geometry, offsets or {}, streams))
    return (record.key, record.value, list(record.headers))


def signed(keys: tuple[bytes, ...], record: PartialsRecord) -> PartialsRecord:
    key, payload, headers = record
    return key, payload, list(signing.sign(keys, key, payload, headers))


def infinite_index(tree: dict[str, Any]) -> None:
    """A poison of the findings: an ``Infinity`` sub-window index (halted the reducer's partition)."""
    tree["subwindow"]["index"] = math.inf


def huge_capacity(tree: dict[str, Any]) -> None:
    """A reservoir capacity of 2^40 rows (allocated before it was compared with anything)."""
    tree["subwindow"]["reservoir"]["capacity"] = 2**40


def nan_alignment(tree: dict[str, Any]) -> None:
    """A NaN ``alignment_sum`` (was merged)."""
    tree["subwindow"]["alignment_sum"] = math.nan
