"""The index probes as one daemon component: one job per probe, failures counted, backed off.

Each probe runs as its own :class:`~monitor.component.ScheduledJob` (``index:<name>``). A cycle
ends in one of these outcomes:

* ``success``: the cycle's result replaces the previous one;
* ``partial``: the internal deadline (80 % of ``timeout_seconds``) stopped new searches; what was
  done is summarised and published (it is still a fair sample: queries are drawn first);
* ``failure``: the engine failed (unreachable, timeout, permission, a missing table or column,
  an unreadable answer): counted by reason in ``embmon_index_errors_total``, logged once per
  reason and probe every ``LOG_EVERY`` seconds, and the probe backs off: the next
  ``2**failures - 1`` scheduled cycles are skipped (``backoff``), up to
  ``backoff_max_seconds``; the previous result stays exported;
* ``timeout``: a cycle that ran past ``timeout_seconds`` anyway (its result is dropped).

Nothing here runs on the ingest thread but the hooks (a buffer append, a hash per row); a slow
or hung engine holds only its own job's thread, and not past ``CUTOFF_SHARE`` of
``timeout_seconds``: an engine call still running then is given up (pgvector: cancelled, then its
connection cut; LanceDB: left to its worker thread) and the cycle fails as ``timeout``. A census
that fails is counted in ``embmon_index_census_errors_total`` while the cycle's recall is
published. ``collect()`` reads the published snapshot only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch, InteractionEvent
from monitor.errors import ConfigError
from monitor.index.connectors import build_connector
from monitor.index.connectors.base import ConnectorError
from monitor.index.export import OUTCOMES, IndexSnapshot, families
from monitor.index.probe import IndexProbe, IndexResult
from monitor.index.settings import IndexProbeSpec
from monitor.logs import RateLimitedLog, each_guarded

logger = logging.getLogger(__name__)

LOG_EVERY = 300.0
DEADLINE_SHARE = 0.8
CUTOFF_SHARE = 0.85


def build_probe(spec: IndexProbeSpec, seed: int = 0, device: str | None = None) -> IndexProbe:
    """The probe of ``spec``; its connector connects at the first cycle, so an engine that is down
    at start-up is a counted failure, not a failed start."""
    encoder: Callable[[list[str]], np.ndarray] | None = None
    if spec.census.encoder is not None:
        from monitor.retrieval.probes.golden import Encoder  # the golden probes' loader (encoder extra)

        encoder = Encoder(spec.census.encoder, device).encode
    try:
        return IndexProbe(spec, build_connector(spec), seed=seed, encoder=encoder)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"index.probes {spec.name!r}: {exc}") from None


class IndexComponent(Component):
    """Schedules every index probe and exports what they measured."""

    name = "index"

    def __init__(self, context: MonitorContext, probes: list[IndexProbe] | None = None):
        self.context = context
        specs = context.settings.index.probes
        device = context.settings.device
        built = probes if probes is not None else [build_probe(s, i, device) for i, s in enumerate(specs)]
        self.probes: dict[str, IndexProbe] = {p.name: p for p in built}
        self._lock = threading.Lock()
        started = context.clock()
        self._snapshot = IndexSnapshot(
            runs={(name, o): 0 for name in self.probes for o in OUTCOMES},
            last_success=dict.fromkeys(self.probes, started),
        )
        self._failures: dict[str, int] = dict.fromkeys(self.probes, 0)
        self._skip: dict[str, int] = dict.fromkeys(self.probes, 0)
        self._log = RateLimitedLog(logger, interval=LOG_EVERY)

    # ------------------------------------------------------------------ hooks (ingest thread)
    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        each_guarded(self.probes.values(), "on_embeddings", (batch, now), self._log, "index probe")

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        each_guarded(self.probes.values(), "on_interaction", (event, now), self._log, "index probe")

    # ------------------------------------------------------------------ scheduling
    def jobs(self) -> list[ScheduledJob]:
        return [
            ScheduledJob(f"index:{p.name}", partial(self.run_probe, p.name), p.spec.interval_seconds,
                         p.spec.timeout_seconds, outbound=True)
            for p in self.probes.values()
        ]

    def run_probe(self, name: str) -> IndexResult | None:
        """One scheduled cycle of ``name`` (or a skipped one while it backs off); never raises for the engine."""
        probe = self.probes[name]
        if self._skip[name] > 0:
            self._skip[name] -= 1
            self._publish(name, "backoff")
            return None
        started = time.perf_counter()
        deadline = Deadline.after(probe.spec.timeout_seconds * DEADLINE_SHARE)
        cutoff = Deadline.after(probe.spec.timeout_seconds * CUTOFF_SHARE)
        try:
            result = probe.run(deadline, self.context.clock(), cutoff)
        except ConnectorError as exc:
            self._failed(probe, exc.reason, str(exc), time.perf_counter() - started)
            return None
        except Exception as exc:
            self._failed(probe, "other", f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
            raise  # a bug, not the engine: the daemon logs the traceback and counts the job's failure
        elapsed = time.perf_counter() - started
        self._failures[name] = 0
        if elapsed > probe.spec.timeout_seconds:
            logger.warning("index probe %s: cycle took %.1fs (timeout %.1fs); dropped", name, elapsed,
                           probe.spec.timeout_seconds)
            self._publish(name, "timeout", elapsed=elapsed)
            return None
        if result.census_error is not None:
            self._log.warning(f"{name}:census:{result.census_error}", "index probe %s: census dropped (%s); the "
                              "cycle's recall is published", name, result.census_error)
        self._publish(name, "partial" if result.partial else "success", elapsed=elapsed, result=result)
        return result

    def _failed(self, probe: IndexProbe, reason: str, message: str, elapsed: float) -> None:
        name = probe.name
        self._failures[name] += 1
        failures = self._failures[name]
        interval = probe.spec.interval_seconds
        skip = min(2 ** min(failures, 20) - 1, int(probe.spec.backoff_max_seconds // interval))
        self._skip[name] = max(0, skip)
        self._log.warning(f"{name}:{reason}", "index probe %s: %s (%s); %d failure(s) in a row, skipping the next %d "
                          "cycle(s)", name, reason, message, failures, self._skip[name])
        self._publish(name, "failure", elapsed=elapsed, error=reason)

    def _publish(self, name: str, outcome: str, *, elapsed: float | None = None,
                 result: IndexResult | None = None, error: str | None = None) -> None:
        with self._lock:
            old = self._snapshot
            runs = dict(old.runs)
            runs[(name, outcome)] = runs.get((name, outcome), 0) + 1
            changes: dict[str, Any] = {"runs": runs}
            if elapsed is not None:
                changes["durations"] = {**old.durations, name: elapsed}
            if error is not None:
                errors = dict(old.errors)
                errors[(name, error)] = errors.get((name, error), 0) + 1
                changes["errors"] = errors
            if result is not None:
                changes["results"] = {**old.results, name: result}
                changes["last_success"] = {**old.last_success, name: self.context.clock()}
                skipped = dict(old.skipped)
                for reason, n in result.skipped.items():
                    skipped[(name, reason)] = skipped.get((name, reason), 0) + n
                if result.census_error is not None:
                    census_errors = dict(old.census_errors)
                    key = (name, result.census_error)
                    census_errors[key] = census_errors.get(key, 0) + 1
                    changes["census_errors"] = census_errors
                searches = dict(old.searches)
                exact = result.exact_searches
                for kind, n in (("served", result.searches - exact), ("exact", exact)):
                    searches[(name, kind)] = searches.get((name, kind), 0) + n
                changes.update(
                    skipped=skipped, searches=searches,
                    rows_read={**old.rows_read, name: old.rows_read.get(name, 0) + result.rows_read},
                    cpu_seconds={**old.cpu_seconds, name: old.cpu_seconds.get(name, 0.0) + result.cpu_seconds},
                )
            self._snapshot = replace(old, **changes)

    # ------------------------------------------------------------------ scrape
    @property
    def snapshot(self) -> IndexSnapshot:
        return self._snapshot

    def collect(self) -> Iterable[Metric]:
        return families(self._snapshot, self.probes)

    def close(self) -> None:
        for probe in self.probes.values():
            try:
                probe.connector.close()
            except Exception:
                logger.debug("closing index probe %s", probe.name, exc_info=True)
