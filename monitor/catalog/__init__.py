"""Every metric the daemon exports, declared once: name, type, HELP text, unit, label names, and the
code that computes the number (``module:qualname``, one hop from a metric to its formula).

The collectors build their families from here (:func:`gauge`, :func:`counter`, :func:`histogram`),
the alert and dashboard generators may only name metrics listed here, and the declaration line
under each heading of docs/metrics.md is generated from it (:mod:`monitor.artifacts.metric_docs`),
so a name, a HELP line or a label set cannot drift between what is scraped, what is alerted on and
what is documented. ``tests/artifacts/test_catalog.py`` scrapes a
daemon with every feature on and fails on any family that is not declared here exactly.

Names are as a scrape shows them: counters end in ``_total`` (prometheus-client appends it to
the family name), histograms are the base name of their ``_bucket``/``_sum``/``_count`` series.

The rows live by area, one module each (``ingest``, ``intrinsic``, ``operations``, ``drift``,
``retrieval``, ``canary``, ``serving``, ``scale_out``, ``index``), all in one style:
``MetricSpec(name, kind, help, labels=..., unit=..., code=...)``. Where several implementations
compute one metric (the record sources' ``up``), ``code`` names the shared contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from monitor.catalog import canary, drift, index, ingest, intrinsic, operations, retrieval, scale_out, serving
from monitor.catalog.metric_spec import MS, PROBE_ESTIMATE_LABELS, Area, Kind, MetricSpec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

__all__ = ["CATALOG", "MS", "PROBE_ESTIMATE_LABELS", "RETRIEVAL_ESTIMATES", "Area", "Kind", "MetricSpec", "counter",
           "gauge", "histogram", "info", "spec"]

_AREAS = (ingest, intrinsic, operations, drift, retrieval, scale_out, index, canary, serving)


def _spec_rows() -> Iterable[MetricSpec]:
    for module in _AREAS:
        for row in module.METRICS:
            yield replace(row, area=module.AREA)


def _build() -> dict[str, MetricSpec]:
    specs: dict[str, MetricSpec] = {}
    for spec in _spec_rows():
        if spec.name in specs:
            raise ValueError(f"metric {spec.name} is declared twice")
        specs[spec.name] = spec
    return specs


CATALOG: dict[str, MetricSpec] = _build()


def spec(name: str) -> MetricSpec:
    """The declaration of ``name``; a name nobody declared is a bug caught at first use."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not declared in monitor/catalog.py") from None


def gauge(name: str) -> GaugeMetricFamily:
    from prometheus_client.metrics_core import GaugeMetricFamily

    s = _of_kind(name, "gauge")
    return GaugeMetricFamily(s.family, s.help, labels=list(s.labels))


def counter(name: str) -> CounterMetricFamily:
    from prometheus_client.metrics_core import CounterMetricFamily

    s = _of_kind(name, "counter")
    return CounterMetricFamily(s.family, s.help, labels=list(s.labels))


def info(name: str, value: dict[str, str]) -> InfoMetricFamily:
    from prometheus_client.metrics_core import InfoMetricFamily

    s = _of_kind(name, "info")
    return InfoMetricFamily(s.family, s.help, value=value)


def histogram(name: str, registry: CollectorRegistry, buckets: Sequence[float]) -> Histogram:
    """A live histogram (observed by the daemon) registered on ``registry``."""
    from prometheus_client import Histogram

    s = _of_kind(name, "histogram")
    return Histogram(s.name, s.help, list(s.labels), buckets=buckets, registry=registry)


def _of_kind(name: str, kind: Kind) -> MetricSpec:
    s = spec(name)
    if s.kind != kind:
        raise TypeError(f"metric {name} is declared as a {s.kind}, not a {kind}")
    return s


# the HELP text of each retrieval estimate, by its short name (embmon_retrieval_<short>)
RETRIEVAL_ESTIMATES = {short: spec(f"embmon_retrieval_{short}").help for short in retrieval.ESTIMATES}
