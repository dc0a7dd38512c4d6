"""Alert and recording-rule definitions: the single source for every generated form.

Each :class:`Alert` is data: a value expression compared with a threshold (``condition``),
optionally gated by a second comparison (``gate``). The Prometheus form is
``<value> <op> <threshold> [and <gate> <op> <threshold>]``; the Grafana form queries the same
expressions (A, and F for the gate), reduces them to their last value (B, G) and compares with
the same thresholds, so the two cannot disagree. Each alert also carries the :class:`Scenario`
its promtool unit test is generated from, written against the alert's (possibly overridden)
thresholds.

Intrinsic-health alerts compare each model with its own past (the median of its own series over
``baseline_window``): absolute values from the literature misfire on real models (all-MiniLM-L6-v2
on real text sits at an effective-dimension ratio near 0.29 and a mean cosine near 0.15). The
absolute "warning signs" are kept as opt-in alerts, disabled by default.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Literal

from monitor.artifacts.catalog import m
from monitor.artifacts.thresholds import Thresholds, duration_seconds

Op = Literal[">", "<"]
ValueFormat = Literal["percent", "number", "count", "duration"]

PREFIX = "EmbeddingMonitor"
RULES_FILE = "embedding-monitor.rules.yaml"
RECORDING_GROUP = "embedding-monitor.recording"
DEFAULT_RUNBOOK = "https://github.com/embedding-monitor/embedding-monitor/blob/main/docs/runbook.md"

# Labels of the synthetic series in the generated unit tests.
TEST_INSTANCE = "monitor-0:9464"
TEST_MODEL = {"model": "minilm", "stream": "queries"}
TEST_PROBE = {"probe": "golden", "model": "minilm", "slice": "all", "k": "10"}


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
    that time (rule labels are added by the generator); ``value`` is ``$value`` then.
    """

    step: int
    firing: tuple[Series, ...]
    quiet: tuple[Series, ...]
    onset: int
    labels: dict[str, str]
    value: float


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
    anchor: str
    scenario_builder: object  # Callable[[Alert], Scenario]
    gate: Condition | None = None
    enabled: bool = True
    # expressions that must return series on a healthy running daemon (live test); default:
    # the condition's and the gate's expressions
    live_signals: tuple[str, ...] = ()

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
        return self.scenario_builder(self)  # type: ignore[operator]


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


# --------------------------------------------------------------------------- formatting


def format_number(value: float) -> str:
    """Shortest exact text for a threshold (``0.5``, ``10000``)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _go_g4(value: float) -> str:
    """Go's ``fmt.Sprintf("%.4g", v)`` for finite values (what Prometheus' humanize uses)."""
    text = f"{value:.4g}"
    # Go writes exponents with at least two digits, as Python does: nothing to adapt
    return text


def humanize(value: float) -> str:
    if value == 0 or math.isnan(value) or math.isinf(value):
        return _go_g4(value)
    prefix = ""
    if abs(value) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(value) < 1000:
                break
            prefix = p
            value /= 1000
        return _go_g4(value) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(value) >= 1:
            break
        prefix = p
        value *= 1000
    return _go_g4(value) + prefix


def humanize_duration(value: float) -> str:
    if abs(value) >= 1:
        seconds = int(value)
        days, hours = seconds // 86400, seconds // 3600 % 24
        minutes, seconds = seconds // 60 % 60, seconds % 60
        if days:
            return f"{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{minutes}m {seconds}s"
        return f"{_go_g4(value)}s"
    raise ValueError("sub-second durations are not used by these alerts")


def format_value(kind: ValueFormat, value: float) -> str:
    if kind == "percent":
        return _go_g4(value * 100) + "%"
    if kind == "number":
        return f"{value:.3f}"
    if kind == "count":
        return humanize(value)
    return humanize_duration(value)


_TEMPLATE_FUNC = {
    "percent": "humanizePercentage",
    "number": 'printf "%.3f"',
    "count": "humanize",
    "duration": "humanizeDuration",
}


def value_template(kind: ValueFormat, ref: str) -> str:
    return "{{ " + ref + " | " + _TEMPLATE_FUNC[kind] + " }}"


def description(alert: Alert, ref: str = "$value") -> str:
    return alert.description.replace("$VALUE", value_template(alert.value_format, ref))


_LABEL_REF = re.compile(r"\{\{ \$labels\.([a-z_]+) \}\}")


def render_description(alert: Alert, labels: dict[str, str], value: float) -> str:
    """What Prometheus renders for ``description`` (used for the expected test annotations)."""
    text = alert.description.replace("$VALUE", format_value(alert.value_format, value))
    return _LABEL_REF.sub(lambda mt: labels.get(mt.group(1), ""), text)


# --------------------------------------------------------------------------- scenarios


def _repeat(value: float, count: int) -> str:
    """``count`` samples of ``value`` in promtool's expanding notation."""
    if count <= 0:
        return ""
    return f"{format_number(value)}x{count - 1}" if count > 1 else format_number(value)


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _base(job: str) -> dict[str, str]:
    return {"job": job, "instance": TEST_INSTANCE}


def _baseline_scenario(metric: str, kind: Literal["drop", "rise"], healthy: float, job: str,
                       gate_metric: str | None = None) -> object:
    def build(alert: Alert) -> Scenario:
        step = 60
        before = max(7200, 2 * alert.for_seconds + 3600) // step  # healthy samples: median stays
        after = alert.for_seconds // step + 2
        thr = alert.condition.threshold
        if kind == "drop":
            bad, mild = healthy * thr / 2, healthy * (1 + thr) / 2
            value = bad / healthy
        else:
            bad, mild = healthy + 2 * thr, healthy + thr / 2
            value = bad - healthy
        labels = {**_base(job), **TEST_MODEL}
        firing = [Series(metric, labels, _seq(_repeat(healthy, before), _repeat(bad, after)))]
        quiet = [Series(metric, labels, _seq(_repeat(healthy, before), _repeat(mild, after)))]
        if gate_metric:
            firing.append(Series(gate_metric, labels, _seq(_repeat(0, before), _repeat(1, after))))
            # the quiet history drops just as far but the daemon's detector never agrees
            quiet = [
                Series(metric, labels, firing[0].values),
                Series(gate_metric, labels, _repeat(0, before + after)),
            ]
        return Scenario(step, tuple(firing), tuple(quiet), before * step, dict(TEST_MODEL), value)

    return build


def _absolute_scenario(metric: str, bad: float, good: float, job: str) -> object:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        labels = {**_base(job), **TEST_MODEL}
        return Scenario(
            60,
            (Series(metric, labels, _repeat(bad, n)),),
            (Series(metric, labels, _repeat(good, n)),),
            0,
            dict(TEST_MODEL),
            bad,
        )

    return build


def _age_scenario(metric: str, extra: dict[str, str], job: str, keep_labels: bool = True) -> object:
    """A timestamp gauge frozen at 0: its age is the evaluation time."""

    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        onset = (int(thr) // 60 + 1) * 60
        fire = onset + alert.for_seconds
        n = fire // 60 + 2
        labels = {**_base(job), **extra}
        return Scenario(
            60,
            (Series(metric, labels, _repeat(0, n)),),
            (Series(metric, labels, f"0+60x{n - 1}"),),
            onset,
            labels if keep_labels else dict(extra),
            float(fire),
        )

    return build


def _const_scenario(metric: str, extra: dict[str, str], bad: float, good: float, job: str,
                    out_labels: dict[str, str] | None = None) -> object:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        labels = {**_base(job), **extra}
        return Scenario(
            60,
            (Series(metric, labels, _repeat(bad, n)),),
            (Series(metric, labels, _repeat(good, n)),),
            0,
            labels if out_labels is None else out_labels,
            bad,
        )

    return build


def _absent_scenario(job: str) -> object:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        return Scenario(
            60,
            (Series("up", {"job": "some-other-job", "instance": "x:1"}, _repeat(1, n)),),
            # a monitor that is scraped but down is EmbeddingMonitorDown's business, not this one's
            (Series("up", _base(job), _repeat(0, n)),),
            0,
            {"job": job},
            1.0,
        )

    return build


def _drift_detected_scenario(job: str) -> object:
    def build(alert: Alert) -> Scenario:
        n = alert.for_seconds // 60 + 2
        labels = {**_base(job), **TEST_MODEL}
        return Scenario(
            60,
            (Series(m("embmon_drift_detected"), {**labels, "test": "suite"}, _repeat(1, n)),),
            (
                # one test alone flagging drift is not the suite's verdict
                Series(m("embmon_drift_detected"), {**labels, "test": "mmd"}, _repeat(1, n)),
                Series(m("embmon_drift_detected"), {**labels, "test": "suite"}, _repeat(0, n)),
            ),
            0,
            dict(TEST_MODEL),
            1.0,
        )

    return build


def _drift_sustained_scenario(job: str) -> object:
    def build(alert: Alert) -> Scenario:
        minutes = alert.for_seconds // 60
        labels = {**_base(job), **TEST_MODEL, "test": "suite"}
        metric = m("embmon_drift_detected")
        return Scenario(
            60,
            (Series(metric, labels, _repeat(1, minutes + 2)),),
            # detected, then cleared well before the `for` boundary
            (Series(metric, labels, _seq(_repeat(1, max(minutes - 120, 1)), _repeat(0, 200))),),
            0,
            dict(TEST_MODEL),
            1.0,
        )

    return build


def _ci_scenario(metric: str, k: str | None, job: str) -> object:
    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        n = alert.for_seconds // 60 + 2
        labels = {**_base(job), **TEST_PROBE, **({"k": k} if k else {})}
        upper_bad = round(thr * 0.8, 6)
        point_bad = round(thr * 0.7, 6)
        upper_noisy = round(thr + (1 - thr) / 2, 6)
        return Scenario(
            60,
            (
                Series(metric, labels, _repeat(point_bad, n)),
                Series(f"{metric}_ci_upper", labels, _repeat(upper_bad, n)),
            ),
            # the point estimate is below the objective, but the interval still reaches above it
            (
                Series(metric, labels, _repeat(point_bad, n)),
                Series(f"{metric}_ci_upper", labels, _repeat(upper_noisy, n)),
            ),
            0,
            labels,
            upper_bad,
        )

    return build


def _week_over_week_scenario(metric: str, job: str) -> object:
    def build(alert: Alert) -> Scenario:
        step = 600 if alert.for_seconds % 600 == 0 else 60
        drop = alert.condition.threshold
        healthy = 0.6
        bad = healthy * (1 - 2 * drop)
        start = (7 * 86400 + 7200) // step  # healthy samples: a week of history and then some
        per_hour = 3600 // step + 1  # samples in a closed 1h range
        onset = start * step + (per_hour // 2) * step  # most of the hour's samples are bad
        after = (onset + alert.for_seconds) // step - start + 2
        labels = {**_base(job), **TEST_PROBE}
        point = Series(metric, labels, _seq(_repeat(healthy, start), _repeat(bad, after)))
        upper = _seq(_repeat(healthy + 0.05, start), _repeat(bad + healthy * drop, after))
        noisy = _seq(_repeat(healthy + 0.05, start), _repeat(healthy + 0.05, after))
        return Scenario(
            step,
            (point, Series(f"{metric}_ci_upper", labels, upper)),
            # the same drop of the point estimate, but the interval still covers last week's value
            (point, Series(f"{metric}_ci_upper", labels, noisy)),
            onset,
            dict(TEST_PROBE),
            1 - bad / healthy,
        )

    return build


def _ratio_counter_scenario(
    bad_metric: str, bad_labels: list[dict[str, str]], good_metric: str, good_labels: dict[str, str],
    out_labels: dict[str, str], job: str,
) -> object:
    """Counters rising at fixed rates: the bad share is 75 % (or 95 % for high thresholds)."""

    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        if thr >= 0.95:
            raise ValueError(f"{alert.name}: threshold {thr} leaves no room for a test scenario")
        bad_rate, good_rate = (3, 1) if thr < 0.75 else (19, 1)
        n = (60 + alert.for_seconds) // 60 + 2
        shares = [bad_rate - (len(bad_labels) - 1)] + [1] * (len(bad_labels) - 1)
        firing = [
            Series(bad_metric, {**_base(job), **labels}, f"0+{share}x{n - 1}")
            for labels, share in zip(bad_labels, shares, strict=True)
        ]
        good = Series(good_metric, {**_base(job), **good_labels}, f"0+{good_rate}x{n - 1}")
        quiet = [Series(s.metric, s.labels, _repeat(0, n)) for s in firing]
        return Scenario(
            60,
            (*firing, good),
            (*quiet, good),
            60,  # rate() needs two samples
            out_labels,
            bad_rate / (bad_rate + good_rate),
        )

    return build


def _lag_scenario(job: str) -> object:
    def build(alert: Alert) -> Scenario:
        thr = alert.condition.threshold
        step_value = thr / 8  # exact in binary: crosses the threshold after the 8th minute
        onset = 9 * 60
        fire = onset + alert.for_seconds
        n = fire // 60 + 2
        labels = {**_base(job), "topic": "embeddings"}
        metric = m("embmon_consumer_lag_records")
        return Scenario(
            60,
            (Series(metric, labels, f"0+{format_number(step_value)}x{n - 1}"),),
            # far above the threshold but shrinking: the consumer is catching up
            (Series(metric, labels, f"{format_number(thr * 4)}-{format_number(step_value)}x{min(n - 1, 31)}"),),
            onset,
            labels,
            step_value * (fire // 60),
        )

    return build


# --------------------------------------------------------------------------- definitions

INTRINSIC_TRACKED = (
    "partition_isotropy",
    "effective_dimension_ratio",
    "mean_cosine_similarity",
    "effective_rank",
    "top10_variance_ratio",
)


def _rec(metric: str, operation: str, level: str = "model_stream") -> str:
    return f"{level}:{metric}:{operation}"


def recording_rules(th: Thresholds) -> tuple[RecordingRule, ...]:
    window = th.baseline_window
    rules: list[RecordingRule] = []
    for name in INTRINSIC_TRACKED:
        metric = m(f"embmon_{name}")
        avg, median = _rec(metric, "avg"), _rec(metric, f"median{window}")
        rules.append(RecordingRule(avg, f"avg by (model, stream) ({metric})"))
        rules.append(RecordingRule(median, f"quantile_over_time(0.5, {avg}[{window}])"))
        if name == "mean_cosine_similarity":
            rules.append(RecordingRule(_rec(metric, f"delta_median{window}"), f"{avg} - {median}"))
        elif name != "top10_variance_ratio":
            rules.append(RecordingRule(_rec(metric, f"ratio_median{window}"), f"{avg} / {median}"))
    invalid, valid = m("embmon_records_invalid_total"), m("embmon_records_total")
    rate_invalid = f"sum by (stream) (rate({invalid}[10m]))"
    rate_valid = f"sum by (stream) (rate({valid}[10m]))"
    rules.append(
        RecordingRule(
            "stream:embmon_records_invalid:ratio_rate10m",
            # a stream with only invalid records has no valid-record series: count it as 0
            f"{rate_invalid} / ({rate_invalid} + ({rate_valid} or 0 * {rate_invalid}))",
        )
    )
    runs = m("embmon_probe_runs_total")
    rules.append(
        RecordingRule(
            "probe:embmon_probe_runs_failed:ratio_rate30m",
            f'sum by (probe) (rate({runs}{{outcome!="success"}}[30m])) / sum by (probe) (rate({runs}[30m]))',
        )
    )
    for metric in th.retrieval_objectives:
        name = m(f"embmon_retrieval_{metric}")
        rules.append(
            RecordingRule(
                _rec(name, "avg1h", "probe_model_slice_k"),
                f"avg by (probe, model, slice, k) (avg_over_time({name}[1h]))",
            )
        )
    return tuple(rules)


def _camel(metric: str) -> str:
    return "".join(part.capitalize() for part in metric.split("_"))


_RETRIEVAL_TITLES = {
    "recall": "Recall",
    "precision": "Precision",
    "map": "MAP",
    "mrr": "MRR",
    "ndcg": "nDCG",
    "err": "ERR",
    "hit_rate": "Hit rate",
}


def default_alerts(th: Thresholds) -> list[Alert]:
    job = th.job
    w = th.baseline_window
    model_stream = "model {{ $labels.model }} on stream {{ $labels.stream }}"
    alerts: list[Alert] = []

    def add(**kwargs: object) -> None:
        name = str(kwargs["name"])
        kwargs.setdefault("anchor", name.lower())
        alerts.append(Alert(**kwargs))  # type: ignore[arg-type]

    # intrinsic health, relative to the model's own baseline
    iso = m("embmon_partition_isotropy")
    add(
        name=f"{PREFIX}IsotropyDegraded",
        group="embedding-monitor.intrinsic",
        severity="warning",
        for_="30m",
        summary="Embedding isotropy fell well below the model's own baseline.",
        description=f"Partition isotropy of {model_stream} is at $VALUE of its {w} median baseline.",
        value_format="percent",
        condition=Condition(_rec(iso, f"ratio_median{w}"), "<", 0.5),
        scenario_builder=_baseline_scenario(iso, "drop", 0.25, job),
    )
    edr = m("embmon_effective_dimension_ratio")
    add(
        name=f"{PREFIX}EffectiveDimensionDropped",
        group="embedding-monitor.intrinsic",
        severity="warning",
        for_="30m",
        summary="The embeddings use far fewer effective dimensions than they usually do.",
        description=f"Effective-dimension ratio of {model_stream} is at $VALUE of its {w} median baseline.",
        value_format="percent",
        condition=Condition(_rec(edr, f"ratio_median{w}"), "<", 0.7),
        scenario_builder=_baseline_scenario(edr, "drop", 0.25, job),
    )
    cos = m("embmon_mean_cosine_similarity")
    add(
        name=f"{PREFIX}MeanCosineRising",
        group="embedding-monitor.intrinsic",
        severity="warning",
        for_="30m",
        summary="Embeddings are becoming more similar to each other than they usually are.",
        description=f"Mean pairwise cosine similarity of {model_stream} is $VALUE above its {w} median baseline.",
        value_format="number",
        condition=Condition(_rec(cos, f"delta_median{w}"), ">", 0.2),
        scenario_builder=_baseline_scenario(cos, "rise", 0.125, job),
    )
    rank = m("embmon_effective_rank")
    collapse = m("embmon_collapse_detected")
    add(
        name=f"{PREFIX}Collapse",
        group="embedding-monitor.intrinsic",
        severity="critical",
        for_="10m",
        summary="The embedding space has collapsed: few dimensions carry the variance.",
        description=(
            f"The daemon flags dimensional collapse for {model_stream}, and its effective rank is "
            f"at $VALUE of its {w} median baseline."
        ),
        value_format="percent",
        condition=Condition(_rec(rank, f"ratio_median{w}"), "<", 0.5),
        gate=Condition(f"max by (model, stream) ({collapse})", ">", 0),
        scenario_builder=_baseline_scenario(rank, "drop", 96.0, job, gate_metric=collapse),
    )
    # the literature's absolute warning signs: opt in per alert
    for name, metric, op, thr, bad, good, text in (
        ("MeanCosineAboveAbsolute", cos, ">", 0.3, 0.5, 0.15,
         "Mean pairwise cosine similarity of {ms} is $VALUE, above the absolute limit."),
        ("EffectiveDimensionBelowAbsolute", edr, "<", 0.2, 0.125, 0.5,
         "Effective-dimension ratio of {ms} is $VALUE, below the absolute floor."),
        ("TopVarianceAboveAbsolute", m("embmon_top10_variance_ratio"), ">", 0.5, 0.75, 0.25,
         "The top 10 principal directions of {ms} explain $VALUE of the variance."),
    ):
        add(
            name=f"{PREFIX}{name}",
            group="embedding-monitor.intrinsic",
            severity="warning",
            for_="1h",
            summary="An intrinsic embedding metric crossed its opt-in absolute threshold.",
            description=text.format(ms=model_stream),
            value_format="number",
            condition=Condition(_rec(metric, "avg"), op, thr),  # type: ignore[arg-type]
            scenario_builder=_absolute_scenario(metric, bad, good, job),
            enabled=False,
        )

    # drift
    detected = m("embmon_drift_detected")
    add(
        name=f"{PREFIX}DriftDetected",
        group="embedding-monitor.drift",
        severity="info",
        for_="15m",
        summary="The drift suite reports that embeddings moved away from the reference window.",
        description=f"The combined drift verdict for {model_stream} is $VALUE (1 = drifted).",
        value_format="count",
        condition=Condition(f'max by (model, stream) ({detected}{{test="suite"}})', ">", 0),
        scenario_builder=_drift_detected_scenario(job),
    )
    add(
        name=f"{PREFIX}DriftSustained",
        group="embedding-monitor.drift",
        severity="warning",
        for_="6h",
        summary="Embeddings have stayed drifted from the reference for hours.",
        description=f"The drift suite has flagged {model_stream} for $VALUE of the last hour, and has kept doing so.",
        value_format="percent",
        condition=Condition(
            f'avg by (model, stream) (avg_over_time({detected}{{test="suite"}}[1h]))', ">", 0.5
        ),
        scenario_builder=_drift_sustained_scenario(job),
    )

    # retrieval quality
    where = "model {{ $labels.model }} (probe {{ $labels.probe }}, slice {{ $labels.slice }}, k={{ $labels.k }})"
    for metric, objective in th.retrieval_objectives.items():
        base = m(f"embmon_retrieval_{metric}")
        upper = m(f"{base}_ci_upper")
        title = _RETRIEVAL_TITLES[metric]
        add(
            name=f"{PREFIX}Retrieval{_camel(metric)}BelowObjective",
            group="embedding-monitor.retrieval",
            severity="critical",
            for_="30m",
            summary=f"{title} is below its objective, beyond the probe's confidence interval.",
            description=(
                f"{title}@k of {where} is below its objective {format_number(objective.min)}: "
                "even the upper bound of its confidence interval is $VALUE."
            ),
            value_format="number",
            condition=Condition(f'{upper}{{k="{objective.k}"}}', "<", objective.min),
            anchor=f"{PREFIX}RetrievalBelowObjective".lower(),
            scenario_builder=_ci_scenario(base, objective.k, job),
            live_signals=(f'{upper}{{k="{objective.k}"}}',),
        )
        avg1h = _rec(base, "avg1h", "probe_model_slice_k")
        add(
            name=f"{PREFIX}Retrieval{_camel(metric)}DroppedWeekOverWeek",
            group="embedding-monitor.retrieval",
            severity="warning",
            for_="1h",
            summary=f"{title} dropped against the same probe a week earlier.",
            description=f"{title} of {where} is $VALUE lower than a week ago, beyond its confidence interval.",
            value_format="percent",
            condition=Condition(f"1 - {avg1h} / {avg1h} offset 1w", ">", 0.1),
            gate=Condition(
                f"max by (probe, model, slice, k) ({upper}) - {avg1h} offset 1w", "<", 0
            ),
            anchor=f"{PREFIX}RetrievalDroppedWeekOverWeek".lower(),
            scenario_builder=_week_over_week_scenario(base, job),
        )
    ann = m("embmon_retrieval_ann_recall")
    add(
        name=f"{PREFIX}AnnRecallBelowTarget",
        group="embedding-monitor.retrieval",
        severity="warning",
        for_="30m",
        summary="The ANN index returns too few of the exact nearest neighbours.",
        description=(
            f"ANN recall of {where} is below target: even the upper bound of its confidence "
            "interval is $VALUE."
        ),
        value_format="number",
        condition=Condition(m(f"{ann}_ci_upper"), "<", 0.9),
        scenario_builder=_ci_scenario(ann, None, job),
    )

    # probes
    runs = m("embmon_probe_runs_total")
    add(
        name=f"{PREFIX}ProbeFailing",
        group="embedding-monitor.probes",
        severity="warning",
        for_="15m",
        summary="A retrieval probe keeps failing or timing out.",
        description="$VALUE of the runs of probe {{ $labels.probe }} failed or timed out over the last 30 minutes.",
        value_format="percent",
        condition=Condition("probe:embmon_probe_runs_failed:ratio_rate30m", ">", 0.5),
        scenario_builder=_ratio_counter_scenario(
            runs,
            [{"probe": "golden", "outcome": "failure"}, {"probe": "golden", "outcome": "timeout"}],
            runs,
            {"probe": "golden", "outcome": "success"},
            {"probe": "golden"},
            job,
        ),
        live_signals=(f"sum by (probe) (rate({runs}[30m]))",),
    )
    add(
        name=f"{PREFIX}ProbeStale",
        group="embedding-monitor.probes",
        severity="warning",
        for_="10m",
        summary="A retrieval probe has not succeeded for too long.",
        description="Probe {{ $labels.probe }} on {{ $labels.instance }} last succeeded $VALUE ago.",
        value_format="duration",
        condition=Condition(f"time() - {m('embmon_probe_last_success_timestamp_seconds')}", ">", 7200),
        scenario_builder=_age_scenario(
            m("embmon_probe_last_success_timestamp_seconds"), {"probe": "golden"}, job
        ),
    )

    # the monitor itself
    add(
        name=f"{PREFIX}Down",
        group="embedding-monitor.self",
        severity="warning",
        for_="10m",
        summary="Prometheus cannot scrape an embedding-monitor instance.",
        description="Scrapes of {{ $labels.instance }} (job {{ $labels.job }}) fail: up is $VALUE.",
        value_format="count",
        condition=Condition(f'up{{job="{job}"}}', "<", 1),
        scenario_builder=_const_scenario("up", {}, 0, 1, job),
    )
    add(
        name=f"{PREFIX}Absent",
        group="embedding-monitor.self",
        severity="critical",
        for_="15m",
        summary="No embedding-monitor target is known to Prometheus: embedding quality is unwatched.",
        description="Prometheus has no scrape target for job {{ $labels.job }} (absent = $VALUE).",
        value_format="count",
        condition=Condition(f'absent(up{{job="{job}"}})', ">", 0),
        scenario_builder=_absent_scenario(job),
        live_signals=(f'up{{job="{job}"}}',),
    )
    add(
        name=f"{PREFIX}MetricsStale",
        group="embedding-monitor.self",
        severity="warning",
        for_="10m",
        summary="The monitor is scraped but its quality metrics are no longer refreshed.",
        description=f"Intrinsic metrics of {model_stream} were last refreshed $VALUE ago.",
        value_format="duration",
        condition=Condition(f"time() - {m('embmon_metrics_last_update_timestamp_seconds')}", ">", 900),
        scenario_builder=_age_scenario(m("embmon_metrics_last_update_timestamp_seconds"), TEST_MODEL, job),
    )
    add(
        name=f"{PREFIX}NoRecentRecords",
        group="embedding-monitor.self",
        severity="warning",
        for_="15m",
        summary="No embeddings have arrived for a model and stream for too long.",
        description=f"The last record of {model_stream} arrived $VALUE ago.",
        value_format="duration",
        condition=Condition(f"time() - {m('embmon_last_record_timestamp_seconds')}", ">", 3600),
        scenario_builder=_age_scenario(m("embmon_last_record_timestamp_seconds"), TEST_MODEL, job),
    )
    add(
        name=f"{PREFIX}SourceDown",
        group="embedding-monitor.self",
        severity="warning",
        for_="10m",
        summary="The monitor cannot read from its source (Kafka, file).",
        description="The source of {{ $labels.instance }} is down (source_up = $VALUE).",
        value_format="count",
        condition=Condition(m("embmon_source_up"), "<", 1),
        scenario_builder=_const_scenario(m("embmon_source_up"), {}, 0, 1, job),
    )
    add(
        name=f"{PREFIX}InvalidRecordsHigh",
        group="embedding-monitor.ingest",
        severity="warning",
        for_="15m",
        summary="A large share of the records on a stream is rejected as invalid.",
        description="$VALUE of the records on stream {{ $labels.stream }} were rejected over the last 10 minutes.",
        value_format="percent",
        condition=Condition("stream:embmon_records_invalid:ratio_rate10m", ">", 0.05),
        scenario_builder=_ratio_counter_scenario(
            m("embmon_records_invalid_total"),
            [{"stream": "queries", "reason": "bad_dimension"}],
            m("embmon_records_total"),
            TEST_MODEL,
            {"stream": "queries"},
            job,
        ),
        live_signals=(f"sum by (stream) (rate({m('embmon_records_total')}[10m]))",),
    )
    lag = m("embmon_consumer_lag_records")
    add(
        name=f"{PREFIX}ConsumerLagGrowing",
        group="embedding-monitor.ingest",
        severity="warning",
        for_="15m",
        summary="The monitor falls further and further behind its Kafka topic.",
        description="Consumer lag of {{ $labels.instance }} on topic {{ $labels.topic }} is $VALUE records and growing.",
        value_format="count",
        condition=Condition(lag, ">", 10000),
        gate=Condition(f"deriv({lag}[15m])", ">", 0),
        scenario_builder=_lag_scenario(job),
    )
    return alerts


def _apply(alert: Alert, th: Thresholds) -> Alert:
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
    return replace(alert, **changes)


def build_rules(th: Thresholds | None = None, runbook_url: str = DEFAULT_RUNBOOK) -> RuleSet:
    """All recording and alerting rules for ``th`` (defaults when ``None``)."""
    th = th or Thresholds()
    defaults = default_alerts(th)
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
