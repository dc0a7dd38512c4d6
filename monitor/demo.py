"""``embedding-monitor demo``: the daemon on the synthetic source with scripted incidents.

A newcomer sees the gauges react within a minute: a healthy phase, then one where a few
directions dominate (anisotropic), then a collapse, then a burst of malformed records. The
window is shortened to 30 s so each phase shows fully before the next begins.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from monitor.logs import configure_logging

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.service import Monitor

PHASE_SECONDS = 30.0

DEMO_SETTINGS: dict[str, Any] = {
    "source": "synthetic",
    "synthetic": {
        "models": [{"name": "minilm-demo", "dim": 384}, {"name": "mpnet-demo", "dim": 768}],
        "stream": "documents",
        "rate": 1000.0,
        "batch_size": 100,
        "phases": [
            {"kind": "healthy", "seconds": PHASE_SECONDS},
            {"kind": "anisotropic", "seconds": PHASE_SECONDS},
            {"kind": "collapsed", "seconds": PHASE_SECONDS},
            {"kind": "invalid", "seconds": PHASE_SECONDS / 2},
        ],
        "loop": True,
        # a small search system over a synthetic catalog: served results (5 % ANN misses), clicks
        "interactions": {"rate": 20.0, "catalog_size": 500, "catalog_stream": "catalog", "ann_miss_ratio": 0.05},
    },
    "window": {"seconds": PHASE_SECONDS, "subwindows": 6, "reservoir_size": 2000},
    "refresh_seconds": 2.0,
    # Drift against the first 3,000 records, a test cycle every 10 s; a false alarm every 2 h on
    # average is plenty for a demo and keeps the permutation budget (and CPU) small.
    "drift": {
        "interval_seconds": 10.0,
        "false_alarm_every": "2h",
        "window_sample_size": 1000,
        "reference_sample_size": 1000,
        "threads": 1,
        "reference": {"records": 3000},
    },
    "probes": {
        "statistics": {"resamples": 200},
        "ann_recall": [{"name": "ann", "model": "minilm-demo", "stream": "catalog", "k": [10], "interval_seconds": 5.0}],
        "clicks": [{"name": "clicks", "k": [5, 10], "catalog_stream": "catalog", "interval_seconds": 5.0}],
    },
}


def run_demo(settings: Settings, duration: float | None = None, summary: bool = True) -> int:
    from monitor.service import Monitor

    configure_logging(settings.log_level)
    monitor = Monitor(settings)
    out = sys.stdout

    def started() -> None:
        print(
            f"embedding-monitor demo: metrics at http://127.0.0.1:{monitor.http.port}/metrics "
            f"(phases of {PHASE_SECONDS:.0f}s: healthy -> anisotropic -> collapsed -> invalid input; drift is tested "
            "every 10 s against the first 3,000 records; retrieval probes run on synthetic clicks; Ctrl-C stops)\n"
            f"state directory: {settings.state_dir}",
            file=out,
            flush=True,
        )
        if summary:
            threading.Thread(target=_summaries, args=(monitor, out), name="embmon-demo-summary", daemon=True).start()

    monitor.serve(stop_after=duration, on_started=started)
    return 0


def _summaries(monitor: Monitor, out: TextIO, every: float = 4.0) -> None:
    while not monitor.stopping:
        time.sleep(every)
        if monitor.stopping:
            return
        print(summary_table(monitor), file=out, flush=True)


def summary_table(monitor: Monitor) -> str:
    """A compact view of the gauges an operator watches, one row per (model, stream)."""
    phase = getattr(monitor.source, "current_phase", None)
    invalid = sum(monitor.status.invalid_counts().values())
    head = f"-- phase: {phase.kind if phase else '?'} | invalid records so far: {invalid}"
    rows = [
        head,
        f"{'model':<14}{'stream':<11}{'records':>9}{'isotropy':>10}{'eff.dim':>9}{'mean cos':>10}{'dead':>6}{'collapse':>9}",
    ]
    for (model, stream), entry in sorted(monitor.published.reports.items()):
        r = entry.report
        rows.append(
            f"{model:<14}{stream:<11}{r.window_records:>9}{_f(r.partition_isotropy, 4):>10}{_f(r.effective_dimension_ratio, 3):>9}"
            f"{_f(r.mean_cosine_similarity, 3):>10}{r.dead_dimensions if r.dead_dimensions is not None else '-':>6}"
            f"{'YES' if r.collapse_detected else 'no':>9}"
        )
    return "\n".join(rows)


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
