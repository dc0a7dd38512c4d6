"""The serving probe in the daemon: one job that gives every configured endpoint one cycle.

Active canaries: each cycle's canary vectors go to the canary component as records of the model
(ids ``serving:<text id>``, stream ``serving``), so they are pinned at first sighting (or by
``canaries.pins_file``), re-pinned by ``POST /admin/canaries/repin`` and compared like canaries
that producers send: the same ``embmon_canary_*`` gauges and ``EmbeddingMonitorModelChanged``.
The conformance checks (:mod:`monitor.serving.probe`) are exported per check.

Faults never reach ingest or a scrape: a cycle runs in the scheduler's thread under the job's
timeout, a failed request ends the endpoint's cycle, is counted by reason and logged at most once
a minute per endpoint and reason, and the endpoint is backed off (1, 2, 4, ... intervals up to
``max_backoff_seconds``, or longer when the endpoint sent ``Retry-After``) while the other
endpoints go on. ``collect`` reads a snapshot published at the end of each cycle.
"""

from __future__ import annotations

import bisect
import logging
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from monitor import catalog
from monitor.canary.component import CanaryComponent
from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import EmbeddingBatch
from monitor.errors import ConfigError
from monitor.logs import RateLimitedLog
from monitor.serving.backends import Backend, make_backend
from monitor.serving.probe import CHECKS, pinned_checks, run_cycle, violations
from monitor.serving.probe import tolerance as held_to
from monitor.serving.settings import EndpointSettings, ServingSettings
from monitor.state import checks as restored

logger = logging.getLogger(__name__)
STREAM = "serving"
# The bucket boundaries OpenTelemetry's GenAI semantic conventions advise for gen_ai.client.operation.duration
# (seconds): what embmon_serving_request_duration_seconds uses (docs/canaries.md, "OpenTelemetry").
GEN_AI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)


@dataclass
class EndpointState:
    """Counters and the last cycle's findings of one endpoint (model)."""

    requests: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)
    cycles: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    deviations: dict[str, float] = field(default_factory=dict)
    collisions: int | None = None
    latency_median: float | None = None
    latency_max: float | None = None
    # successful requests' durations: counts per GEN_AI_DURATION_BUCKETS bucket (+Inf last), and their sum
    durations: list[int] = field(default_factory=lambda: [0] * (len(GEN_AI_DURATION_BUCKETS) + 1))
    durations_sum: float = 0.0
    last_success: float | None = None
    failures: int = 0  # consecutive failed cycles
    skip_until: float = 0.0
    backoff: float = 0.0
    norms: dict[str, float] = field(default_factory=dict)  # canary id -> pinned norm
    cycle: int = 0


class ServingComponent(Component):
    name = "serving"

    def __init__(self, context: MonitorContext, canaries: CanaryComponent,
                 backends: Mapping[str, Backend] | None = None):
        self.context = context
        self.settings: ServingSettings = context.settings.serving
        self.canaries = canaries
        self._endpoints = {e.model: e for e in self.settings.endpoints}
        try:
            self._backends = dict(backends) if backends is not None else {
                e.model: make_backend(e) for e in self.settings.endpoints}
        except ValueError as exc:  # an API key that cannot be read: named, never shown
            raise ConfigError(str(exc)) from None
        declared = {name: m.dim for name, m in context.settings.models.items() if m.dim}
        self._dims = {e.model: e.dim or declared.get(e.model) for e in self.settings.endpoints}
        self._state = {model: EndpointState() for model in self._endpoints}
        self._lock = threading.Lock()
        self._log = RateLimitedLog(logger, interval=60.0)
        self._snapshot: dict[str, EndpointState] = {}
        canaries.repin_listeners.append(self._repinned)
        # whether this process probes the model's endpoint (in a group of reducers: the reducer that
        # exports the model, monitor/scaleout/export.py); a model probed elsewhere counts no cycle here
        self.runs_here: Callable[[str], bool] = lambda model: True
        self.publish()

    # ------------------------------------------------------------------ the job
    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob("serving", self.run, self.settings.interval_seconds, self.settings.timeout_seconds,
                             outbound=True)]

    def run(self, clock: Callable[[], float] | None = None) -> None:
        """One cycle of every endpoint that is not backing off (the scheduled job)."""
        clock = clock or self.context.clock
        deadline = time.monotonic() + self.settings.timeout_seconds
        for model, endpoint in self._endpoints.items():
            if not self.runs_here(model):
                continue
            state = self._state[model]
            now = clock()
            if now < state.skip_until:
                with self._lock:
                    state.cycles["skipped"] += 1
                continue
            self._cycle(model, endpoint, state, now, deadline)
        self.publish()

    def _cycle(self, model: str, endpoint: EndpointSettings, state: EndpointState, now: float,
               deadline: float) -> None:
        backend = self._backends[model]
        backend.dim = self._dims[model]
        timeout = min(endpoint.request_timeout_seconds, max(0.1, deadline - time.monotonic()))
        result = run_cycle(backend, endpoint, self.settings.texts, self.settings.neighbour_text, state.cycle, timeout,
                           self.settings.tolerances.collision, stop=lambda: time.monotonic() > deadline)
        if self._dims[model] is None and result.canaries:  # the first answer fixes an undeclared dimension
            dims = Counter(v.shape[0] for v in result.canaries.values())
            self._dims[model] = dims.most_common(1)[0][0]
        wrong = [k for k, v in result.canaries.items() if v.shape[0] != self._dims[model]]
        for key in wrong:
            del result.canaries[key]
            result.invalid["wrong_dimension"] += 1
        pins = self.canaries.pinned(model)
        if result.canaries:
            ids = tuple(result.canaries)
            vectors = np.stack([result.canaries[i] for i in ids]).astype(np.float32)
            self.canaries.on_embeddings(EmbeddingBatch(model, STREAM, vectors, ids=ids), now)
        with self._lock:
            for ident, vector in result.canaries.items():
                state.norms.setdefault(ident, float(np.linalg.norm(vector)))
            state.cycle += 1
            state.requests += result.calls
            state.invalid.update(result.invalid)
            for latency in result.latencies:
                state.durations[bisect.bisect_left(GEN_AI_DURATION_BUCKETS, latency)] += 1
                state.durations_sum += latency
            if result.latencies:
                state.latency_median = statistics.median(result.latencies)
                state.latency_max = max(result.latencies)
            deviations = {**result.deviations, **pinned_checks(result, pins, state.norms, list(self.settings.texts))}
            failed = violations(deviations, result.collisions, self.settings.tolerances)
            state.deviations = deviations
            state.violations.update(failed)
            if result.error is None:
                state.collisions = result.collisions
                state.cycles["ok"] += 1
                state.failures, state.backoff, state.skip_until = 0, 0.0, 0.0
                state.last_success = now
            else:
                reason = result.error.reason
                state.errors[reason] += 1
                state.cycles["failed"] += 1
                state.failures += 1
                interval = self.settings.interval_seconds
                state.backoff = min(endpoint.max_backoff_seconds, interval * (2 ** (state.failures - 1) - 1))
                state.backoff = max(state.backoff, result.error.retry_after or 0.0)
                # the job comes back every interval: skip the runs before interval + backoff (half an
                # interval of slack for the scheduler's jitter)
                state.skip_until = now + state.backoff + interval / 2 if state.backoff else 0.0
        if result.error is not None:
            self._log.warning(f"{model}:{result.error.reason}",
                              "serving probe of model %s: %s (%s) after %d requests; next try in %.0f s",
                              model, result.error.reason, result.error, result.calls,
                              state.backoff + self.settings.interval_seconds)
        if failed:
            self._log.warning(f"{model}:checks", "serving probe of model %s: checks failed %s: %s", model, failed,
                              {k: f"{deviations[k]:.3g}" for k in failed if k in deviations})
        if result.invalid:
            self._log.warning(f"{model}:invalid", "serving probe of model %s: unusable vectors %s", model,
                              dict(result.invalid))

    def _repinned(self, model: str) -> None:
        """An operator re-pinned the model's canaries: the norms are pinned again at the next cycle."""
        state = self._state.get(model)
        if state is not None:
            with self._lock:
                state.norms.clear()

    # ------------------------------------------------------------------ publishing
    def publish(self) -> None:
        with self._lock:
            self._snapshot = {model: _copy(state) for model, state in self._state.items()}

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot
        tolerances = self.settings.tolerances
        gauges: list[tuple[str, Callable[[EndpointState], float | None]]] = [
            ("embmon_serving_collisions", lambda s: s.collisions),
            ("embmon_serving_latency_median_seconds", lambda s: s.latency_median),
            ("embmon_serving_latency_max_seconds", lambda s: s.latency_max),
            ("embmon_serving_last_success_timestamp_seconds", lambda s: s.last_success),
            ("embmon_serving_backoff_seconds", lambda s: s.backoff),
        ]
        for name, read in gauges:
            family = catalog.gauge(name)
            for model, state in sorted(snap.items()):
                value = read(state)
                if value is not None:
                    family.add_metric([model], float(value))
            yield family
        deviation, tolerance = catalog.gauge("embmon_serving_deviation"), catalog.gauge("embmon_serving_tolerance")
        for model, state in sorted(snap.items()):
            for check in CHECKS:
                if check in state.deviations:
                    deviation.add_metric([model, check], state.deviations[check])
                if check != "collision":
                    tolerance.add_metric([model, check], held_to(check, tolerances, state.deviations))
        yield deviation
        yield tolerance
        yield _durations(snap)
        requests = catalog.counter("embmon_serving_requests_total")
        for model, state in sorted(snap.items()):
            requests.add_metric([model], float(state.requests))
        yield requests
        labelled: list[tuple[str, Callable[[EndpointState], Counter[str]], Iterable[str]]] = [
            ("embmon_serving_errors_total", lambda s: s.errors, ()),
            ("embmon_serving_invalid_vectors_total", lambda s: s.invalid, ()),
            ("embmon_serving_cycles_total", lambda s: s.cycles, ("ok", "failed", "skipped")),
            ("embmon_serving_violations_total", lambda s: s.violations, CHECKS),
        ]
        for name, counts, always in labelled:
            counter = catalog.counter(name)
            for model, state in sorted(snap.items()):
                values = counts(state)
                for label in sorted(set(always) | set(values)):
                    counter.add_metric([model, label], float(values.get(label, 0)))
            yield counter

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {model: {"requests": s.requests, "errors": dict(s.errors), "invalid": dict(s.invalid),
                            "cycles": dict(s.cycles), "violations": dict(s.violations), "norms": dict(s.norms),
                            "cycle": s.cycle}
                    for model, s in self._state.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            for model, saved in state.items():
                if model not in self._state:
                    continue
                target = self._state[model]
                target.requests = restored.count(saved["requests"], f"serving requests of {model}")
                for name in ("errors", "invalid", "cycles", "violations"):
                    setattr(target, name, Counter({str(k): restored.count(v, f"serving {name} of {model}")
                                                   for k, v in dict(saved[name]).items()}))
                target.norms = {str(k): restored.finite(v, f"serving norm pin of {model}", 1e-30)
                                for k, v in dict(saved["norms"]).items()}
                target.cycle = restored.count(saved["cycle"], f"serving cycle of {model}")
        self.publish()

    def close(self) -> None:
        for backend in self._backends.values():
            backend.close()


def _copy(state: EndpointState) -> EndpointState:
    return EndpointState(
        requests=state.requests, errors=Counter(state.errors), invalid=Counter(state.invalid),
        cycles=Counter(state.cycles), violations=Counter(state.violations), deviations=dict(state.deviations),
        collisions=state.collisions, latency_median=state.latency_median, latency_max=state.latency_max,
        durations=list(state.durations), durations_sum=state.durations_sum,
        last_success=state.last_success, backoff=state.backoff,
    )


def _durations(snap: Mapping[str, EndpointState]) -> HistogramMetricFamily:
    """``embmon_serving_request_duration_seconds``: OpenTelemetry's gen_ai.client.operation.duration as
    Prometheus names it, for the successful requests (a failed one is counted by reason instead)."""
    spec = catalog.spec("embmon_serving_request_duration_seconds")
    family = HistogramMetricFamily(spec.family, spec.help, labels=list(spec.labels))
    for model, state in sorted(snap.items()):
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, GEN_AI_DURATION_BUCKETS), "+Inf"), state.durations, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family.add_metric([model], buckets, state.durations_sum)
    return family


def serving_factories(canary_class: type[CanaryComponent] = CanaryComponent,
                      ) -> list[Callable[[MonitorContext], Component]]:
    """The canary component (with the probe's canary ids) and the serving probe that feeds it;
    ``canary_class``: the role's canary component (a reducer's compares the replicas' arrivals too,
    so the probe's canaries and the producers' are held to the same pins)."""
    made: list[CanaryComponent] = []

    def canaries(context: MonitorContext) -> Component:
        made.append(canary_class(context, extra_ids=context.settings.serving.canary_ids()))
        return made[-1]

    def serving(context: MonitorContext) -> Component:
        return ServingComponent(context, made[-1])

    return [canaries, serving]
