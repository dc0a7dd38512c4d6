"""Scrape-time families of the scale-out roles: a replica's publishing, the reducer's merge table.

They read counters and immutable snapshots only; names, HELP texts and labels come from
:mod:`monitor.catalog`, meanings from docs/metrics.md ("Scaling out").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor import catalog
from monitor.server.collector import by_label

if TYPE_CHECKING:
    from monitor.scaleout.publisher import PartialsPublisher
    from monitor.scaleout.table import MergeTable

PUBLISHED_KINDS = ("subwindow", "tombstone", "manifest")
APPLIED_KINDS = ("subwindow", "manifest")


class PublisherCollector(Collector):
    """A replica's publications: records, bytes, failures, and when the newest one was sent."""

    def __init__(self, publisher: PartialsPublisher):
        self._publisher = publisher

    def collect(self) -> Iterable[Metric]:
        p = self._publisher
        yield by_label(catalog.counter("embmon_partials_published_total"), p.records.snapshot(), PUBLISHED_KINDS)
        size = catalog.counter("embmon_partials_published_bytes_total")
        size.add_metric([], float(p.bytes_total))
        yield size
        failures = catalog.counter("embmon_partials_publish_failures_total")
        failures.add_metric([], float(p.failures))
        yield failures
        last = catalog.gauge("embmon_partials_last_publish_timestamp_seconds")
        if p.sent is not None:
            last.add_metric([], p.sent.at)
        yield last


class Ownership:
    """Which streams and models this reducer exports: every one, or in a group the streams whose
    partials are on its partitions, and the models whose first stream (by name) is one of them."""

    def __init__(self, table: MergeTable, owned_partitions: Callable[[], set[int] | None],
                 read_partitions: Callable[[], set[int]]):
        self._table = table
        self._owned_partitions = owned_partitions
        self.partitions = read_partitions

    def streams(self) -> set[tuple[str, str]] | None:
        """The streams this reducer owns (None: all of them, a single reducer)."""
        owned = self._owned_partitions()
        if owned is None:
            return None
        return {key for key, partition in self._table.stream_partitions().items() if partition in owned}

    def keep(self) -> Callable[[dict[str, str]], bool]:
        """A predicate on a sample's labels: exported here or not."""
        streams = self.streams()
        if streams is None:
            return lambda labels: True
        first: dict[str, str] = {}
        for model, stream in sorted(self._table.stream_partitions()):
            first.setdefault(model, stream)
        models = {model for model, stream in first.items() if (model, stream) in streams}

        def keep(labels: dict[str, str]) -> bool:
            if "model" not in labels:
                return True
            if "stream" in labels:
                return (labels["model"], labels["stream"]) in streams
            return labels["model"] in models

        return keep


class OwnedOnly(Collector):
    """Another collector's families, less the samples of streams and models another reducer exports,
    so every global gauge is exported by exactly one reducer of a group."""

    def __init__(self, inner: Collector, ownership: Ownership):
        self._inner = inner
        self._ownership = ownership

    def collect(self) -> Iterable[Metric]:
        keep = self._ownership.keep()
        for family in self._inner.collect():
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [sample for sample in family.samples if keep(sample.labels)]
            yield kept


class ReducerCollector(Collector):
    """The reducer's view of the replicas: how many, which are stale, how old, what was ignored;
    which streams it owns."""

    def __init__(self, table: MergeTable, wall_clock: object, ownership: Ownership | None = None,
                 rebalances: Callable[[], int] = lambda: 0):
        self._table = table
        self._clock = wall_clock
        self._ownership = ownership
        self._rebalances = rebalances

    def collect(self) -> Iterable[Metric]:
        status = self._table.status(self._clock())  # type: ignore[operator]
        replicas = catalog.gauge("embmon_reducer_replicas")
        stale_count = sum(r.stale for r in status.replicas)
        replicas.add_metric(["live"], float(len(status.replicas) - stale_count))
        replicas.add_metric(["stale"], float(stale_count))
        yield replicas
        stale = catalog.gauge("embmon_reducer_replica_stale")
        age = catalog.gauge("embmon_reducer_partial_age_seconds")
        records = catalog.gauge("embmon_reducer_replica_window_records")
        for replica in status.replicas:
            stale.add_metric([replica.replica], 1.0 if replica.stale else 0.0)
            age.add_metric([replica.replica], replica.age_seconds)
            records.add_metric([replica.replica], float(replica.window_records))
        yield stale
        yield age
        yield records
        yield by_label(catalog.counter("embmon_reducer_partials_applied_total"), status.applied, APPLIED_KINDS)
        yield by_label(catalog.counter("embmon_reducer_partials_ignored_total"), status.ignored)
        yield from self._ownership_families()

    def _ownership_families(self) -> Iterable[Metric]:
        owned = catalog.gauge("embmon_reducer_stream_owned")
        partitions = catalog.gauge("embmon_reducer_partitions_owned")
        if self._ownership is not None:
            streams = self._ownership.streams()
            for model, stream in sorted(self._table.streams() if streams is None else streams):
                owned.add_metric([model, stream], 1.0)
            partitions.add_metric([], float(len(self._ownership.partitions())))
        yield owned
        yield partitions
        rebalances = catalog.counter("embmon_reducer_rebalances_total")
        rebalances.add_metric([], float(self._rebalances()))
        yield rebalances

