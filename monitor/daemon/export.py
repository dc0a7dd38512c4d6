"""Builds the metric families of one scrape from what the daemon already computed.

Collectors read a :class:`~monitor.daemon.status.DaemonStatus` (or a component's published snapshot) and
never compute: the refresh and the jobs did that. Names, HELP texts and label names come from
:mod:`monitor.catalog`; what each number means is in docs/metrics.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from monitor import __version__, catalog
from monitor.daemon.checkpointing import WRITE_STAGES
from monitor.storage.checkpoint_format import RESTORE_FAILURE_REASONS
from monitor.storage.durable_files import REJECTED_FILE_KINDS

if TYPE_CHECKING:
    from monitor.component import Component
    from monitor.daemon.checkpointing import CheckpointStatus
    from monitor.daemon.counters import InternalErrors
    from monitor.daemon.status import DaemonStatus

# Intrinsic gauges: the IntrinsicReport fields exported under embmon_<field>{model, stream}.
INTRINSIC_FIELDS = tuple(s.name.removeprefix("embmon_") for s in catalog.CATALOG.values() if s.area == "intrinsic")
AUTH_ENDPOINTS = ("metrics", "admin", "other")


class CoreCollector(Collector):
    """Ingest counters, source health and the published intrinsic metrics of every stream."""

    def __init__(self, status: DaemonStatus):
        self._status = status

    def collect(self) -> Iterable[Metric]:
        m = self._status
        yield catalog.info("embmon_build_info", {"version": __version__})
        yield from self._ingest_families()
        yield from self._intrinsic_families()
        source_up = catalog.gauge("embmon_source_up")
        source_up.add_metric([], 1.0 if m.source_up() else 0.0)
        yield source_up
        # what only some sources tell (a Kafka consumer's): absent where they tell nothing
        told: tuple[tuple[Metric, Mapping[Any, float] | None], ...] = (
            (catalog.counter("embmon_source_errors_total"), m.source_error_counts()),
            (catalog.gauge("embmon_consumer_lag_records"), m.source_lag()),
            (catalog.counter("embmon_source_offset_resets_total"), m.source_offset_resets()),
            (catalog.gauge("embmon_source_last_progress_timestamp_seconds"), m.source_progress()),
        )
        for family, values in told:
            if values:
                yield by_label(family, values)

    def _ingest_families(self) -> Iterable[Metric]:
        m = self._status
        records = catalog.counter("embmon_records_total")
        last = catalog.gauge("embmon_last_record_timestamp_seconds")
        for state in m.streams():
            records.add_metric([state.model, state.stream], float(state.records_total))
            if state.last_record_time is not None:
                last.add_metric([state.model, state.stream], state.last_record_time)
        yield records
        yield last
        yield by_label(catalog.counter("embmon_records_invalid_total"), m.invalid_counts())
        yield by_label(catalog.counter("embmon_interactions_total"), m.interaction_counts())
        yield by_label(catalog.counter("embmon_internal_errors_total"), m.internal_error_counts())
        yield by_label(catalog.counter("embmon_job_runs_total"), m.job_run_counts())

    def _intrinsic_families(self) -> Iterable[Metric]:
        published = self._status.published
        families = {name: catalog.gauge(f"embmon_{name}") for name in INTRINSIC_FIELDS}
        updated = catalog.gauge("embmon_metrics_last_update_timestamp_seconds")
        for (model, stream), entry in sorted(published.reports.items()):
            labels = [model, stream]
            for field in dataclasses.fields(entry.report):
                family = families.get(field.name)
                value = getattr(entry.report, field.name)
                if family is None or value is None:
                    continue
                value = float(value)
                if not math.isnan(value):
                    family.add_metric(labels, value)
            updated.add_metric(labels, entry.computed_at)
        yield from families.values()
        yield updated


class OperationsCollector(Collector):
    """Checkpoint, backpressure and access-control metrics (docs/metrics.md, "Operations")."""

    def __init__(self, status: DaemonStatus):
        self._status = status

    def collect(self) -> Iterable[Metric]:
        m = self._status
        if m.computes_windows:
            yield from _refresh_families(m)
        checkpoint = m.checkpoint()
        if checkpoint is not None:
            yield from _checkpoint_families(m, checkpoint)
        depth = catalog.gauge("embmon_ingest_queue_polls")
        depth.add_metric([], float(m.queue_depth()))
        yield depth
        paused = catalog.gauge("embmon_ingest_paused")
        paused.add_metric([], 1.0 if m.ingest_paused() else 0.0)
        yield paused
        pressure = catalog.counter("embmon_ingest_backpressure_seconds_total")
        pressure.add_metric([], m.backpressure_seconds())
        yield pressure
        lag_updated = m.lag_updated()
        if lag_updated is not None:
            fresh = catalog.gauge("embmon_consumer_lag_timestamp_seconds")
            fresh.add_metric([], lag_updated)
            yield fresh
        yield by_label(catalog.counter("embmon_http_auth_failures_total"), m.auth_failure_counts(), AUTH_ENDPOINTS)
        yield by_label(catalog.counter("embmon_state_files_rejected_total"), m.rejected_file_counts(),
                       REJECTED_FILE_KINDS)


def _refresh_families(m: DaemonStatus) -> Iterable[Metric]:
    when = catalog.gauge("embmon_refresh_last_success_timestamp_seconds")
    age = catalog.gauge("embmon_refresh_age_seconds")
    succeeded = m.refresh_succeeded_at()
    if succeeded is not None:
        when.add_metric([], succeeded)
    age.add_metric([], max(0.0, m.wall_clock() - (succeeded if succeeded is not None else m.started_at)))
    yield when
    yield age


def _checkpoint_families(m: DaemonStatus, status: CheckpointStatus) -> Iterable[Metric]:
    when = catalog.gauge("embmon_checkpoint_last_success_timestamp_seconds")
    age = catalog.gauge("embmon_checkpoint_age_seconds")
    size = catalog.gauge("embmon_checkpoint_size_bytes")
    now = m.wall_clock()
    if status.last_success is not None:
        when.add_metric([], status.last_success)
        age.add_metric([], max(0.0, now - status.last_success))
        size.add_metric([], status.size_bytes or 0.0)
    else:
        age.add_metric([], max(0.0, now - m.started_at))
    yield when
    yield age
    yield size
    yield by_label(catalog.counter("embmon_checkpoint_write_failures_total"), status.write_failures, WRITE_STAGES)
    yield by_label(
        catalog.counter("embmon_checkpoint_restore_failures_total"), status.restore_failures, RESTORE_FAILURE_REASONS
    )


_Labels = TypeVar("_Labels", bound=str | tuple[str, ...])  # one label value, or one per label


def by_label(family: Metric, counts: Mapping[_Labels, float], always: Sequence[_Labels] = ()) -> Metric:
    """``family`` with one sample per key of ``counts`` (a label value or a tuple of them), sorted;
    the label values in ``always`` are present from the start, at 0 until counted."""
    values: dict[_Labels, float] = {**{key: 0.0 for key in always}, **counts}
    for key, count in sorted(values.items()):
        labels = list(key) if isinstance(key, tuple) else [key]
        family.add_metric(labels, float(count))  # type: ignore[attr-defined]
    return family


class ComponentCollector(Collector):
    """Each component's own families; one component's bug is counted and must not break the scrape."""

    def __init__(self, components: Sequence[Component], errors: InternalErrors):
        self._components = components
        self._errors = errors

    def collect(self) -> Iterable[Metric]:
        for component in self._components:
            try:
                yield from component.collect()
            except Exception:  # noqa: BLE001 - one component's bug must not break the scrape
                self._errors.count(f"collect:{component.name}")
