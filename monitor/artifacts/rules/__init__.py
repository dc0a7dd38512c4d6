"""Alert and recording rules: the single source for every generated form.

One module per alert area, each with its alerts and the scenarios their promtool tests are
generated from: :mod:`.intrinsic`, :mod:`.drift`, :mod:`.canary` (a changed model),
:mod:`.retrieval` (quality and probes), :mod:`.index` (the vector store: its recall, stale vectors),
:mod:`.operations` (the monitor itself and its ingest), :mod:`.scaleout` (replicas and the
reducer), :mod:`.serving` (the embedding endpoint). A new alert goes into the module of its
area; :func:`build_rules` collects them in that order. The shared pieces: :mod:`.model` (the
dataclasses), :mod:`.recording` (recording rules), :mod:`.scenarios` (test-history helpers),
:mod:`.values` (numbers as Prometheus shows them).
"""

from __future__ import annotations

from dataclasses import replace

from monitor.artifacts.rules import canary, drift, index, intrinsic, operations, retrieval, scaleout, serving
from monitor.artifacts.rules.model import DEFAULT_RUNBOOK, Alert, RuleSet
from monitor.artifacts.rules.recording import recording_rules
from monitor.artifacts.thresholds import Thresholds

AREAS = (intrinsic, drift, canary, retrieval, index, operations, scaleout, serving)


def build_rules(th: Thresholds | None = None, runbook_url: str = DEFAULT_RUNBOOK) -> RuleSet:
    """All recording and alerting rules for ``th`` (defaults when ``None``)."""
    th = th or Thresholds()
    defaults = [alert for area in AREAS for alert in area.alerts(th)]
    names = [a.name for a in defaults]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate alert names in {names}")
    unknown = sorted(set(th.alerts) - set(names))
    if unknown:
        raise ValueError(f"thresholds name unknown alerts {unknown}; known: {sorted(names)}")
    every = tuple(_apply(a, th) for a in defaults)
    enabled = tuple(a for a in every if a.enabled)
    groups = tuple(dict.fromkeys(a.group for a in enabled))
    return RuleSet(recording_rules(th), enabled, groups, th, runbook_url, every)


def _apply(alert: Alert, th: Thresholds) -> Alert:
    """``alert`` with the overrides ``th`` gives for it (enabled, threshold, for, severity)."""
    override = th.alerts.get(alert.name)
    if override is None:
        return alert
    changes: dict[str, object] = {}
    if override.enabled is not None:
        changes["enabled"] = override.enabled
    if override.threshold is not None:
        changes["condition"] = replace(alert.condition, threshold=override.threshold)
    if override.for_ is not None:
        changes["for_"] = override.for_
    if override.severity is not None:
        changes["severity"] = override.severity
    return replace(alert, **changes)  # type: ignore[arg-type]


__all__ = ["build_rules"]
