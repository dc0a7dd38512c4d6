"""The rule model: alerts and recording rules as data, which every generated form reads.

Each :class:`Alert` is a value expression compared with a threshold (``condition``), optionally
gated by a second comparison (``gate``). The Prometheus form is
``<value> <op> <threshold> [and <gate> <op> <threshold>]``; the Grafana form queries the same
expressions (A, and F for the gate), reduces them to their last value (B, G) and compares with
the same thresholds, so the two cannot disagree. Each alert also carries the builder of the
:class:`Scenario` its promtool unit test is generated from, written against the alert's (possibly
overridden) thresholds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from monitor.artifacts.rules.values import ValueFormat, format_number, format_value, value_template
from monitor.artifacts.thresholds import Thresholds, duration_seconds

Op = Literal[">", "<"]

PREFIX = "EmbeddingMonitor"
RULES_FILE = "embedding-monitor.rules.yaml"
RECORDING_GROUP = "embedding-monitor.recording"
DEFAULT_RUNBOOK = "https://github.com/embedding-monitor/embedding-monitor/blob/main/docs/runbook.md"

# how descriptions name the series of an intrinsic or drift alert
MODEL_STREAM = "model {{ $labels.model }} on stream {{ $labels.stream }}"


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str


@dataclass(frozen=True)
class Condition:
    expr: str
    op: Op
    threshold: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", float(self.threshold))

    def promql(self) -> str:
        return f"{self.expr} {self.op} {format_number(self.threshold)}"


@dataclass(frozen=True)
class Series:
    """One input series of a promtool test: selector and expanding notation."""

    metric: str
    labels: dict[str, str]
    values: str

    def selector(self) -> str:
        inner = ", ".join(f'{k}="{v}"' for k, v in self.labels.items())
        return f"{self.metric}{{{inner}}}"


@dataclass(frozen=True)
class Scenario:
    """A firing history and a similar history that must stay quiet.

    ``onset`` is the first evaluation (seconds) at which the expression is true; the alert is
    pending from then and fires at ``onset + for``. ``labels`` are the alert's series labels at
    that time (rule labels are added by the generator); ``value`` is ``$value`` then. When the
    firing history goes on to clear the condition, ``resolves_at`` is an evaluation (seconds)
    from which the alert must be quiet again. ``scaled`` is, where given, the firing history as
    several instances export it (a scaled-out deployment): it must fire exactly as ``firing``
    does, one alert with the same labels, not one per instance.
    """

    step: int
    firing: tuple[Series, ...]
    quiet: tuple[Series, ...]
    onset: int
    labels: dict[str, str]
    value: float
    resolves_at: int | None = None
    scaled: tuple[Series, ...] = ()


ScenarioBuilder = Callable[["Alert"], Scenario]


@dataclass(frozen=True)
class Alert:
    name: str
    group: str
    severity: Literal["critical", "warning", "info"]
    for_: str
    summary: str
    # `$VALUE` is replaced by the form's value reference, formatted with `value_format`
    description: str
    value_format: ValueFormat
    condition: Condition
    scenario_builder: ScenarioBuilder
    gate: Condition | None = None
    # the runbook section (docs/runbook.md); default: the lower-cased name
    anchor: str = ""
    enabled: bool = True
    # expressions that must return series on a healthy running daemon (live test); default:
    # the condition's and the gate's expressions
    live_signals: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.anchor:
            object.__setattr__(self, "anchor", self.name.lower())

    @property
    def for_seconds(self) -> int:
        return duration_seconds(self.for_)

    def promql(self) -> str:
        expr = self.condition.promql()
        if self.gate is not None:
            expr += f" and {self.gate.promql()}"
        return expr

    def signals(self) -> tuple[str, ...]:
        if self.live_signals:
            return self.live_signals
        gate = (self.gate.expr,) if self.gate else ()
        return (self.condition.expr, *gate)

    def scenario(self) -> Scenario:
        return self.scenario_builder(self)


@dataclass(frozen=True)
class RuleSet:
    recording: tuple[RecordingRule, ...]
    alerts: tuple[Alert, ...]  # enabled ones only
    groups: tuple[str, ...]
    thresholds: Thresholds
    runbook_url: str = DEFAULT_RUNBOOK
    all_alerts: tuple[Alert, ...] = field(default=())

    def runbook_link(self, alert: Alert) -> str:
        return f"{self.runbook_url}#{alert.anchor}"


def description(alert: Alert, ref: str = "$value") -> str:
    """The ``description`` annotation, showing the value through ``ref`` (Prometheus or Grafana)."""
    return alert.description.replace("$VALUE", value_template(alert.value_format, ref))


_LABEL_REF = re.compile(r"\{\{ \$labels\.([a-z_]+) \}\}")


def render_description(alert: Alert, labels: dict[str, str], value: float) -> str:
    """What Prometheus renders for ``description`` (used for the expected test annotations)."""
    text = alert.description.replace("$VALUE", format_value(alert.value_format, value))
    return _LABEL_REF.sub(lambda mt: labels.get(mt.group(1), ""), text)
