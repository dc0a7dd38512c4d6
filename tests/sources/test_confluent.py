"""The librdkafka source (``kafka.client: confluent``, monitor/sources/kafka/confluent.py) against the real
tansu broker: where it resumes and what it commits, the rebalance hand-off, pause/resume, lag, every
codec decoded natively, a position outside the log reset and counted, a daemon on it counting records
and malformed ones by reason; and its settings checked before anything starts.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import yaml

from monitor.config import ConfigError, load_settings
from monitor.sources.base import Partition, PartitionListener, SourceMessage
from monitor.sources.kafka.confluent import COMMIT_TIMEOUT_SECONDS, ConfluentSource
from monitor.sources.kafka.reconnect import LAG_REFRESH_SECONDS
from tests.support import daemons
from tests.support.broker import Broker, free_port, kafka_daemon_overrides
from tests.support.paths import REPO
from tests.support.proxy import TcpProxy
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker
CODECS = ("gzip", "snappy", "lz4", "zstd")


class Recorder(PartitionListener):
    """The daemon's side of the hand-off, as data: what the checkpoint and the state reflect."""

    def __init__(self, resume: Mapping[Partition, int] | None = None, hand_over: int | None = None):
        self.resume = dict(resume or {})
        self.applied: dict[Partition, int] = {}
        self.hand_over = hand_over  # the offset on_revoked returns for each revoked partition
        self.calls: list[tuple[str, object]] = []

    def on_revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        self.calls.append(("revoked", sorted(partitions)))
        return {} if self.hand_over is None else dict.fromkeys(partitions, self.hand_over)

    def on_assigned(self, positions: Mapping[Partition, int]) -> None:
        self.calls.append(("assigned", dict(positions)))

    def on_reset(self, positions: Mapping[Partition, int]) -> None:
        self.calls.append(("reset", dict(positions)))

    def resume_offsets(self) -> dict[Partition, int]:
        return dict(self.resume)

    def applied_offsets(self) -> dict[Partition, int]:
        return dict(self.applied)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def produce(broker: Broker, topic: str, count: int, partition: int = 0, codec: str | None = None,
            prefix: str = "m", one_per_batch: bool = False) -> None:
    """``one_per_batch``: tansu lists a partition's end as its last batch's first offset + 1, and
    librdkafka starts ``latest`` there; one record a batch makes that the true end."""
    producer = broker.producer(**({"compression_type": codec} if codec else {}))
    try:
        for i in range(count):
            producer.send(topic, f"{prefix}{i}".encode(), headers=[("model", b"x")], partition=partition)
            if one_per_batch:
                producer.flush()
        producer.flush()
    finally:
        producer.close()


@pytest.fixture
def source_for(broker: Broker, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[ConfluentSource] = []

    def make(topic: str, group: str, listener: PartitionListener, clock: Clock | None = None,
             **kafka: object) -> ConfluentSource:
        settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, group, tmp_path / "state",
                                                                  client="confluent", kafka=kafka))
        source = ConfluentSource(settings.kafka, **({"clock": clock} if clock else {}))
        source.set_listener(listener)
        source.start()
        made.append(source)
        return source

    yield make
    for source in made:
        source.close()


def poll_until(source: ConfluentSource, count: int, timeout: float = 30) -> list[SourceMessage]:
    got: list[SourceMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += source.poll(0.2)
    assert len(got) >= count, f"{len(got)} of {count} messages within {timeout}s"
    return got


def offsets(messages: list[SourceMessage]) -> list[int]:
    return [m.position.offset for m in messages if m.position is not None]


def test_it_resumes_after_the_checkpoint_and_commits_only_what_it_is_given(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-resume", "cf-resume-group"
    broker.create_topics(topic)
    produce(broker, topic, 50)
    listener = Recorder(resume={(topic, 0): 19})  # the checkpoint reflects offsets 0..19
    source = source_for(topic, group, listener)
    got = poll_until(source, 30)
    assert offsets(got) == list(range(20, 50))
    assert [m.value for m in got[:2]] == [b"m20", b"m21"] and got[0].headers == (("model", b"x"),)
    assert {m.kind for m in got} == {"embeddings"}
    assert listener.calls == [("assigned", {(topic, 0): 20})]
    # the resume position is committed for the group's lag once a fetch there verified it; nothing more
    wait_until(lambda: broker.committed(group, topic) == 20, timeout=10, message="assignment commit")
    confirm(source, {(topic, 0): 39})
    assert broker.committed(group, topic) == 40
    assert source.commit({(topic, 1): 5}) is True  # not assigned here: skipped, not sent
    assert source.error_counts() == {"unsupported_codec": 0, "poll": 0}
    assert set(source.offset_reset_counts().values()) == {0}
    assert source.up


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_revocation_hands_off_then_commits_before_the_next_owner_starts(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-handoff", "cf-handoff-group"
    broker.create_topics(topic, partitions=2)
    for partition in (0, 1):
        produce(broker, topic, 40, partition=partition)
    first = Recorder(hand_over=24)  # state reflects offsets 0..24 of what it held when asked
    a = source_for(topic, group, first)
    poll_until(a, 80)
    second = Recorder()
    b = source_for(topic, group, second)
    got_b: list[SourceMessage] = []
    deadline = time.monotonic() + 40
    while not got_b and time.monotonic() < deadline:  # both poll: the group's join needs every member
        a.poll(0.1)
        got_b += b.poll(0.1)
    revoked = [c for c in first.calls if c[0] == "revoked"]
    assert revoked and revoked[0][1] == [(topic, 0), (topic, 1)], first.calls
    moved = {(m.position.topic, m.position.partition) for m in got_b if m.position is not None}
    assert len(moved) == 1, moved
    (key,) = moved
    # the next owner started right after what the revoked replica's state reflected
    assert min(m.position.offset for m in got_b if m.position is not None) == 25
    assert broker.committed(group, topic, key[1]) is not None and broker.committed(group, topic, key[1]) >= 25


def confirm(source: ConfluentSource, offsets: Mapping[Partition, int], timeout: float = 15) -> None:
    """Poll (the commit's answer comes inside a poll) until ``commit`` says the broker confirmed ``offsets``."""
    wait_until(lambda: source.commit(offsets) or bool(source.poll(0.1)) and False, timeout=timeout,
               message=f"commit of {dict(offsets)} confirmed")


@pytest.mark.slow
def test_a_commit_the_coordinator_leaves_unanswered_holds_nothing_and_reads_as_down(tmp_path: Path) -> None:
    """librdkafka's synchronous commit waits for a coordinator that accepts connections and never
    answers for good (seen here: over 40 s with a 10 s request timeout). The source commits
    asynchronously: polls go on, ``up`` reads down until a commit is answered again, and the
    unanswered commit is never given up for a newer one (librdkafka sent the given-up ones after
    the reconnect, after the newer one, and the group moved backwards)."""
    proxy_port = free_port()
    broker = Broker(advertised_port=proxy_port).start()
    proxy = TcpProxy(broker.port, port=proxy_port).start()
    source: ConfluentSource | None = None
    try:
        topic, group = "emb-held-commit", "held"
        broker.create_topics(topic, partitions=1)
        produce(broker, topic, 5)
        # the member outlives the hole (its partition stays assigned); joins wait for max.poll.interval.ms
        group_timeouts = {"session.timeout.ms": 12_000, "max.poll.interval.ms": 12_000, "socket.timeout.ms": 10_000}
        settings = load_settings(overrides=kafka_daemon_overrides(
            broker, topic, group, tmp_path / "state", client="confluent",
            kafka={"bootstrap_servers": f"127.0.0.1:{proxy_port}", "librdkafka": group_timeouts}))
        source = ConfluentSource(settings.kafka)
        source.set_listener(Recorder())
        source.start()
        last = offsets(poll_until(source, 5))[-1]
        confirm(source, {(topic, 0): last - 2})
        assert source.up
        proxy.black_hole()  # connections stay open, new ones are accepted, and nothing comes back
        started = time.monotonic()
        assert source.commit({(topic, 0): last - 1}) is False  # sent, not confirmed
        slowest, down_at = 0.0, None
        while time.monotonic() - started < COMMIT_TIMEOUT_SECONDS + 4:
            before = time.monotonic()
            source.commit({(topic, 0): last - 1})  # the poll thread asks again each turn, as the replica does
            source.poll(0.2)
            slowest = max(slowest, time.monotonic() - before)
            if down_at is None and not source.up:
                down_at = time.monotonic() - started
        assert slowest < 2.0, f"a poll turn took {slowest:.1f}s: the commit held the poll thread"
        assert down_at is not None and down_at >= COMMIT_TIMEOUT_SECONDS, down_at
        assert not source.up
        proxy.fill()
        confirm(source, {(topic, 0): last}, timeout=30)
        assert (topic, 0) in source._assigned  # confirmed by the broker, not skipped as not assigned
        for _ in range(10):  # any commit still queued in librdkafka lands meanwhile
            source.poll(0.2)
        assert broker.committed(group, topic) == last + 1
        assert source.up
    finally:
        if source is not None:
            source.close()
        proxy.stop()
        broker.stop()


def test_close_sends_the_offsets_asked_for_last(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    """The last commit asked for before the close reaches the broker, even while an earlier one
    was still unanswered (its answer comes inside a poll, and none came)."""
    topic, group = "cf-close-commit", "cf-close-commit-group"
    broker.create_topics(topic)
    produce(broker, topic, 50)
    source = source_for(topic, group, Recorder())
    poll_until(source, 50)
    confirm(source, {(topic, 0): 9})
    assert source.commit({(topic, 0): 29}) is False
    assert source.commit({(topic, 0): 49}) is False  # waits for the answer to the one under way
    source.close()
    assert broker.committed(group, topic) == 50


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_pause_stops_fetching_while_the_group_keeps_the_member(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-pause", "cf-pause-group"
    broker.create_topics(topic)
    produce(broker, topic, 10)
    listener = Recorder()
    source = source_for(topic, group, listener)
    poll_until(source, 10)
    source.pause()
    produce(broker, topic, 10, prefix="later")
    held: list[SourceMessage] = []
    ends = time.monotonic() + 4.0  # past the 3 s session timeout: a member that stopped polling would be out
    while time.monotonic() < ends:
        held += source.poll(0.2)
    assert held == [] and source.paused
    source.resume()
    got = poll_until(source, 10)
    assert [m.value for m in got] == [f"later{i}".encode() for i in range(10)]
    assert [c[0] for c in listener.calls] == ["assigned"]  # never revoked: the member stayed in the group


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_lag_counts_what_is_neither_read_nor_applied(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-lag", "cf-lag-group"
    broker.create_topics(topic)
    produce(broker, topic, 50)
    listener, clock = Recorder(), Clock()
    source = source_for(topic, group, listener, clock=clock)
    poll_until(source, 50)
    listener.applied = {(topic, 0): 29}  # read to 49, applied to 29: 20 queued
    clock.now += LAG_REFRESH_SECONDS
    source.poll(0.1)
    assert source.lag() == {topic: 20} and source.lag_updated is not None
    listener.applied = {(topic, 0): 49}
    produce(broker, topic, 5, prefix="more")  # 5 not yet read

    def measured() -> dict[str, int] | None:
        clock.now += LAG_REFRESH_SECONDS
        source.poll(0.1)  # fetched or not, the 5 are behind what the state reflects
        return source.lag()

    wait_until(lambda: measured() == {topic: 5}, timeout=10, message="lag 5", on_timeout=lambda: source.lag())
    progress = source.last_progress()
    assert progress is not None and set(progress) == {topic}


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_lag_counts_partitions_fetched_but_not_yet_consumed_from_where_they_started(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    # librdkafka reports position -1001 for a partition until a record of it was consumed; the lag
    # skipped such partitions and read 74 records behind instead of 1,124 just after a start.
    topic, group = "cf-lag-start", "cf-lag-start-group"
    broker.create_topics(topic, partitions=8)
    for partition, count in enumerate((150, 150, 150, 150, 100, 100, 0, 0)):  # two idle partitions
        produce(broker, topic, count, partition=partition)
    listener, clock = Recorder(), Clock()
    source = source_for(topic, group, listener, clock=clock, max_poll_records=5)
    got = poll_until(source, 1)
    assert len({m.position.partition for m in got if m.position}) < 6, "every partition consumed: no test"
    clock.now += LAG_REFRESH_SECONDS
    source.poll(0)
    assert source.lag() == {topic: 800}, "nothing applied: every record is behind the state"
    listener.applied = {(topic, 4): 99}  # partition 4 reflected in full (its records never consumed here)
    clock.now += LAG_REFRESH_SECONDS
    source.poll(0)
    assert source.lag() == {topic: 700}


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_lag_under_latest_counts_what_came_after_the_start(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    # Partition 1 is never consumed: its lag counts from the end first seen after the assignment.
    # (tansu lists an end behind what it fetches, so librdkafka's "latest" on partition 0 starts early.)
    topic, group = "cf-lag-latest", "cf-lag-latest-group"
    broker.create_topics(topic, partitions=2)
    produce(broker, topic, 50)
    listener, clock = Recorder(), Clock()
    source = source_for(topic, group, listener, clock=clock, auto_offset_reset="latest")
    got: list[SourceMessage] = []
    quiet, deadline = 0, time.monotonic() + 30
    while quiet < 3 and time.monotonic() < deadline:  # assigned, and two polls in a row return nothing
        batch = source.poll(0.5)
        got += batch
        quiet = quiet + 1 if not batch and len(source._assigned) == 2 else 0
    assert quiet == 3, "never assigned and quiet"
    assert all(m.position and m.position.partition == 0 for m in got)
    listener.applied = {(topic, 0): max(offsets(got), default=-1)}

    def measured() -> dict[str, int] | None:
        clock.now += LAG_REFRESH_SECONDS
        source.poll(0.1)
        return source.lag()

    wait_until(lambda: measured() == {topic: 0}, timeout=10, message="lag 0", on_timeout=lambda: source.lag())
    source.pause()  # nothing more is consumed: partition 1 keeps no position
    produce(broker, topic, 20, partition=1)
    wait_until(lambda: measured() == {topic: 20}, timeout=10, message="lag 20", on_timeout=lambda: source.lag())


@pytest.mark.slow  # a rebalance: 15-40 s
def test_lag_under_latest_counts_from_the_end_at_the_assignment_not_the_next_refresh(broker: Broker,
                                                                                    source_for) -> None:  # type: ignore[no-untyped-def]
    # A rebalance hands a partition to a paused member between two lag refreshes, and records arrive
    # before the next one: librdkafka started at the end at the assignment, so they are behind. The
    # end first seen by a refresh read 0 here.
    topic, group = "cf-lag-rebalance", "cf-lag-rebalance-group"
    broker.create_topics(topic, partitions=2)
    for partition in (0, 1):
        produce(broker, topic, 50, partition=partition, one_per_batch=True)
    first, clock = Recorder(), Clock()
    a = source_for(topic, group, first, clock=clock, auto_offset_reset="latest")
    wait_until(lambda: a.poll(0.2) == [] and len(a._assigned) == 2, timeout=30, message="A assigned")
    a.pause()
    b = source_for(topic, group, Recorder(), auto_offset_reset="latest")

    def one_each() -> bool:
        a.poll(0.1)
        b.poll(0.1)
        return len(a._assigned) == 1 and len(b._assigned) == 1

    wait_until(one_each, timeout=60, message="the partitions shared")
    ((_, kept),) = a._assigned
    produce(broker, topic, 30, partition=kept, one_per_batch=True)
    clock.now += LAG_REFRESH_SECONDS
    a.poll(0.2)
    b.poll(0)
    assert a.lag() == {topic: 30}


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_every_codec_is_decoded_natively(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-codecs", "cf-codecs-group"
    broker.create_topics(topic, partitions=len(CODECS))
    for partition, codec in enumerate(CODECS):
        produce(broker, topic, 30, partition=partition, codec=codec, prefix=codec)
    source = source_for(topic, group, Recorder())
    got = poll_until(source, 30 * len(CODECS))
    for partition, codec in enumerate(CODECS):
        values = [m.value for m in got if m.position is not None and m.position.partition == partition]
        assert values == [f"{codec}{i}".encode() for i in range(30)], codec
    assert source.error_counts()["poll"] == 0


@pytest.mark.slow  # the fast tier runs one client (kafka-python)
def test_a_resume_position_past_the_log_is_reset_counted_and_committed(broker: Broker, source_for) -> None:  # type: ignore[no-untyped-def]
    topic, group = "cf-past-end", "cf-past-end-group"
    broker.create_topics(topic)
    produce(broker, topic, 20)
    listener = Recorder(resume={(topic, 0): 499})  # a checkpoint of an older, longer topic
    source = source_for(topic, group, listener)
    got = poll_until(source, 20)
    assert offsets(got) == list(range(20))  # earliest: from the log's start
    assert source.offset_reset_counts()["past_end"] == 1
    assert ("reset", {(topic, 0): 0}) in listener.calls
    wait_until(lambda: broker.committed(group, topic) == 0, timeout=10, message="the reset position committed")


def test_a_daemon_on_librdkafka_counts_records_and_malformed_ones(broker: Broker, tmp_path: Path) -> None:
    topic, group, dim = "cf-daemon", "cf-daemon-group", 8
    broker.create_topics(topic)
    rows = np.random.default_rng(7).standard_normal((12, 5, dim)).astype(np.float32)
    producer = broker.producer(compression_type="lz4")
    for batch in rows:
        producer.send(topic, batch.tobytes(), headers=[("model", b"m"), ("dim", str(dim).encode())])
    producer.send(topic, b"\x00" * 7, headers=[("model", b"m"), ("dim", str(dim).encode())])  # not whole rows
    producer.send(topic, b"{not json", headers=[("model", b"m")])
    producer.flush()
    producer.close()
    settings = load_settings(overrides=kafka_daemon_overrides(broker, topic, group, tmp_path / "state",
                                                              client="confluent"))
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port
        wait_until(lambda: value(scrape(port), "embmon_records_total", model="m", stream="default") == 60,
                   timeout=40, message="records counted")
        wait_until(lambda: broker.committed(group, topic) == 14, timeout=20, message="offsets committed")
        samples = scrape(port)
    assert value(samples, "embmon_records_invalid_total", stream="default", reason="bad_binary") == 1
    invalid = sum(v for (name, labels), v in samples.items() if name == "embmon_records_invalid_total")
    assert invalid == 2, invalid
    assert value(samples, "embmon_source_up") == 1
    assert value(samples, "embmon_source_errors_total", reason="poll") == 0
    stats = monitor.registry.get("m", "default").window.snapshot(time.time()).stats
    np.testing.assert_allclose(stats.vector_sum, rows.reshape(-1, dim).astype(np.float64).sum(axis=0), rtol=1e-9)
    assert monitor.status.internal_error_counts() == {}


@pytest.mark.parametrize(
    ("kafka", "message"),
    [
        ({"client": "librdkafka"}, "kafka.client: Input should be 'kafka-python' or 'confluent'"),
        ({"client": "confluent", "options": {"ssl_context": "x"}}, "options.ssl_context has no librdkafka equivalent"),
        ({"client": "confluent", "librdkafka": {"enable.auto.commit": True}},
         "kafka.librdkafka: 'enable.auto.commit' is set by embedding-monitor itself"),
        ({"librdkafka": {"fetch.wait.max.ms": 10}}, "librdkafka: properties only read with client: confluent"),
    ],
    ids=["client", "untranslatable-option", "reserved-property", "property-without-the-client"],
)
def test_the_client_settings_are_checked(kafka: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(overrides={"source": "kafka", "kafka": kafka})
    assert message in str(raised.value)


def test_a_bad_client_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "embmon.yaml"
    config.write_text(yaml.safe_dump({"source": "kafka", "kafka": {"client": "rdkafka"},
                                      "state_dir": str(tmp_path / "state")}))
    done = subprocess.run(daemons.cli_argv("run", "--config", str(config)), cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "kafka.client" in done.stderr and "confluent" in done.stderr, done.stderr


def test_a_property_librdkafka_refuses_is_a_configuration_error(tmp_path: Path) -> None:
    settings = load_settings(overrides={"source": "kafka", "kafka": {"client": "confluent",
                                                                     "librdkafka": {"no.such.property": 1}}})
    source = ConfluentSource(settings.kafka)
    with pytest.raises(ConfigError, match="kafka.librdkafka: librdkafka refuses the consumer settings"):
        source.start()


def test_kafka_options_become_librdkafka_properties() -> None:
    from monitor.sources.kafka.confluent import librdkafka_config

    settings = load_settings(overrides={"source": "kafka", "kafka": {
        "client": "confluent", "group_id": "g", "bootstrap_servers": "a:1,b:2",
        "options": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
                    "sasl_plain_password": "p", "session_timeout_ms": 3000, "isolation_level": "read_uncommitted"},
        "librdkafka": {"session.timeout.ms": 4000}}})
    config = librdkafka_config(settings.kafka)
    assert config["bootstrap.servers"] == "a:1,b:2" and config["group.id"] == "g"
    assert (config["security.protocol"], config["sasl.mechanism"], config["sasl.username"], config["sasl.password"]) \
        == ("SASL_PLAINTEXT", "PLAIN", "u", "p")
    assert config["session.timeout.ms"] == 4000  # kafka.librdkafka on top
    assert config["isolation.level"] == "read_uncommitted"
    assert (config["enable.auto.commit"], config["enable.auto.offset.store"], config["auto.offset.reset"]) \
        == (False, False, "error")


def test_every_translated_option_is_a_librdkafka_property() -> None:
    """The translation table names properties this librdkafka knows (a value it refuses is fine
    here; an unknown name is not), so an upgrade that renames one is noticed."""
    from confluent_kafka import Consumer, KafkaException

    from monitor.sources.kafka.options import LIBRDKAFKA_NAMES, RESERVED_LIBRDKAFKA

    unknown = []
    for option, prop in sorted(LIBRDKAFKA_NAMES.items()):
        try:
            Consumer({"group.id": "g", prop: "\x01not a value"}).close()
        except KafkaException as exc:
            if "No such configuration property" in str(exc):
                unknown.append((option, prop))
    assert unknown == []
    assert not RESERVED_LIBRDKAFKA.intersection(LIBRDKAFKA_NAMES.values()) - {"auto.offset.reset"}
