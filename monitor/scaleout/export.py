"""Scrape-time families of the scale-out roles: a replica's publishing, the reducer's merge table.

They read counters and immutable snapshots only; names, HELP texts and labels come from
:mod:`monitor.catalog`, meanings from docs/metrics.md ("Scaling out").
"""

from __future__ import annotations

from collections.abc import Iterable
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


class ReducerCollector(Collector):
    """The reducer's view of the replicas: how many, which are stale, how old, what was ignored."""

    def __init__(self, table: MergeTable, wall_clock: object):
        self._table = table
        self._clock = wall_clock

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

