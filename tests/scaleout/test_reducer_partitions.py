"""Publications keyed by (model, stream), sealed on every partition: a reducer per partition holds its streams whole.

A replica's publication puts each stream's partials on that stream's partition of the partials
topic and then its manifest (the seal) on every partition. A reducer that reads some partitions
holds exactly their streams, each at one publication; a seal that reached only some partitions
(a replica killed while sealing) moves only those partitions' streams, until it is completed on the
others; a partition given away takes its streams out. Without a broker: the publisher writes to an
in-memory producer with two partitions, the tables read what each partition received.
"""

from __future__ import annotations

import time

import numpy as np
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout.export import OwnedOnly, Ownership
from monitor.scaleout.partials import MANIFEST, partition_of
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.table import MergeTable
from monitor.state.registry import StateRegistry
from tests.support.scaleout import MemoryProducer, feed

T0 = 2_000_000.0
DIM = 6
STREAMS = ("s0", "s1", "s2", "s3")  # s1, s3 on partition 0; s0, s2 on partition 1


def settings(replica: str = "reducer"):  # type: ignore[no-untyped-def]
    return load_settings(overrides={
        "scale_out": {"replica_id": replica},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 300},
        "drift": {"window_sample_size": 100},
    })


class Replica:
    def __init__(self, name: str, now: list[float]):
        self.registry = StateRegistry(settings(name))
        self.producer = MemoryProducer(partitions=(0, 1))
        self.publisher = PartialsPublisher(settings(name), producer_factory=lambda: self.producer,
                                           clock=lambda: now[0])

    def add(self, rng: np.random.Generator, stream: str, rows: int, at: float) -> None:
        x = rng.standard_normal((rows, DIM)).astype(np.float32) + STREAMS.index(stream)
        self.registry.apply(EmbeddingBatch("m", stream, x), at)

    def publish(self) -> dict[int, list]:  # type: ignore[type-arg]
        self.publisher.stage(self.publisher.epochs.next(), {}, self.registry.state_dict()["streams"])
        assert self.publisher.flush()
        return self.producer.take_by_partition()


def is_seal(record: tuple) -> bool:  # type: ignore[type-arg]
    return dict(record[2]).get("embmon-kind") == MANIFEST.encode()


def counts(table: MergeTable, at: float) -> dict[str, int]:
    return {stream: w.records for (_, stream), w in table.snapshot_windows(at).items()}


def fleet(now: list[float]) -> tuple[list[Replica], dict[str, int]]:
    rng = np.random.default_rng(3)
    replicas = [Replica(f"r{i}", now) for i in range(2)]
    produced = dict.fromkeys(STREAMS, 0)
    for i, replica in enumerate(replicas):
        for j, stream in enumerate(STREAMS):
            replica.add(rng, stream, 10 + 3 * i + j, T0 + 5)
            produced[stream] += 10 + 3 * i + j
    return replicas, produced


def test_each_stream_on_its_partition_and_the_seal_on_every_one() -> None:
    assert {s: partition_of("m", s, [0, 1]) for s in STREAMS} == {"s0": 1, "s1": 0, "s2": 1, "s3": 0}
    now = [T0 + 10]
    replicas, produced = fleet(now)
    tables = {p: MergeTable(settings(), clock=lambda: now[0]) for p in (0, 1)}
    both = MergeTable(settings(), clock=lambda: now[0])
    for replica in replicas:
        by_partition = replica.publish()
        for partition, records in by_partition.items():
            assert is_seal(records[-1]) and sum(map(is_seal, records)) == 1  # the seal last, once per partition
            feed(tables[partition], records, partition)
            feed(both, records, partition)
    assert counts(tables[0], now[0]) == {"s1": produced["s1"], "s3": produced["s3"]}
    assert counts(tables[1], now[0]) == {"s0": produced["s0"], "s2": produced["s2"]}
    assert counts(both, now[0]) == produced  # a single reducer reading both partitions holds everything
    # every seal lists every stream with its partition: a reducer knows where the others are
    assert tables[0].stream_partitions() == {("m", s): partition_of("m", s, [0, 1]) for s in STREAMS}


def test_a_seal_missing_on_one_partition_moves_only_the_others_until_completed() -> None:
    now = [T0 + 10]
    rng = np.random.default_rng(4)
    replica = Replica("r0", now)
    for stream in STREAMS:
        replica.add(rng, stream, 7, T0 + 5)
    table = MergeTable(settings(), clock=lambda: now[0])
    offsets = {0: 0, 1: 0}

    def deliver(records: list, partition: int) -> None:  # type: ignore[type-arg]
        feed(table, records, partition, first_offset=offsets[partition])
        offsets[partition] += len(records)

    for partition, records in replica.publish().items():
        deliver(records, partition)
    assert counts(table, now[0]) == dict.fromkeys(STREAMS, 7)
    for stream in STREAMS:
        replica.add(rng, stream, 5, T0 + 8)
    second = replica.publish()
    seal = second[0][-1]
    # killed while sealing: partition 1 got its partials, not its seal
    deliver(second[0], 0)
    deliver([r for r in second[1] if not is_seal(r)], 1)
    assert counts(table, now[0]) == {"s1": 12, "s3": 12, "s0": 7, "s2": 7}
    # another replica completes the seal on partition 1 (ReplicaRole.complete_seals): now all of it
    deliver([seal], 1)
    assert counts(table, now[0]) == dict.fromkeys(STREAMS, 12)
    # reading the seal again changes nothing
    deliver([seal], 1)
    assert counts(table, now[0]) == dict.fromkeys(STREAMS, 12)
    assert table.status(now[0]).ignored.get("duplicate", 0) >= 1


def test_a_released_partition_takes_its_streams_out_and_a_checkpoint_keeps_the_rest() -> None:
    now = [T0 + 10]
    replicas, produced = fleet(now)
    table = MergeTable(settings(), clock=lambda: now[0])
    for replica in replicas:
        for partition, records in replica.publish().items():
            feed(table, records, partition)
    table.release({1})
    assert counts(table, now[0]) == {"s1": produced["s1"], "s3": produced["s3"]}
    restored = MergeTable(settings(), clock=lambda: now[0])
    restored.load_state_dict(table.state_dict())
    assert counts(restored, now[0]) == counts(table, now[0])
    assert restored.stream_partitions() == table.stream_partitions()
    # a checkpoint written before seals (one manifest per replica, no partitions) still loads
    legacy = table.state_dict()
    for entry in legacy["streams"]:
        (_partition, manifest), = entry.pop("sealed")[:1]
        for s in manifest["streams"]:
            s.pop("partition")
        entry["manifest"] = manifest
    old = MergeTable(settings(), clock=lambda: now[0])
    old.load_state_dict(legacy)
    assert counts(old, now[0]) == counts(table, now[0])


class _Families(Collector):
    def collect(self):  # type: ignore[no-untyped-def]
        per_stream = GaugeMetricFamily("embmon_window_records", "records", labels=["model", "stream"])
        for stream in STREAMS:
            per_stream.add_metric(["m", stream], 1.0)
        per_model = GaugeMetricFamily("embmon_interactions", "events", labels=["model"])
        per_model.add_metric(["m"], 1.0)
        estimates = GaugeMetricFamily("embmon_retrieval_mrr", "estimates", labels=["probe", "model"])
        runs = GaugeMetricFamily("embmon_probe_runs", "runs", labels=["probe"])
        for probe in ("ann", "clicks"):
            estimates.add_metric([probe, "m"], 1.0)
            runs.add_metric([probe], 1.0)
        yield per_stream
        yield per_model
        yield estimates
        yield runs
        yield GaugeMetricFamily("embmon_build", "no labels", value=1.0)
        canary = GaugeMetricFamily("embmon_canary_cosine_min", "what this reducer compared", labels=["model"])
        canary.add_metric(["m"], 0.5)
        yield canary


def test_a_reducer_of_a_group_exports_only_its_streams_models_and_probes() -> None:
    now = [T0 + 10]
    replicas, _ = fleet(now)
    table = MergeTable(settings(), clock=lambda: now[0])
    for records in replicas[0].publish().values():
        feed(table, records[-1:])  # the seals say where every stream is
    table_partitions = table.stream_partitions()
    assert set(table_partitions) == {("m", s) for s in STREAMS}

    # "ann" reads the window of m/s3 (partition 0); "clicks" reads interactions only
    homes = {"ann": ("m", "s3"), "clicks": None}

    def ownership(owned: set[int] | None) -> Ownership:
        return Ownership(table, lambda: owned, lambda: owned or set(), homes)

    def exported(owned: set[int] | None) -> dict[str, set[tuple[str, ...]]]:
        collector = OwnedOnly(_Families(), ownership(owned))
        return {f.name: {tuple(s.labels.values()) for s in f.samples} for f in collector.collect()}

    mine = exported({0})
    assert mine["embmon_window_records"] == {("m", "s1"), ("m", "s3")}
    assert mine["embmon_interactions"] == set()  # model m's first stream, s0, is on partition 1
    assert mine["embmon_retrieval_mrr"] == {("ann", "m")}  # where its window is
    assert mine["embmon_probe_runs"] == {("ann",)}
    assert mine["embmon_build"] == {()}
    assert mine["embmon_canary_cosine_min"] == {("m",)}  # compared here: exported, whoever owns model m
    theirs = exported({1})
    assert theirs["embmon_window_records"] == {("m", "s0"), ("m", "s2")}
    assert theirs["embmon_interactions"] == {("m",)}
    assert theirs["embmon_retrieval_mrr"] == {("clicks", "m")}  # model m's owner
    assert theirs["embmon_probe_runs"] == {("clicks",)}  # the owner of the first stream, m/s0
    assert theirs["embmon_canary_cosine_min"] == {("m",)}
    everything = exported(None)
    assert everything["embmon_window_records"] == {("m", s) for s in STREAMS}
    assert everything["embmon_probe_runs"] == {("ann",), ("clicks",)}
    # a probe runs where its window is; one without a window runs everywhere
    assert [ownership({0}).runs_probe(p) for p in homes] == [True, True]
    assert [ownership({1}).runs_probe(p) for p in homes] == [False, True]
    assert ownership(None).runs_probe("ann")


def test_a_probe_is_at_home_where_the_window_it_reads_is() -> None:
    from monitor.retrieval.settings import ProbeSettings
    from monitor.scaleout.export import probe_home

    probes = ProbeSettings.model_validate({
        "ann_recall": [{"name": "ann", "model": "m", "stream": "s2"}],
        "clicks": [{"name": "clicks", "model": "m"}],
        "agreement": [{"name": "agree", "reference": {"model": "a", "stream": "x"},
                       "candidate": {"model": "b", "stream": "y"}}],
    })
    assert {p.name: probe_home(p) for p in probes.all_probes()} == {
        "ann": ("m", "s2"), "clicks": None, "agree": ("b", "y")}


class _GroupConsumer:
    """Stands in for the reducer group's KafkaConsumer: partition 0 of the partials topic assigned,
    its end at offset 10, nothing to poll; the test moves its position."""

    def __init__(self, topic: str):
        from kafka import TopicPartition

        self.tp = TopicPartition(topic, 0)
        self.at = 0

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout_ms: int, max_records: int) -> dict:  # type: ignore[type-arg]
        return {}

    def assignment(self) -> set:  # type: ignore[type-arg]
        return {self.tp}

    def offsets_for_times(self, wanted: dict) -> dict:  # type: ignore[type-arg]
        return dict.fromkeys(wanted)  # nothing that recent: seek to the end

    def seek_to_end(self, tp: object) -> None:
        pass

    def seek(self, tp: object, offset: int) -> None:
        self.at = offset

    def end_offsets(self, partitions: list) -> dict:  # type: ignore[type-arg]
        return dict.fromkeys(partitions, 10)

    def position(self, tp: object) -> int:
        return self.at

    def close(self, autocommit: bool = False) -> None:
        pass


def _group_reader(tmp_path, clock=time.time):  # type: ignore[no-untyped-def]
    """A reducer group's intake on :class:`_GroupConsumer`, and that consumer."""
    from monitor.daemon.counters import InternalErrors
    from monitor.decoding.decoder import Decoder
    from monitor.scaleout.intake import PartialsReader

    group = load_settings(overrides={
        "source": "kafka", "state_dir": str(tmp_path), "kafka": {"interactions_topic": None},
        "scale_out": {"role": "reducer", "reducer_group": "reducers"},
        "window": {"seconds": 600, "subwindows": 6, "reservoir_size": 300},
    })
    consumer = _GroupConsumer(group.scale_out.partials_topic)
    return PartialsReader(group, MergeTable(group), Decoder(group.limits), [], InternalErrors(), clock,
                          consumer_factory=lambda: consumer), consumer


def test_a_gained_partition_is_exported_only_once_read_up_to_its_end_when_gained(tmp_path) -> None:  # type: ignore[no-untyped-def]
    reader, consumer = _group_reader(tmp_path)
    reader.poll_once(0.0)
    assert reader.read_partitions() == {0} and reader.owned_partitions() == set()  # read back, not exported yet
    consumer.at = 9
    reader.poll_once(0.0)
    assert reader.owned_partitions() == set()
    consumer.at = 10
    reader.poll_once(0.0)
    assert reader.owned_partitions() == {0} and reader.rebalances == 1


def test_a_restored_partition_given_back_is_exported_once_read_up_to_its_end_and_refreshed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint's partition given back resumes at the checkpoint's position; its streams hold the
    checkpoint's older counts until read up to the end, and the windows exported are the last
    refresh's: exported once a refresh followed (fails with the older counts exported at once)."""
    now = [100.0]
    reader, consumer = _group_reader(tmp_path, lambda: now[0])
    refreshed: list[float | None] = [None]
    reader.refreshed_at = lambda: refreshed[0]
    reader.offsets.mark_applied({(reader.partials_topic, 0): 4})  # restored from a checkpoint
    reader.poll_once(0.0)
    assert consumer.at == 5 and reader.read_partitions() == {0} and reader.owned_partitions() == set()
    consumer.at = 10
    now[0] = 101.0
    reader.poll_once(0.0)
    assert reader.owned_partitions() == set()  # read up to its end: the last refresh is older
    refreshed[0] = 100.5
    assert reader.owned_partitions() == set()
    refreshed[0] = 101.0
    assert reader.owned_partitions() == {0} and reader.rebalances == 0  # its own partition: no rebalance
