"""The manifests a replica resumes after, read from a real partials topic, through either client
library (``kafka.client``: the readers and the publisher are built on the one the settings choose)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.config import Settings, load_settings
from monitor.scaleout.partials import KIND_HEADER, MANIFEST, Manifest, WindowGeometry, encode_manifest
from monitor.scaleout.resume import ManifestReader, published_offsets
from tests.support.broker import CLIENTS, Broker, kafka_daemon_overrides
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

GEOMETRY = WindowGeometry(60.0, 4, 100, 0.05)


def recreate(broker: Broker, topic: str) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    admin.delete_topics([topic])
    wait_until(lambda: topic not in admin.list_topics(), timeout=15, message=f"{topic} deleted")
    admin.close()
    broker.create_topics(topic)


def send(broker: Broker, topic: str, *manifests: Manifest, extra: tuple[tuple[bytes, list[tuple[str, bytes]]], ...] = ()
         ) -> None:
    producer = broker.producer()
    try:
        for manifest in manifests:
            record = encode_manifest(manifest)
            producer.send(topic, key=record.key, value=record.value, headers=list(record.headers), partition=0)
        for value, headers in extra:
            producer.send(topic, key=b"x", value=value, headers=headers, partition=0)
        producer.flush()
    finally:
        producer.close()


LIBRARY = {"kafka-python": "KafkaConsumer", "confluent": "LibrdkafkaConsumer"}


@pytest.mark.parametrize("client", CLIENTS)
def test_each_replicas_newest_manifest_incrementally(broker: Broker, tmp_path: Path, client: str) -> None:
    partials = f"resume-partials-{client}"
    broker.create_topics(partials)
    reader = ManifestReader(send_three(broker, partials, tmp_path, client), timeout=15)
    try:
        newest = reader.newest()
        assert newest is not None
        assert {r: m.epoch for r, m in newest.items()} == {"a": 3, "b": 2}  # corrupt and chunk records skipped
        assert type(reader._consumer).__name__ == LIBRARY[client]
        assert published_offsets(newest) == {("t", 0): 55, ("t", 1): 7}
        send(broker, partials, Manifest("b", 5, "j", GEOMETRY, {("t", 1): 90}, ()),
             Manifest("a", 2, "i", GEOMETRY, {("t", 0): 99}, ()))  # an older epoch of a: ignored
        newest = reader.newest()
        assert newest is not None and {r: m.epoch for r, m in newest.items()} == {"a": 3, "b": 5}
        assert published_offsets(newest) == {("t", 0): 55, ("t", 1): 90}
    finally:
        reader.close()


def test_a_recreated_partials_topic_is_read_again_from_its_start(broker: Broker, tmp_path: Path) -> None:
    """kafka-python only: a librdkafka consumer (confluent-kafka 2.16.1) assigned a topic that tansu
    deletes and creates again ends the process (SIGSEGV in librdkafka's metadata cache update;
    docs/operations.md, "Scaled out on librdkafka")."""
    partials = "resume-recreated"
    broker.create_topics(partials)
    reader = ManifestReader(send_three(broker, partials, tmp_path, "kafka-python"), timeout=15)
    try:
        newest = reader.newest()
        assert newest is not None and {r: m.epoch for r, m in newest.items()} == {"a": 3, "b": 2}
        # the topic deleted and recreated: what the old one held is forgotten, the new one read from its start
        recreate(broker, partials)
        send(broker, partials, Manifest("c", 9, "k", GEOMETRY, {("t", 0): 3}, ()))
        newest = reader.newest()
        assert newest is not None and {r: m.epoch for r, m in newest.items()} == {"c": 9}
        assert published_offsets(newest) == {("t", 0): 3}
    finally:
        reader.close()


def send_three(broker: Broker, partials: str, tmp_path: Path, client: str) -> Settings:
    """Three manifests of two replicas, a corrupt one and a chunk on ``partials``; the reader's settings."""
    corrupt = (b"{not json", [(KIND_HEADER, MANIFEST.encode())])
    chunk = (b"\x00" * 64, [(KIND_HEADER, b"subwindow")])
    send(broker, partials,
         Manifest("a", 1, "i", GEOMETRY, {("t", 0): 10}, ()),
         Manifest("b", 2, "j", GEOMETRY, {("t", 0): 40, ("t", 1): 7}, ()),
         Manifest("a", 3, "i", GEOMETRY, {("t", 0): 55}, ()),
         extra=(corrupt, chunk))
    return load_settings(overrides=kafka_daemon_overrides(
        broker, "resume-embeddings", "resume", tmp_path, client=client, scale_out={"partials_topic": partials}))


@pytest.mark.parametrize("client", CLIENTS)
def test_an_absent_partials_topic_holds_no_manifests(broker: Broker, tmp_path: Path, client: str) -> None:
    settings = load_settings(overrides=kafka_daemon_overrides(
        broker, "resume-embeddings", "resume", tmp_path, client=client,
        scale_out={"partials_topic": "resume-never-created"}))
    reader = ManifestReader(settings, timeout=10)
    try:
        assert reader.newest() == {}
    finally:
        reader.close()


@pytest.mark.slow  # over 5 s on the idle 2-core machine (.cache/test-durations.json)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_seal_written_to_some_partitions_only_is_completed_on_the_others(broker: Broker, tmp_path: Path,
                                                                           client: str) -> None:
    """A replica killed while sealing a publication: the reader names the partitions its newest
    manifest is missing from, a publisher writes it there, and then nothing is missing."""
    from monitor.scaleout.partials import StreamManifest
    from monitor.scaleout.publisher import PartialsPublisher

    partials = f"resume-seals-{client}"
    broker.create_topics(partials, partitions=3)
    settings = load_settings(overrides=kafka_daemon_overrides(
        broker, "resume-embeddings", "resume", tmp_path, client=client,
        scale_out={"partials_topic": partials, "replica_id": "survivor", "publish_timeout_seconds": 10}))
    streams = (StreamManifest("m", "s", 4, ((1, 7, 3),), partition=2),)
    sealed = Manifest("victim", 7, "i", GEOMETRY, {("t", 0): 12}, streams)
    older = Manifest("victim", 5, "i", GEOMETRY, {("t", 0): 9}, streams)
    legacy = Manifest("old-build", 4, "j", GEOMETRY, {("t", 1): 3}, (StreamManifest("m", "s", 4, ((1, 4, 2),)),))
    producer = broker.producer()
    for manifest, partitions in ((older, (0, 1, 2)), (sealed, (0,)), (legacy, (1,))):
        record = encode_manifest(manifest)
        for partition in partitions:
            producer.send(partials, key=record.key, value=record.value, headers=list(record.headers),
                          partition=partition)
    producer.flush()
    producer.close()
    reader = ManifestReader(settings, timeout=15)
    publisher = PartialsPublisher(settings)
    try:
        newest = reader.newest()
        assert newest is not None and newest["victim"].epoch == 7  # the offsets that count: it may be merged
        missing = reader.incomplete()
        assert [(r.value, partitions) for r, partitions in missing] == [(encode_manifest(sealed).value, [1, 2])]
        assert publisher.complete_seal(*missing[0])
        assert type(publisher._producer).__name__ == {"kafka-python": "KafkaProducer",
                                                      "confluent": "LibrdkafkaProducer"}[client]
        assert reader.newest() is not None and reader.incomplete() == []  # an older build's manifest is left
    finally:
        publisher.close()
        reader.close()
