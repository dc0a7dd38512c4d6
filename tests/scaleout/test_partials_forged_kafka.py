"""Forged and poisoned records on a real partials topic while real replicas publish.

Two replica processes (``embedding-monitor run --role replica``) share the embeddings topic; the
crash tests' producer (``KnownSequence``) writes its known sequence over ~40 s; meanwhile a forger
writes to the partials topic every record of the issue's findings, some signed with the
deployment's key (a leaked key still meets every bound), some not, and one that the Kafka client
cannot even parse. One replica restarts after the forger's rounds, reading them back for its
resume positions. At the end the reducer's window holds every produced record exactly once, and
it counted each forged record once under its reason.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout.partials import MAX_EPOCH, StreamManifest, WindowGeometry
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.resume import ManifestReader, published_offsets
from monitor.state.registry import StateRegistry
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.logs import tracebacks
from tests.support.producers import KnownSequence, RawHeaderKey
from tests.support.scaleout import (
    WINDOW,
    MemoryProducer,
    PartialsRecord,
    chunk_record,
    forged_partial,
    huge_capacity,
    infinite_index,
    manifest_record,
    nan_alignment,
    produced,
    replica,
    scaled_settings,
    signed,
    wait_for_exact_counts,
    wait_for_further_publications,
)
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

KEY = "forged-partials-test-key-0123456789abcdef"
REPLICAS = ("replica-a", "replica-b")
ROUNDS = 3


def geometry() -> WindowGeometry:
    quality = load_settings(overrides={"scale_out": {"role": "single"}}).quality  # the environment says replica
    return WindowGeometry(float(WINDOW["seconds"]), int(WINDOW["subwindows"]), int(WINDOW["reservoir_size"]),
                          quality.alignment_alpha)


def genuine_partials(key_file: Path) -> list[PartialsRecord]:
    """A real publication of replica-a's name, signed with the key: what the signed forgeries start from."""
    overrides = {"window": WINDOW, "scale_out": {"replica_id": "replica-a", "partials_key_file": str(key_file)}}
    settings = load_settings(overrides=overrides)
    registry = StateRegistry(settings)
    rng = np.random.default_rng(5)
    registry.apply(EmbeddingBatch("bin", "default", rng.standard_normal((20, 16)).astype(np.float32)), time.time())
    producer = MemoryProducer()
    publisher = PartialsPublisher(settings, producer_factory=lambda: producer)
    publisher.stage(publisher.epochs.next(), {}, registry.state_dict()["streams"])
    assert publisher.flush()
    return producer.take()


def forgeries(topic: str, key_file: Path) -> list[tuple[PartialsRecord, str]]:
    """Each forged or poisoned record with the reason the reducer counts it under."""
    keys = (KEY.encode(),)
    now = time.time()
    epoch = int(now * 1e9)
    g = geometry()
    skip = {(topic, 0): 10**6, (topic, 1): 10**6}  # every partition resumed far past its records
    nothing = (StreamManifest("bin", "default", 16, (), partition=0),)  # erases replica-a's stream

    def tree(change: Any) -> PartialsRecord:
        return signed(keys, forged_partial(genuine_partials(key_file), change))

    head = math.floor(now / (WINDOW["seconds"] / WINDOW["subwindows"]))
    return [
        (manifest_record("ghost", epoch, g, offsets=skip), "unsigned"),  # a made-up replica's manifest
        (manifest_record("replica-a", epoch + 1, g, nothing, skip), "unsigned"),  # a real one's, unsigned
        (signed(keys, manifest_record("ghost", epoch, g, offsets=skip)), "unknown_replica"),  # with a leaked key
        (signed(keys, manifest_record("replica-a", 2**64 - 1, g, nothing, skip)), "epoch_range"),
        (signed(keys, manifest_record("replica-b", MAX_EPOCH - 1, g, nothing, skip)), "epoch_range"),
        (signed(keys, manifest_record("replica-b", int((now + 3600) * 1e9), g, nothing, skip)), "epoch_range"),
        (tree(infinite_index), "corrupt"),  # an Infinity index
        (tree(huge_capacity), "oversize"),  # a reservoir of 2^40 rows
        (tree(nan_alignment), "corrupt"),  # a NaN alignment_sum
        (signed(keys, chunk_record("replica-a", "bin", "default", head + 10**6, epoch, b"x" * 64, "0/2")),
         "clock_skew"),  # a far-future incomplete chunk
        ((b'["subwindow","replica-a","bin","default",1,0]', b"x", [(RawHeaderKey(b"\xff\xfe"), b"v")]), "corrupt"),
    ]


class Forger(threading.Thread):
    """Writes every forgery to each partials partition, ``ROUNDS`` times, while the replicas publish."""

    def __init__(self, broker: Broker, topic: str, partials: str, key_file: Path):
        super().__init__(name="test-forger", daemon=True)
        self.broker, self.topic, self.partials, self.key_file = broker, topic, partials, key_file
        self.expected: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = self.broker.producer()
            for _ in range(ROUNDS):
                time.sleep(4.0)
                for partition in (0, 1):
                    for (key, payload, headers), reason in forgeries(self.topic, self.key_file):
                        producer.send(self.partials, key=key, value=payload, headers=headers, partition=partition)
                        self.expected[reason] += 1
                producer.flush()
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.slow
def test_forged_records_while_replicas_publish_are_refused_and_the_merge_stays_exact(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topic, group = "emb-forged", "forged-scaled"
    key_file = tmp_path / "partials.key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_KEY_FILE", str(key_file))
    monkeypatch.setenv("EMBMON_SCALE_OUT__REPLICAS", '["replica-a", "replica-b"]')
    settings = scaled_settings(monkeypatch, broker, topic, group, tmp_path)
    assert settings.scale_out.partials_keys() == (KEY.encode(),) and settings.scale_out.replicas == list(REPLICAS)
    partials = settings.scale_out.partials_topic
    logs = [tmp_path / "a-0.log", tmp_path / "b.log", tmp_path / "a-1.log"]
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        steady = running.enter_context(replica(broker, topic, "replica-b", tmp_path / "b", logs[1], group=group))
        with replica(broker, topic, "replica-a", tmp_path / "a", logs[0], group=group) as first:
            wait_until(lambda: "assigned partitions: [(" in first.output(), timeout=60, message="replica-a joined")
            producer = running.enter_context(KnownSequence(broker, topic))
            forger = Forger(broker, topic, partials, key_file)
            forger.start()
            forger.join(timeout=120)
            assert forger.error is None and not forger.is_alive()
        # restarted after every forgery is on the topic: its resume positions must ignore them all
        restarted = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", logs[2], group=group))
        expected = produced(producer)
        wait_for_exact_counts(reducer.http.port, expected)
        wait_for_further_publications(reducer)
        samples = scrape(reducer.http.port)
        replica_samples = scrape(restarted.port)
        ignored = reducer.table.status(time.time()).ignored
        reader = ManifestReader(settings)
        try:
            newest = reader.newest()
        finally:
            reader.close()
        assert steady.returncode is None

    for reason, count in forger.expected.items():
        assert ignored.get(reason, 0) == count, (reason, ignored)
        if reason != "clock_skew":
            assert value(samples, "embmon_reducer_partials_ignored_total", reason=reason) == ignored[reason]
    assert {r: n for r, n in ignored.items() if r not in ("duplicate", "superseded", "missing")} == dict(
        forger.expected)
    # the restarted replica read the forged manifests back and moved no position for any of them
    for reason in ("unsigned", "unknown_replica", "epoch_range"):
        assert (value(replica_samples, "embmon_partials_manifests_refused_total", reason=reason) or 0) > 0, reason
    assert newest is not None and set(newest) == set(REPLICAS)
    assert reader.refused.snapshot()["unsigned"] == 2 * 2 * ROUNDS
    assert value(samples, "embmon_reducer_replicas", state="live") == 2
    assert not [tb for log in logs for tb in tracebacks(log.read_text())]


@pytest.mark.slow  # over 5 s on the idle 2-core machine (.cache/test-durations.json)
def test_the_resume_reader_moves_past_an_unreadable_record_and_caps_offsets_at_the_log_end(
        broker: Broker, tmp_path: Path) -> None:
    """A record the client cannot parse stopped every replica's read of the manifests (so every resume
    position fell back to the group's commits); a published offset past the partition's end skipped
    the records written until the log reached it."""
    topic, partials = "emb-capped", "emb-capped-partials"
    broker.create_topics(topic, partitions=2)
    broker.create_topics(partials)
    producer = broker.producer()
    for i in range(5):  # one batch each: tansu lists the end as the last batch's first offset + 1
        producer.send(topic, b"x%d" % i, partition=0)
        producer.flush()
    for i in range(5, 10):  # one batch: offsets 5-9, listed end 6
        producer.send(topic, b"x%d" % i, partition=0)
    producer.flush()
    records = [((b'["manifest","r9"]', b"{}", [(RawHeaderKey(b"\xff\xfe"), b"v")]))]
    epoch = int(time.time() * 1e9)
    records += [manifest_record("r1", epoch, geometry(), offsets={(topic, 0): 699, (topic, 1): 3}),
                manifest_record("r2", epoch, geometry(), offsets={(topic, 0): 8})]
    for key, payload, headers in records:
        producer.send(partials, key=key, value=payload, headers=headers, partition=0)
        producer.flush()
    producer.close()
    settings = load_settings(overrides=kafka_daemon_overrides(
        broker, topic, "capped", tmp_path, window=WINDOW, scale_out={"partials_topic": partials, "replica_id": "r0"}))
    reader = ManifestReader(settings)
    try:
        newest = reader.newest()
        assert newest is not None and set(newest) == {"r1", "r2"}  # read past the unreadable record
        assert published_offsets(newest) == {(topic, 0): 699, (topic, 1): 3}
        assert reader.capped(published_offsets(newest)) == {(topic, 0): 5, (topic, 1): -1}
        assert reader.capped({(topic, 0): 8}) == {(topic, 0): 8}  # past the listed end, but in the log
    finally:
        reader.close()
    assert reader.refused.snapshot() == {"beyond_end": 2}
