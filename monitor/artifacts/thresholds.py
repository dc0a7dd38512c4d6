"""Overridable thresholds for the generated alerts.

The defaults live with each alert in :mod:`monitor.artifacts.rules` (one module per area); a YAML file overrides any
of them per alert name, plus a few global settings::

    job: embedding-monitor            # the Prometheus `job` label of the monitor's targets
    baseline_window: 7d               # range of the per-model median baseline
    grafana:
      folder: Embedding monitor
      datasource_uid: ${EMBMON_PROMETHEUS_DATASOURCE_UID}
    retrieval_objectives:             # one alert pair per metric: below objective, week-over-week drop
      ndcg: {k: "10", min: 0.5}
    alerts:
      EmbeddingMonitorMeanCosineRising: {threshold: 0.25, for: 1h}
      EmbeddingMonitorMeanCosineAboveAbsolute: {enabled: true}   # opt in to a seed default
      EmbeddingMonitorProbeStale: {severity: info}

Unknown keys and unknown alert names are errors (a typo must not silently keep a default).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from monitor.retrieval.families import PROBE_METRIC_FAMILIES

DURATION = re.compile(r"^([0-9]+)([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
Severity = Literal["critical", "warning", "info"]


def duration_seconds(value: str) -> int:
    """``"30m"`` -> 1800. Only single-unit Prometheus durations are accepted."""
    match = DURATION.match(value)
    if not match:
        raise ValueError(f"invalid duration {value!r}: use a number and one unit of s, m, h, d, w")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _check_duration(value: str | None) -> str | None:
    if value is not None:
        duration_seconds(value)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class AlertOverride(_Strict):
    enabled: bool | None = None
    threshold: float | None = None
    for_: str | None = Field(default=None, alias="for")
    severity: Severity | None = None

    _v_for = field_validator("for_")(_check_duration)


class Objective(_Strict):
    k: str = "10"
    min: float = Field(gt=0, lt=1)


class GrafanaSettings(_Strict):
    folder: str = "Embedding monitor"
    # Grafana expands environment variables in provisioning files (not in annotations)
    datasource_uid: str = "${EMBMON_PROMETHEUS_DATASOURCE_UID}"
    interval: str = "1m"
    org_id: int = 1

    _v_interval = field_validator("interval")(_check_duration)


class Thresholds(_Strict):
    job: str = "embedding-monitor"
    baseline_window: str = "7d"
    grafana: GrafanaSettings = GrafanaSettings()
    retrieval_objectives: dict[str, Objective] = Field(
        default_factory=lambda: {
            "ndcg": Objective(k="10", min=0.5),
            "recall": Objective(k="10", min=0.7),
        }
    )
    alerts: dict[str, AlertOverride] = Field(default_factory=dict)

    _v_window = field_validator("baseline_window")(_check_duration)

    @field_validator("retrieval_objectives")
    @classmethod
    def _known_metrics(cls, value: dict[str, Objective]) -> dict[str, Objective]:
        unknown = sorted(set(value) - set(PROBE_METRIC_FAMILIES))
        if unknown:
            raise ValueError(f"unknown retrieval metrics {unknown}; known: {list(PROBE_METRIC_FAMILIES)}")
        return value

    @field_validator("job")
    @classmethod
    def _plain_job(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.:/-]+", value):
            raise ValueError(f"job {value!r} must be a plain label value")
        return value


def load_thresholds(path: str | Path | None) -> Thresholds:
    """Read a thresholds YAML file (``None``: the defaults); raise ``ValueError`` naming the field."""
    if path is None:
        return Thresholds()
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    try:
        return Thresholds.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from None
