"""Recording rules: per-(model, stream) averages and baselines, invalid-record and probe-failure ratios.

Names follow ``level:metric:operations``. The intrinsic alerts compare each model with its own
past: the median of its own averaged series over ``baseline_window`` (``median7d``), as a ratio or,
for the mean cosine, a difference.
"""

from __future__ import annotations

from typing import Literal

from monitor.artifacts.catalog import m
from monitor.artifacts.rules.model import RecordingRule
from monitor.artifacts.thresholds import Thresholds

# The intrinsic gauges with a recorded average and baseline, and how each is compared with its
# baseline: current / median, current - median, or not at all.
INTRINSIC_BASELINES: dict[str, Literal["ratio", "delta"] | None] = {
    "partition_isotropy": "ratio",
    "effective_dimension_ratio": "ratio",
    "mean_cosine_similarity": "delta",
    "effective_rank": "ratio",
    "top10_variance_ratio": None,
}
# share of rejected records per stream, and of failed or timed-out runs per probe
INVALID_RECORDS_RATIO = "stream:embmon_records_invalid:ratio_rate10m"
PROBE_FAILED_RATIO = "probe:embmon_probe_runs_failed:ratio_rate30m"


def recorded(metric: str, operation: str, level: str = "model_stream") -> str:
    """The name of a recorded series: ``level:metric:operation``.

    >>> recorded("embmon_effective_rank", "median7d")
    'model_stream:embmon_effective_rank:median7d'
    """
    return f"{level}:{metric}:{operation}"


def recording_rules(th: Thresholds) -> tuple[RecordingRule, ...]:
    window = th.baseline_window
    rules: list[RecordingRule] = []
    for name, comparison in INTRINSIC_BASELINES.items():
        metric = m(f"embmon_{name}")
        avg, median = recorded(metric, "avg"), recorded(metric, f"median{window}")
        rules.append(RecordingRule(avg, f"avg by (model, stream) ({metric})"))
        rules.append(RecordingRule(median, f"quantile_over_time(0.5, {avg}[{window}])"))
        if comparison == "delta":
            rules.append(RecordingRule(recorded(metric, f"delta_median{window}"), f"{avg} - {median}"))
        elif comparison == "ratio":
            rules.append(RecordingRule(recorded(metric, f"ratio_median{window}"), f"{avg} / {median}"))
    invalid, valid = m("embmon_records_invalid_total"), m("embmon_records_total")
    rate_invalid = f"sum by (stream) (rate({invalid}[10m]))"
    rate_valid = f"sum by (stream) (rate({valid}[10m]))"
    rules.append(
        RecordingRule(
            INVALID_RECORDS_RATIO,
            # a stream with only invalid records has no valid-record series: count it as 0
            f"{rate_invalid} / ({rate_invalid} + ({rate_valid} or 0 * {rate_invalid}))",
        )
    )
    runs = m("embmon_probe_runs_total")
    rules.append(
        RecordingRule(
            PROBE_FAILED_RATIO,
            f'sum by (probe) (rate({runs}{{outcome!="success"}}[30m])) / sum by (probe) (rate({runs}[30m]))',
        )
    )
    for metric in th.retrieval_objectives:
        name = m(f"embmon_retrieval_{metric}")
        rules.append(
            RecordingRule(
                recorded(name, "avg1h", "probe_model_slice_k"),
                f"avg by (probe, model, slice, k) (avg_over_time({name}[1h]))",
            )
        )
    return tuple(rules)
