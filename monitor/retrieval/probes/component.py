"""The probes as one daemon component: one scheduled job per probe, outcomes counted, one snapshot.

Each probe runs as its own :class:`~monitor.component.ScheduledJob` (``probe:<name>``) with the
probe's interval and timeout. A run ends in one of three outcomes:

* ``success``: the probe returned a result within its timeout; the result replaces the
  previous one and ``last_success`` is set;
* ``timeout``: the run passed its deadline. The deadline is checked between HTTP requests and
  between k-NN blocks (a request's own timeout is capped by what is left), so a run stops soon
  after it; a run that finishes late anyway is a timeout too. Its partial result is discarded
  and the previous result stays exported;
* ``failure``: the probe raised (endpoint down, garbage response, bad input). The exception is
  re-raised to the daemon, which logs it and counts the job's failure; the previous result stays.

One probe's failure never touches another's: each has its own job, and the ingest hooks of each
probe are guarded separately. ``collect()`` reads the published snapshot only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client.metrics_core import Metric

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.errors import ConfigError
from monitor.logs import RateLimitedLog, each_guarded
from monitor.retrieval.probes.base import Probe, ProbeResult
from monitor.retrieval.probes.deadline import ProbeDeadline, ProbeTimeout
from monitor.retrieval.probes.export import OUTCOMES, ProbeSnapshot, families
from monitor.retrieval.probes.http_retriever import HttpRetriever
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.retrieval.settings import ProbeSettings

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


def build_probes(settings: ProbeSettings, context: MonitorContext) -> list[Probe]:
    """One probe object per configured probe; a probe that cannot be built is a configuration error."""
    from monitor.retrieval.probes.agreement import ReferenceAgreementProbe
    from monitor.retrieval.probes.ann_recall import AnnRecallProbe
    from monitor.retrieval.probes.clicks import ClickFeedbackProbe
    from monitor.retrieval.probes.golden import GoldenSetProbe

    kinds = {
        "golden": GoldenSetProbe,
        "ann_recall": AnnRecallProbe,
        "clicks": ClickFeedbackProbe,
        "agreement": ReferenceAgreementProbe,
    }
    probes: list[Probe] = []
    for spec in settings.all_probes():
        try:
            probes.append(kinds[spec.kind](spec, context, settings))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"probes.{spec.kind} {spec.name!r}: {exc}") from None
    return probes


class ProbeComponent(Component):
    """Schedules every configured retrieval probe and exports what they measured."""

    name = "probes"

    def __init__(self, context: MonitorContext, probes: list[Probe] | None = None):
        self.context = context
        self.probes: dict[str, Probe] = {
            p.name: p for p in (build_probes(context.settings.probes, context) if probes is None else probes)
        }
        started = context.clock()
        self._lock = threading.Lock()  # serialises snapshot replacement (runs of different probes)
        self._snapshot = ProbeSnapshot(
            runs={(name, outcome): 0 for name in self.probes for outcome in OUTCOMES},
            last_success=dict.fromkeys(self.probes, started),
        )
        self._log = RateLimitedLog(logger, interval=60.0)
        # whether a scheduled run of the probe happens in this process (a reducer of a group runs
        # a probe where the window it reads is: monitor/scaleout/export.py)
        self.runs_here: Callable[[str], bool] = lambda name: True

    # ------------------------------------------------------------------ hooks (ingest thread)
    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        each_guarded(self.probes.values(), "on_embeddings", (batch, now), self._log, "probe")

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        each_guarded(self.probes.values(), "on_interaction", (event, now), self._log, "probe")

    # ------------------------------------------------------------------ scheduling
    def jobs(self) -> list[ScheduledJob]:
        return [
            ScheduledJob(f"probe:{p.name}", partial(self._job, p.name), p.interval_seconds, p.timeout_seconds,
                         outbound=True)
            for p in self.probes.values()
        ]

    def _job(self, name: str) -> None:
        if self.runs_here(name):
            self.run_probe(name)

    def run_probe(self, name: str) -> ProbeResult | None:
        """Run one probe now, count its outcome and publish; re-raise a failure (see the module doc)."""
        probe = self.probes[name]
        started = time.perf_counter()
        deadline = ProbeDeadline.starting_now(probe.timeout_seconds)
        result: ProbeResult | None = None
        error: BaseException | None = None
        try:
            result = probe.run(deadline)
            outcome = "success"
        except ProbeTimeout:
            outcome = "timeout"
        except Exception as exc:  # noqa: BLE001 - counted here, re-raised for the daemon's log and count
            outcome, error = "failure", exc
        elapsed = time.perf_counter() - started
        if outcome == "success" and elapsed > probe.timeout_seconds:
            outcome, result = "timeout", None
        if outcome == "timeout":
            logger.warning("probe %s timed out after %.1fs (timeout %.1fs)", name, elapsed, probe.timeout_seconds)
        self._publish(name, outcome, elapsed, result)
        if error is not None:
            raise error
        return result

    def _publish(self, name: str, outcome: str, elapsed: float, result: ProbeResult | None) -> None:
        with self._lock:
            old = self._snapshot
            runs = dict(old.runs)
            runs[(name, outcome)] = runs.get((name, outcome), 0) + 1
            results = dict(old.results)
            last_success = dict(old.last_success)
            if result is not None:
                results[name] = result
                last_success[name] = self.context.clock()
            self._snapshot = ProbeSnapshot(
                results=results, runs=runs, durations={**old.durations, name: elapsed}, last_success=last_success
            )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Run counters, last successes and each probe's buffers and caches (called between batches)."""
        snapshot = self._snapshot
        return {
            "version": _STATE_VERSION,
            "runs": [[name, outcome, count] for (name, outcome), count in snapshot.runs.items()],
            "last_success": dict(snapshot.last_success),
            "probes": {name: probe.state_dict() for name, probe in self.probes.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` saved for the probes still configured (others are ignored)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported probe state version {state.get('version')!r}")
        saved_runs = {
            (str(name), str(outcome)): checks.count(count, f"probe runs of {name} ({outcome})")
            for name, outcome, count in state.get("runs") or []
        }
        saved_last = {
            str(k): checks.finite(v, f"last success of probe {k}", low=0.0)
            for k, v in dict(state.get("last_success") or {}).items()
        }
        empty = {name: probe.state_dict() for name, probe in self.probes.items()}  # nothing restored yet
        try:
            for name, probe_state in dict(state.get("probes") or {}).items():
                if name in self.probes:
                    self.probes[name].load_state_dict(probe_state)
        except Exception:
            for name, probe in self.probes.items():  # all or nothing: the checkpoint says "starts empty"
                probe.load_state_dict(empty[name])
            raise
        with self._lock:
            old = self._snapshot
            runs = dict(old.runs)
            runs.update({key: n for key, n in saved_runs.items() if key in runs})
            last = dict(old.last_success)
            last.update({k: v for k, v in saved_last.items() if k in last})
            self._snapshot = ProbeSnapshot(results=old.results, runs=runs, durations=old.durations, last_success=last)

    # ------------------------------------------------------------------ scrape
    @property
    def snapshot(self) -> ProbeSnapshot:
        return self._snapshot

    def collect(self) -> Iterable[Metric]:
        dropped: Mapping[str, int] = {
            name: count for name, p in self.probes.items() if (count := p.dropped_events) is not None
        }
        request_errors = {name: http.error_counts() for name, p in self.probes.items()
                          if isinstance(http := getattr(p, "http", None), HttpRetriever)}
        return families(self._snapshot, self.probes, dropped, request_errors)

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
