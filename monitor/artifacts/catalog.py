"""The metric names the alerts and dashboards may use: those :mod:`monitor.catalog` declares.

Every PromQL expression in :mod:`monitor.artifacts` names metrics through :func:`m`, which refuses
a name the daemon's catalog does not declare, so a rename is one edit in ``monitor/catalog.py``
and ``tests/artifacts/test_alerts.py`` checks that every ``embmon_*`` name in the generated artifacts is
declared there. The daemon-side check (every declared name is really exported) needs a running
daemon: :func:`exported_names` gives the series names a scrape shows.
"""

from __future__ import annotations

import re

from monitor.catalog import CATALOG, MetricSpec

METRICS: dict[str, MetricSpec] = CATALOG

# how alerts and dashboards name each retrieval metric family
RETRIEVAL_TITLES = {
    "recall": "Recall",
    "precision": "Precision",
    "map": "MAP",
    "mrr": "MRR",
    "ndcg": "nDCG",
    "err": "ERR",
    "hit_rate": "Hit rate",
}


# a histogram shows as its _bucket, _sum and _count series
_SERIES = frozenset(series for spec in METRICS.values() for series in spec.series())


def m(name: str) -> str:
    """Return ``name`` if a scrape of the daemon shows it, else raise."""
    if name in _SERIES:
        return name
    raise ValueError(f"unknown metric {name!r}: declare it in monitor/catalog.py first")


def exported_names() -> set[str]:
    """Series names a scrape of the daemon shows for the declared metrics."""
    return set(_SERIES)


_NAME = re.compile(r"(?<![A-Za-z0-9_:])(embmon_[A-Za-z0-9_]+)")


def referenced_metrics(expr: str) -> set[str]:
    """``embmon_*`` metric names in a PromQL expression (recording-rule names excluded)."""
    # the look-behind skips the middle of a recorded series name `level:embmon_x:operations`
    return {match.group(1) for match in _NAME.finditer(expr)}
