"""Retrieval metric family names, without the engine that computes them.

The ``evaluate`` command's help, the probe settings and the alert and dashboard catalogue need
only the names; importing the engine (:mod:`monitor.retrieval.metrics`) would load numpy. The
engine defines one computation per name, and ``tests/retrieval/test_metrics.py`` keeps the two in
step.
"""

from __future__ import annotations

METRIC_FAMILY_NAMES = (
    "precision",
    "recall",
    "map",
    "mrr",
    "ndcg",
    "err",
    "hit_rate",
    "r_precision",
    "map_hits",
    "recall_capped",
)
"""Every family the engine computes, in the order its messages and ``evaluate --help`` list them."""

PROBE_METRIC_FAMILIES = ("recall", "precision", "map", "mrr", "ndcg", "err", "hit_rate")
"""The families a probe may export, as ``embmon_retrieval_<family>``: the ones alerts and dashboards know."""
