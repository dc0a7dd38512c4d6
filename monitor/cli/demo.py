"""``embedding-monitor demo``: the daemon on the synthetic source, with incidents an on-call engineer meets.

The script (:data:`PHASES`, looped): a healthy stream; a **silent model swap** (the new model's
space is a rotated copy of the old one, so every intrinsic metric reads as before and only the
canaries and the drift tests can tell); healthy again; a **topic shift** (30 % of the traffic
from a topic the reference never had, which the drift explanation names: its top region and the
window's own ``topic-N`` ids); a collapse (what the intrinsic metrics catch); malformed input.
Beside the script, an **index incident** (:mod:`monitor.index.demo`, when LanceDB is installed):
the demo's indexer writes the catalog into an embedded LanceDB table, and during the second healthy
phase re-indexes a tenth of it with another model's vectors; the index probe's census reads the
stale share rise to about 10 % and fall back after the backfill.

The serving probe calls the demo's own embedding endpoint (``served-demo``: a toy model in this
process, :mod:`monitor.serving.demo_server`) every 5 s; during the swap phase that endpoint also
**starts lower-casing its input** (a serving bug), which its canaries and case check catch.

The terminal shows one live view (:mod:`monitor.cli.demo_view`), redrawn in place, read from the
daemon's published snapshots (never from its log); when stdout is not a terminal it prints the
view's plain lines once per refresh instead. The log goes to a file whose path is printed, or to
stderr with ``--verbose``. The state directory is a fresh temporary one (``cmd_demo``).

Sizing (``bench/demo_sizing.py`` on 2 shared cores; docs/drift.md, "In the daemon"): at 500
records/s per model, a 30 s window, a refresh every 2 s and a drift cycle every 10 s over 4
streams, a cycle takes at most a quarter of its interval and a refresh about half of its own, so
no scheduled job is skipped or overruns; the demo uses about half a core.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from monitor.cli.demo_view import DemoStatus, DriftView, IndexView, JobCounts, ModelView, RegionView, StreamView
from monitor.logs import configure_logging

if TYPE_CHECKING:
    from monitor.canary.component import CanaryComponent
    from monitor.config import Settings
    from monitor.daemon.lifecycle import StopRequest
    from monitor.daemon.service import Monitor
    from monitor.drift.export import CycleResult, DriftSnapshot
    from monitor.retrieval.probes.base import Estimate
    from monitor.retrieval.probes.component import ProbeComponent
    from monitor.serving.demo_server import DemoEmbeddingServer

MODELS = (("minilm-demo", 384), ("mpnet-demo", 768))
SERVED = "served-demo"  # the model label of the demo's embedding endpoint (the serving probe)
SERVING_INCIDENT_PHASE = "swapped"  # while it lasts, the endpoint lower-cases its input
CANARIES = 4
# (kind, seconds): long enough for the 30 s window to turn over, so each incident shows fully
PHASES = (
    ("healthy", 60.0),
    ("swapped", 45.0),
    ("healthy", 45.0),
    ("topic_shift", 45.0),
    ("collapsed", 30.0),
    ("invalid", 15.0),
)
EXEMPLARS_SHOWN = 2
logger = logging.getLogger(__name__)

DEMO_SETTINGS: dict[str, Any] = {
    "source": "synthetic",
    "synthetic": {
        "models": [{"name": name, "dim": dim} for name, dim in MODELS],
        "stream": "documents",
        "rate": 500.0,
        "batch_size": 100,
        "ids": True,  # JSON events with ids: the drift explanation names the records that moved
        "canaries": CANARIES,
        "canary_period_seconds": 5.0,
        "phases": [{"kind": kind, "seconds": seconds} for kind, seconds in PHASES],
        "loop": True,
        # a small search system over a synthetic catalog: served results (5 % ANN misses), clicks
        "interactions": {"rate": 20.0, "catalog_size": 500, "catalog_stream": "catalog", "ann_miss_ratio": 0.05},
    },
    "canaries": {"ids": {name: [f"canary-{i}" for i in range(CANARIES)] for name, _ in MODELS}},
    "window": {"seconds": 30.0, "subwindows": 6, "reservoir_size": 2000},
    "refresh_seconds": 2.0,
    # Drift against each stream's first 3,000 records, a cycle every 10 s. The default false-alarm
    # budget (one a month per stream) keeps healthy phases silent; its small per-test alpha is
    # reached by the held-out and analytic nulls, without permutations.
    "drift": {
        "interval_seconds": 10.0,
        "false_alarm_every": "30d",
        "window_sample_size": 1000,
        "reference_sample_size": 1000,
        "threads": 1,
        "reference": {"records": 3000},
    },
    "probes": {
        "statistics": {"resamples": 200},
        "ann_recall": [
            {"name": "ann", "model": "minilm-demo", "stream": "catalog", "k": [10], "interval_seconds": 5.0}
        ],
        "clicks": [{"name": "clicks", "k": [5, 10], "catalog_stream": "catalog", "interval_seconds": 5.0}],
    },
}


def script_text(settings: Settings) -> str:
    """The scripted phases, as the start-up banner says them."""
    phases = " -> ".join(f"{p.kind} {p.seconds:.0f}s" for p in settings.synthetic.phases)
    return phases + (" (looped)" if settings.synthetic.loop else "")


def run_demo(
    settings: Settings,
    duration: float | None = None,
    view: bool = True,
    verbose: bool = False,
    log_file: Path | None = None,
    out: TextIO | None = None,
    stop_request: StopRequest | None = None,
) -> int:
    """Serve the demo until Ctrl-C or ``duration``; the live view on ``out`` (stdout), the log in a file.

    ``stop_request``: one the caller's signal handlers already set (the CLI's, while this is built)."""
    from monitor.daemon.service import Monitor

    out = out or sys.stdout
    if verbose:
        log_file = None
    elif log_file is None:
        handle, name = tempfile.mkstemp(prefix="embmon-demo-", suffix=".log")
        os.close(handle)
        log_file = Path(name)
    configure_logging(settings.log_level, None if verbose else log_file)
    endpoint = _serve_demo_endpoint(settings)
    settings, factories = with_index_incident(settings)
    monitor = Monitor(settings, component_factories=factories, stop_request=stop_request)
    if endpoint is not None:
        endpoint.lowercase = lambda: getattr(getattr(monitor.source, "current_phase", None), "kind", None) \
            == SERVING_INCIDENT_PHASE
    stop_view = threading.Event()
    viewer: list[threading.Thread] = []

    def started() -> None:
        port = monitor.http.port
        print(
            f"embedding-monitor demo: metrics at http://127.0.0.1:{port}/metrics; Ctrl-C stops\n"
            f"script: {script_text(settings)}\n"
            f"drift every {settings.drift.interval_seconds:g}s against each stream's first "
            f"{settings.drift.reference.records} records; "
            f"canaries every {settings.synthetic.canary_period_seconds:g}s"
            + (f"; the serving probe calls {SERVED} every {settings.serving.interval_seconds:g}s (it lower-cases "
               f"its input while {SERVING_INCIDENT_PHASE})" if endpoint is not None else "") + "\n"
            f"state directory: {settings.state_dir}\n"
            f"log: {log_file if log_file is not None else 'stderr'}",
            file=out,
            flush=True,
        )
        if view:
            notes = (f"metrics: http://127.0.0.1:{port}/metrics", f"log: {log_file or 'stderr (--verbose)'}")
            thread = threading.Thread(
                target=_show, args=(monitor, out, stop_view, notes), name="embmon-demo-view", daemon=True
            )
            thread.start()
            viewer.append(thread)

    try:
        monitor.serve(stop_after=duration, on_started=started)
    finally:
        stop_view.set()
        for thread in viewer:
            thread.join(timeout=5.0)
        if endpoint is not None:
            endpoint.stop()
    if log_file is not None:
        print(f"embedding-monitor demo stopped; its log is in {log_file}", file=out, flush=True)
    return 0


def with_index_incident(settings: Settings) -> tuple[Settings, list[Any] | None]:
    """The demo's index incident (monitor/index/demo.py) on an embedded LanceDB table in the state
    directory, when LanceDB is installed (``scripts/setup demo`` installs it) and the settings
    configure no index probe of their own: the settings with its probe, and the component factories
    with its indexer. Otherwise the settings as they are (and the daemon's own factories)."""
    from monitor.extras import installed

    interactions = settings.synthetic.interactions
    if (settings.source != "synthetic" or interactions is None or settings.index.enabled
            or not installed("lancedb") or not settings.synthetic.models):
        return settings, None
    from monitor.daemon.features import default_component_factories
    from monitor.index import demo
    from monitor.index.settings import IndexSettings

    model = settings.synthetic.models[0]
    probe = demo.probe_settings(Path(settings.state_dir), model.name, interactions.catalog_stream)
    settings = settings.model_copy(update={"index": IndexSettings.model_validate({"probes": [probe]})})
    # the incident is timed against the default script (its second healthy phase); another script
    # (a config of its own, the tests' healthy runs) gets the index probe without the incident
    scripted = [(p.kind, p.seconds) for p in settings.synthetic.phases] == list(PHASES)
    period = sum(seconds for _, seconds in PHASES) if scripted and settings.synthetic.loop else 0.0

    def indexer(context: Any) -> Any:
        return demo.DemoIndexer(context, model.name, interactions.catalog_stream, model.dim, period)

    return settings, [indexer, *default_component_factories(settings)]


def _serve_demo_endpoint(settings: Settings) -> DemoEmbeddingServer | None:
    """Start the demo's embedding endpoint and point the serving probe at it, unless the settings
    already name endpoints of their own."""
    if settings.serving.enabled:
        return None
    from monitor.serving.demo_server import DemoEmbeddingServer
    from monitor.serving.settings import ServingSettings

    server = DemoEmbeddingServer().start()
    settings.serving = ServingSettings.model_validate({
        **settings.serving.model_dump(exclude={"endpoints", "interval_seconds"}),
        "endpoints": [{"model": SERVED, "url": server.url, "dim": 384}], "interval_seconds": 5.0,
    })
    return server


def _show(monitor: Monitor, out: TextIO, stop: threading.Event, notes: tuple[str, ...]) -> None:
    """Redraw the live view in place on a terminal; elsewhere print plain lines once per refresh."""
    def status() -> DemoStatus | None:
        try:
            return demo_status(monitor, notes)
        except Exception:  # the view must outlive one bad read; the log says why
            logger.exception("demo: could not read the daemon's status for the view")
            return None

    if out.isatty():
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:
            print("the live view needs rich (scripts/setup demo, or pip install 'embedding-monitor[demo]'); "
                  "printing plain lines instead", file=out, flush=True)
        else:
            from monitor.cli.demo_view import render

            # with --verbose, log lines go through rich's stderr proxy: printed above the view, not into it
            with (
                Live(console=Console(file=out), refresh_per_second=2) as live,
                _stderr_logs_to(sys.stderr),
            ):
                while True:
                    if (now := status()) is not None:
                        live.update(render(now))
                    if stop.wait(1.0):
                        return
    from monitor.cli.demo_view import plain_lines

    shown_refresh: float | None = None
    while not stop.wait(0.25):
        computed_at = monitor.status.published.computed_at
        if computed_at is None or computed_at == shown_refresh:
            continue
        shown_refresh = computed_at
        if (now := status()) is not None:
            print("\n".join(plain_lines(now)), file=out, flush=True)


@contextlib.contextmanager
def _stderr_logs_to(stream: TextIO) -> Iterator[None]:
    """Point the log handlers that write to stderr at ``stream`` for a while (file handlers stay)."""
    handlers = [
        h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler and h.stream is sys.__stderr__
    ]
    previous = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for handler, old in zip(handlers, previous, strict=True):
            handler.setStream(old)


# ---------------------------------------------------------------------------------- the snapshot
def demo_status(monitor: Monitor, notes: tuple[str, ...] = ()) -> DemoStatus:
    """The view's inputs, read from the daemon's published snapshots and counters."""
    from monitor.canary.component import CanaryComponent
    from monitor.drift.component import DriftComponent
    from monitor.retrieval.probes.component import ProbeComponent

    status = monitor.status
    drift = _component(monitor, DriftComponent)
    snapshot = drift.snapshot() if drift is not None else None
    streams = tuple(
        _stream_view(model, stream, entry.report, snapshot)
        for (model, stream), entry in sorted(status.published.reports.items())
    )
    canary = _component(monitor, CanaryComponent)
    probes = _component(monitor, ProbeComponent)
    served = {e.model for e in monitor.settings.serving.endpoints}
    models = tuple(_model_view(model, canary, probes) for model in sorted({s.model for s in streams} | served))
    invalid: dict[str, int] = {}
    for (_, reason), count in status.invalid_counts().items():
        invalid[reason] = invalid.get(reason, 0) + count
    runs = status.job_run_counts()
    jobs = JobCounts(
        runs=sum(n for (_, outcome), n in runs.items() if outcome != "skipped"),
        skipped=sum(n for (_, outcome), n in runs.items() if outcome == "skipped"),
        overran=sum(n for (_, outcome), n in runs.items() if outcome == "timeout"),
    )
    source = monitor.source
    phase_left = getattr(source, "phase_left", None)
    current = getattr(source, "current_phase", None)
    elapsed = getattr(source, "elapsed", None)
    return DemoStatus(
        elapsed=float(elapsed) if elapsed is not None else status.wall_clock() - status.started_at,
        phase=current.kind if current is not None else "-",
        phase_left=phase_left() if phase_left is not None else None,
        streams=streams, models=models, invalid=invalid, jobs=jobs, notes=notes, index=_index_views(monitor),
    )


def _index_views(monitor: Monitor) -> tuple[IndexView, ...]:
    """The index probes' last cycles (the demo's LanceDB index), from their published snapshot."""
    from monitor.index.component import IndexComponent

    component = _component(monitor, IndexComponent)
    if component is None:
        return ()
    views = []
    for name in component.probes:
        result = component.snapshot.results.get(name)
        row = result.recall.row() if result is not None else None
        census = result.census if result is not None else None
        sampled = census.sampled if census is not None else 0
        views.append(IndexView(
            probe=name, recall=row.recall.mean if row is not None else None,
            stale=census.stale.mean if sampled and census is not None else None,
            stale_lower=census.stale.lower if census is not None else None,
            stale_upper=census.stale.upper if census is not None else None,
            sampled=sampled, generations=census.generation_shares if census is not None else (),
        ))
    return tuple(views)


def _component(monitor: Monitor, kind: type[Any]) -> Any:
    return next((c for c in monitor.components if isinstance(c, kind)), None)


def _stream_view(model: str, stream: str, report: Any, snapshot: DriftSnapshot | None) -> StreamView:
    key = (model, stream)
    cycle = None if snapshot is None else snapshot.results.get(key)
    note = ""
    if snapshot is None:
        note = "drift off"
    elif cycle is None:
        note = "first cycle pending" if key in snapshot.references else "capturing its reference"
    return StreamView(
        model=model, stream=stream, records=report.window_records, isotropy=report.partition_isotropy,
        effective_rank=report.effective_rank, collapse=bool(report.collapse_detected),
        drift=None if cycle is None else drift_view(model, stream, cycle), reference_note=note,
    )


def drift_view(model: str, stream: str, cycle: CycleResult) -> DriftView:
    """The verdict of the last cycle and its top moved region, as ``drift explain`` says them."""
    from monitor.drift.attribution.explain import explanation
    from monitor.drift.export import suite_p_value

    said = explanation(model, stream, cycle)
    regions = said["regions"]
    top = None
    novel = None
    if regions is not None:
        novel = float(regions["novel_share"])
        ranked = regions["ranked"]
        if ranked and (ranked[0]["shifted"] or said["detected"]):
            first = ranked[0]
            top = RegionView(
                region=int(first["region"]), reference_share=float(first["reference_share"]),
                window_share=float(first["window_share"]), p_adjusted=float(first["p_adjusted"]),
                shifted=bool(first["shifted"]), exemplars=tuple(first["window_exemplars"][:EXEMPLARS_SHOWN]),
                mmd_share=float(first.get("mmd_share", 0.0)),
            )
    return DriftView(
        detected=bool(said["detected"]), p_value=suite_p_value(cycle.report), threshold=float(said["cycle_alpha"]),
        tests=tuple(said["detected_tests"]), top_region=top, novel_share=novel,
    )


def _model_view(model: str, canary: CanaryComponent | None, probes: ProbeComponent | None) -> ModelView:
    cosine = changed = None
    mismatches = 0
    if canary is not None:
        snap = canary.snapshot
        cosine = snap.cosine_min.get(model)
        changed = cosine is not None and cosine < 1.0 - canary.settings.tolerance
        mismatches = snap.mismatches.get(model, 0)
    ann = ndcg = None
    if probes is not None:
        ann = _estimate(probes, "ann_recall", model)
        ndcg = _estimate(probes, "ndcg", model)
    return ModelView(model, cosine, bool(changed), mismatches, ann, ndcg)


def _estimate(probes: ProbeComponent, family: str, model: str) -> Estimate | None:
    """The probes' estimate of ``family`` for ``model`` over all queries, at the largest k."""
    from monitor.retrieval.probes.base import ALL

    found = [
        e for result in probes.snapshot.results.values() for e in result.estimates
        if e.family == family and e.model == model and e.slice == ALL
    ]
    if not found:
        return None
    best = max(found, key=lambda e: e.k)
    return best
