"""The demo's live view: what an on-call engineer would look at, drawn from one status snapshot.

:class:`DemoStatus` holds plain values (no arrays, no live objects), gathered by
:func:`monitor.cli.demo.demo_status` from the daemon's published snapshots. Two pure functions draw
it: :func:`render` as a ``rich`` renderable, redrawn in place on a terminal, and
:func:`plain_lines` as text lines, printed once per refresh when stdout is not a terminal (a
pipe, a CI log). Neither reads a clock or the daemon, so both are tested on hand-made snapshots.

Examples
--------
>>> status = DemoStatus(
...     elapsed=75.0, phase="swapped", phase_left=30.0,
...     streams=(StreamView("m", "docs", 9000, 0.81, 74.2, False,
...                         DriftView(True, 1.2e-9, 3.9e-6, ("classifier",), None, None)),),
...     models=(ModelView("m", 0.031, True, 12, None, None),),
...     invalid={}, jobs=JobCounts(runs=120, skipped=0, overran=0),
... )
>>> for line in plain_lines(status):
...     print(line)
[t=75s] phase swapped (30s left) | invalid records 0 | jobs 120 run, 0 skipped, 0 overran
  m/docs: 9000 records, isotropy 0.81, eff. rank 74.2, collapse no | drift YES p=1.2e-09 < 3.9e-06 (classifier)
  m: canary min cos 0.0310 CHANGED (12 mismatches since start) | ANN recall - | nDCG -
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType

    from monitor.retrieval.probes.base import Estimate  # the probes' own: family, model, slice, k, interval


@dataclass(frozen=True)
class RegionView:
    """The region ranked first at the last drift cycle: the largest part of the MMD (the drift explanation)."""

    region: int
    reference_share: float
    window_share: float
    p_adjusted: float
    shifted: bool
    exemplars: tuple[str, ...] = ()  # the window's own ids with the largest MMD witness
    mmd_share: float = 0.0  # its part of the MMD statistic (0: a report from before the ranking)


@dataclass(frozen=True)
class DriftView:
    """The last drift cycle of one (model, stream)."""

    detected: bool
    p_value: float | None  # the suite's: min(1, k * min p)
    threshold: float  # the per-cycle alpha
    tests: tuple[str, ...]  # tests that rejected
    top_region: RegionView | None
    novel_share: float | None


@dataclass(frozen=True)
class StreamView:
    """Intrinsic health and drift of one (model, stream)'s window."""

    model: str
    stream: str
    records: int
    isotropy: float
    effective_rank: float
    collapse: bool
    drift: DriftView | None  # None until the stream has a reference and a tested window
    reference_note: str = ""  # why there is no verdict yet


@dataclass(frozen=True)
class ModelView:
    """What is known per model rather than per stream: canaries and retrieval probes."""

    model: str
    canary_cosine_min: float | None  # over the window; None before a canary was compared with its pin
    canary_changed: bool  # that lowest cosine is below 1 - canaries.tolerance
    canary_mismatches: int  # since start
    ann_recall: Estimate | None
    ndcg: Estimate | None


@dataclass(frozen=True)
class JobCounts:
    """Scheduled job runs since start: skipped (due while the last run was still going) and overran
    (finished after their timeout) should both stay 0."""

    runs: int
    skipped: int
    overran: int


@dataclass(frozen=True)
class IndexView:
    """An index probe's last cycle (monitor/index/): recall against the engine's exact search, the census."""

    probe: str
    recall: float | None  # over all sampled queries
    stale: float | None  # the census's stale share, with its Wilson interval
    stale_lower: float | None
    stale_upper: float | None
    sampled: int  # ids compared
    generations: tuple[float, ...] = ()  # current first


@dataclass(frozen=True)
class DemoStatus:
    """One refresh of the demo's view."""

    elapsed: float
    phase: str
    phase_left: float | None
    streams: tuple[StreamView, ...]
    models: tuple[ModelView, ...]
    invalid: Mapping[str, int]  # reason -> records rejected since start
    jobs: JobCounts
    notes: tuple[str, ...] = field(default=())  # where the metrics and the log are
    index: tuple[IndexView, ...] = field(default=())  # the index probes (the demo's LanceDB index)


# ---------------------------------------------------------------------------------- cells
def _num(value: float | None, digits: int) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _sig(value: float | None) -> str:
    """Three significant digits: isotropy spans orders of magnitude (a catalog of repeats reads 1e-5)."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.3g}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _share(value: float) -> str:
    return f"{100 * value:.0f}%"


def phase_text(status: DemoStatus) -> str:
    left = "" if status.phase_left is None else f" ({status.phase_left:.0f}s left)"
    return f"{status.phase}{left}"


def invalid_text(invalid: Mapping[str, int]) -> str:
    total = sum(invalid.values())
    if not total:
        return "invalid records 0"
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(invalid.items()) if count)
    return f"invalid records {total} ({reasons})"


def jobs_text(jobs: JobCounts) -> str:
    return f"jobs {jobs.runs} run, {jobs.skipped} skipped, {jobs.overran} overran"


def drift_text(view: StreamView) -> str:
    """The verdict, its p-value against the cycle's threshold, and which tests rejected."""
    drift = view.drift
    if drift is None:
        return f"drift - ({view.reference_note})" if view.reference_note else "drift -"
    if drift.detected:
        return f"drift YES p={_p(drift.p_value)} < {drift.threshold:.2g} ({', '.join(drift.tests)})"
    return f"drift no p={_p(drift.p_value)}"


def region_text(drift: DriftView | None) -> str:
    """The region ranked first: "region 3 12%->31% (58% of MMD, p=1e-9)", its exemplars, and the novel share."""
    if drift is None or drift.top_region is None:
        return ""
    top = drift.top_region
    text = f"region {top.region} {_share(top.reference_share)}->{_share(top.window_share)}"
    said = [f"{_share(top.mmd_share)} of MMD"] if top.mmd_share > 0 else []
    said += [f"p={_p(top.p_adjusted)}"] if top.shifted else []
    if said:
        text += f" ({', '.join(said)})"
    if top.exemplars:
        text += " e.g. " + ", ".join(top.exemplars)
    if drift.novel_share is not None and drift.novel_share >= 0.005:
        text += f"; novel {_share(drift.novel_share)}"
    return text


def canary_text(model: ModelView) -> str:
    if model.canary_cosine_min is None:
        return "canary -"
    changed = " CHANGED" if model.canary_changed else ""
    return f"canary min cos {model.canary_cosine_min:.4f}{changed} ({model.canary_mismatches} mismatches since start)"


def estimate_text(name: str, estimate: Estimate | None) -> str:
    if estimate is None:
        return f"{name} -"
    return f"{name}@{estimate.k} {estimate.mean:.3f} [{estimate.lower:.3f}, {estimate.upper:.3f}]"


def index_text(view: IndexView) -> str:
    """ "index demo-index: recall 1.000 | stale 10% [8%, 13%] of 480 ids (generations 90% / 10%) STALE" """
    recall = "-" if view.recall is None else f"{view.recall:.3f}"
    if view.stale is None or not view.sampled:
        return f"index {view.probe}: recall@10 {recall} | stale - (census pending)"
    flag = " STALE" if view.stale_lower is not None and view.stale_lower > 0.01 else ""
    generations = " / ".join(_share(g) for g in view.generations)
    return (f"index {view.probe}: recall@10 {recall} | stale {_share(view.stale)} "
            f"[{_share(view.stale_lower or 0.0)}, {_share(view.stale_upper or 1.0)}] of {view.sampled} ids "
            f"(generations {generations}){flag}")


# ---------------------------------------------------------------------------------- views
def plain_lines(status: DemoStatus) -> list[str]:
    """The view as text lines: a header, one line per (model, stream), one per model."""
    lines = [
        f"[t={status.elapsed:.0f}s] phase {phase_text(status)} | {invalid_text(status.invalid)} | "
        f"{jobs_text(status.jobs)}"
    ]
    for view in status.streams:
        line = (
            f"  {view.model}/{view.stream}: {view.records} records, isotropy {_sig(view.isotropy)}, "
            f"eff. rank {_num(view.effective_rank, 1)}, collapse {'YES' if view.collapse else 'no'} | "
            f"{drift_text(view)}"
        )
        region = region_text(view.drift)
        lines.append(f"{line} | {region}" if region else line)
    for model in status.models:
        lines.append(
            f"  {model.model}: {canary_text(model)} | {estimate_text('ANN recall', model.ann_recall)} | "
            f"{estimate_text('nDCG', model.ndcg)}"
        )
    lines.extend(f"  {index_text(view)}" for view in status.index)
    return lines


def render(status: DemoStatus) -> RenderableType:
    """The view as a ``rich`` renderable: a header, a table per (model, stream), a table per model."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    header = Text.assemble(
        ("embedding-monitor demo", "bold"), f"  t={status.elapsed:.0f}s  phase: ",
        (phase_text(status), "bold cyan"), "  |  ",
        (invalid_text(status.invalid), "red" if sum(status.invalid.values()) else ""), "  |  ",
        (jobs_text(status.jobs), "red" if status.jobs.skipped or status.jobs.overran else "green"),
    )
    streams = Table(title="health and drift per model and stream", title_justify="left", expand=True)
    for column, justify in (("model/stream", "left"), ("records", "right"), ("isotropy", "right"),
                            ("eff. rank", "right"), ("collapse", "center"), ("drift (suite p)", "left"),
                            ("top moved region", "left")):
        streams.add_column(column, justify=justify)  # type: ignore[arg-type]
    for view in status.streams:
        drift = view.drift
        verdict = Text(drift_text(view).removeprefix("drift "),
                       style="bold red" if drift is not None and drift.detected else "green" if drift else "dim")
        streams.add_row(
            f"{view.model}/{view.stream}", str(view.records), _sig(view.isotropy), _num(view.effective_rank, 1),
            Text("YES", style="bold red") if view.collapse else Text("no", style="green"),
            verdict, Text(region_text(drift), style="yellow" if drift is not None and drift.detected else "dim"),
        )
    models = Table(title="canaries and retrieval per model", title_justify="left", expand=True)
    for column in ("model", "canary (lowest cosine to pin)", "ANN recall (95% CI)", "nDCG (95% CI)"):
        models.add_column(column)
    for model in status.models:
        canary = Text(
            canary_text(model).removeprefix("canary "),
            style="bold red" if model.canary_changed else "dim" if model.canary_cosine_min is None else "green",
        )
        models.add_row(model.model, canary, estimate_text("", model.ann_recall).strip(),
                       estimate_text("", model.ndcg).strip())
    indexes = [Text(index_text(view), style="bold red" if "STALE" in index_text(view) else "green")
               for view in status.index]
    notes = [Text(note, style="dim") for note in status.notes]
    return Group(header, streams, models, *indexes, *notes)
