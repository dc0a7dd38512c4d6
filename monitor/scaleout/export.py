"""Scrape-time families of the scale-out roles: a replica's publishing, the reducer's merge table.

They read counters and immutable snapshots only; names, HELP texts and labels come from
:mod:`monitor.catalog`, meanings from docs/metrics.md ("Scaling out").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor import catalog
from monitor.daemon.export import by_label
from monitor.scaleout.resume import REFUSED_REASONS
from monitor.scaleout.table import IGNORED_REASONS

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
        yield by_label(catalog.counter("embmon_partials_manifests_refused_total"), p.refused.snapshot(),
                       REFUSED_REASONS)
        failures = catalog.counter("embmon_partials_publish_failures_total")
        failures.add_metric([], float(p.failures))
        yield failures
        last = catalog.gauge("embmon_partials_last_publish_timestamp_seconds")
        if p.sent is not None:
            last.add_metric([], p.sent.at)
        yield last


class SigningCollector(Collector):
    """Whether this replica or reducer signs and checks the partials topic's records (a key file is set)."""

    def __init__(self, signed: bool):
        self._signed = signed

    def collect(self) -> Iterable[Metric]:
        family = catalog.gauge("embmon_partials_signing_enabled")
        family.add_metric([], 1.0 if self._signed else 0.0)
        yield family


def probe_home(spec: Any) -> tuple[str, str] | None:
    """The (model, stream) whose merged window a probe reads (None: it reads interactions only).

    An agreement probe reads two windows: its home is the candidate's (its ``model`` label); the
    reference's must be owned by the same reducer in a group (docs/deployment.md).
    """
    if spec.kind == "ann_recall":
        return (spec.model, spec.stream)
    if spec.kind == "golden" and getattr(spec.retriever, "kind", None) == "knn":
        return (spec.model, spec.retriever.stream)
    if spec.kind == "agreement":
        return (spec.candidate.model, spec.candidate.stream)
    return None


class Ownership:
    """Which streams, models and probes this reducer exports: every one, or in a group the streams
    whose partials are on its partitions, the models whose first stream (by name) is one of them,
    and the probes whose window (:func:`probe_home`) is one of them (a probe that reads no window:
    its per-model numbers by the model's owner, its run counters by the owner of the first stream)."""

    def __init__(self, table: MergeTable, owned_partitions: Callable[[], set[int] | None],
                 read_partitions: Callable[[], set[int]], probe_homes: Mapping[str, tuple[str, str] | None]):
        self._table = table
        self._owned_partitions = owned_partitions
        self.partitions = read_partitions
        self._probe_homes = dict(probe_homes)

    def streams(self) -> set[tuple[str, str]] | None:
        """The streams this reducer owns (None: all of them, a single reducer)."""
        owned = self._owned_partitions()
        if owned is None:
            return None
        return {key for key, partition in self._table.stream_partitions().items() if partition in owned}

    def runs_probe(self, name: str) -> bool:
        """Whether this reducer runs the probe (one that reads a window: where the window is)."""
        streams = self.streams()
        home = self._probe_homes.get(name)
        return streams is None or home is None or home in streams

    def runs_model(self, model: str) -> bool:
        """Whether this reducer runs the serving probe of ``model``: the one that exports the model
        (the owner of its first stream), or, while no stream of it is known, the owner of partition 0."""
        owned = self._owned_partitions()
        if owned is None:
            return True
        known = sorted(key for key in self._table.stream_partitions() if key[0] == model)
        if not known:
            return 0 in owned
        return self._table.stream_partitions()[known[0]] in owned

    def keep(self) -> Callable[[dict[str, str]], bool]:
        """A predicate on a sample's labels: exported here or not."""
        streams = self.streams()
        if streams is None:
            return lambda labels: True
        known = sorted(self._table.stream_partitions())
        first: dict[str, str] = {}
        for model, stream in known:
            first.setdefault(model, stream)
        models = {model for model, stream in first.items() if (model, stream) in streams}
        leader = bool(known) and known[0] in streams
        homes = self._probe_homes

        def keep(labels: dict[str, str]) -> bool:
            home = homes.get(labels.get("probe", ""))
            if home is not None:
                return home in streams
            if "model" not in labels:
                return leader if "probe" in labels else True
            if "stream" in labels:
                return (labels["model"], labels["stream"]) in streams
            return labels["model"] in models

        return keep


# Families a reducer exports for whatever it compared itself, whoever owns the model: the canary
# numbers. A model's canary records arrive on whichever of its streams the producer writes them
# to, so they are compared by that stream's owner; filtered to the model's owner (the owner of its
# first stream) they would be dropped whenever the two differ, and EmbeddingMonitorModelChanged
# could not fire. The component only has the models it compared; the alert and the dashboard
# aggregate by model (two reducers comparing one model's canaries fire one alert: promtool test).
COMPARED_HERE = "embmon_canary_"


class OwnedOnly(Collector):
    """Another collector's families, less the samples of streams and models another reducer exports,
    so every global gauge is exported by exactly one reducer of a group (the canary numbers: by the
    reducer that compared them, :data:`COMPARED_HERE`)."""

    def __init__(self, inner: Collector, ownership: Ownership):
        self._inner = inner
        self._ownership = ownership

    def collect(self) -> Iterable[Metric]:
        keep = self._ownership.keep()
        for family in self._inner.collect():
            if family.name.startswith(COMPARED_HERE):
                yield family
                continue
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
        # every reason from the start, at 0: a series born at 1 shows no increase(), and the refusal alert
        # would miss the first foreign record
        yield by_label(catalog.counter("embmon_reducer_partials_ignored_total"), status.ignored, IGNORED_REASONS)
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

