"""Drift detection in the daemon: references, the scheduled test cycle, online detectors, the admin endpoint.

One :class:`DriftComponent` serves every (model, stream) (docs/drift.md, "In the daemon"):

* **references**, most specific first: a **pinned file** (:mod:`monitor.drift.references.pinned`;
  ``MODEL/STREAM`` over ``MODEL`` over ``drift.reference.path``); an **explicit capture** or a
  file prepared offline, stored in the state directory (:mod:`monitor.drift.references.store`); a **lagged
  window** (``drift.reference.lagged_seconds``, :mod:`monitor.drift.references.lagged`); the **first N
  records** (:mod:`monitor.drift.references.first_records`), built on the ingest thread in bounded memory.
  Every reference but a lagged one is written to ``<state_dir>/references`` (by a background
  writer) and reloaded at start, so a restart never re-captures; a pinned file replaces the
  stored reference only when its content differs from the file last applied to that stream;
* **test cycle** (the ``drift`` job, every ``drift.interval_seconds``): for each (model, stream)
  with a reference and at least :attr:`DriftComponent.min_records` window records, run
  :func:`~monitor.drift.twosample.suite.run_drift_suite` on the window sample the last refresh published
  (``context.latest_windows()``) against the reference sample, with BLAS/torch threads capped
  (``drift.threads``, default: all cores but one, so ingest keeps a core), and publish an
  immutable result. A window already tested (same end time) is not tested again;
* **online detectors** (:class:`~monitor.drift.online.detectors.OnlineDriftMonitor`), fed every
  accepted batch on the ingest thread once the stream has a reference (vectorised signals,
  aggregated mini-batches);
* **time budget**: a cycle has ``drift.cycle_budget × interval_seconds`` (on the context's clock);
  each (model, stream) gets an equal share of what is left when its turn comes, and its tests stop
  at that deadline (:mod:`monitor.deadline`); tests cut short are counted;
* **regions** (:mod:`monitor.drift.attribution.regions`): fitted on a reference the first time a cycle needs
  them (never on the ingest thread), stored with it, so every cycle also says where the window
  moved;
* **accumulating evidence** (:mod:`monitor.drift.online.evidence_feed`): once a fixed reference has
  regions, the ingest thread labels each batch's fresh rows with their region (at most
  ``drift.evidence_rows`` a cycle) and each cycle bets on them; the stream's verdict is the
  suite's (at ``1 - drift.evidence_share`` of the budget) OR the detector's alarm. A new reference
  starts a new detector; a restarted daemon resumes it from the checkpoint (same reference and regions);
* ``POST /admin/baseline?model=M[&stream=S]`` (:mod:`monitor.drift.admin`; bearer token
  ``http.admin_token``; without a token configured every ``/admin/*`` route answers 403): the
  current window becomes the reference, written to the state directory before the response;
* ``GET /admin/drift/explain?model=M[&stream=S]`` (same token): the last cycle's explanation
  (:mod:`monitor.drift.attribution.explain`).

Scrapes read published values only (:mod:`monitor.drift.export`).
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric

from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.deadline import Deadline
from monitor.decoding.records import EmbeddingBatch
from monitor.drift.admin import add_drift_routes
from monitor.drift.attribution.regions import Regions, fit_regions
from monitor.drift.export import ChangeTotals, CycleResult, DriftSnapshot, ReferenceInfo, StreamKey, families
from monitor.drift.online.detectors import ChangePoint, OnlineDriftMonitor, build_detector
from monitor.drift.online.evidence_feed import EvidenceFeed, EvidenceResult
from monitor.drift.references.first_records import FirstRecords
from monitor.drift.references.lagged import LaggedRing
from monitor.drift.references.pinned import PinnedFiles
from monitor.drift.references.profile import ReferenceProfile, subsample_ids, subsample_index
from monitor.drift.references.store import ReferenceStore, StoredReference
from monitor.drift.settings import DriftSettings
from monitor.drift.stream_state import STATE_VERSION, DriftTotals, StreamSlot, check_entry, parse_totals
from monitor.drift.twosample.suite import run_drift_suite
from monitor.errors import ConfigError
from monitor.state.window import WindowSnapshot

logger = logging.getLogger(__name__)

MIN_TEST_RECORDS = 200  # a window needs min(this, drift.window_sample_size) records to be tested


def default_threads() -> int:
    """Threads for a test cycle when ``drift.threads`` is unset: every core but one (at least one)."""
    return max(1, (os.cpu_count() or 2) - 1)


class DriftComponent(Component):
    """Drift references, scheduled two-sample tests and online change detection for every (model, stream)."""

    name = "drift"

    def __init__(self, context: MonitorContext):
        self.context = context
        self.settings: DriftSettings = context.settings.drift
        self.reference_settings = self.settings.reference
        self.max_rows = 2 * self.settings.reference_sample_size
        threads = self.settings.threads or default_threads()
        self.suite_settings = self.settings.model_copy(update={"threads": threads})
        self.min_records = min(MIN_TEST_RECORDS, self.settings.window_sample_size)
        _check_detector_values(self.settings)
        try:
            self.pins = PinnedFiles(
                self.reference_settings, max_rows=self.max_rows, seed=self.settings.seed
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.store = ReferenceStore(context.state_dir)
        self.ring = (
            LaggedRing(context.state_dir, self.reference_settings.lagged_seconds, self.settings.interval_seconds)
            if self.reference_settings.lagged_seconds is not None
            else None
        )
        self._lock = threading.RLock()
        self._streams: dict[StreamKey, StreamSlot] = {}
        self._results: Mapping[StreamKey, CycleResult] = {}
        self._totals = DriftTotals()
        self._cycle_lock = threading.Lock()  # one cycle at a time (the job, or a test calling run_cycle)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="embmon-drift-store")
        # regions of references that do not store them (lagged ones): (the profile, its regions)
        self._fitted: dict[StreamKey, tuple[ReferenceProfile, Regions | None]] = {}
        self.store.remove_stale_temporaries()
        self._stored, unreadable = self.store.scan()
        for path, reason in unreadable.items():  # a restart must not crash on it again: set it aside
            context.rejected_files.set_aside("reference", path, reason)
        for key, ref in sorted(self._stored.items()):
            self._init_stream(key, ref.profile.dim)
        if context.add_route is not None:
            add_drift_routes(context.add_route, self)

    # ------------------------------------------------------------------ references
    def _init_stream(self, key: StreamKey, dim: int) -> StreamSlot:
        """First sight of (model, stream): decide where its reference comes from (module docstring)."""
        with self._lock:
            existing = self._streams.get(key)
            if existing is not None:
                return existing
            slot = StreamSlot(dim=dim, history=deque(maxlen=self.settings.sustained.cycles))
            self._streams[key] = slot
            model, stream = key
            pin, problem = self.pins.match(model, stream, dim)
            if problem is not None:
                slot.problem = problem
                logger.error("drift: %s; no drift tests for %s/%s", problem, model, stream)
                return slot
            stored = self._stored.pop(key, None)
            if stored is not None and stored.profile.dim != dim:
                logger.error(
                    "drift: stored reference %s has dimension %d, %s/%s has %d; ignoring it",
                    stored.path, stored.profile.dim, model, stream, dim,
                )
                stored = None
            fallback = self.reference_settings.fallback_mode
            if pin is not None and (stored is None or stored.pin_sha256 != pin.sha256):
                logger.info("drift: %s/%s uses the pinned reference %s", model, stream, pin.path)
                pinned = StoredReference(model, stream, pin.profile, "pinned", pin.sha256)
                self._install(slot, key, pinned, persist=True)
            elif stored is not None and not (stored.origin == "first_records" and fallback == "lagged"):
                logger.info("drift: %s/%s uses the stored reference %s (%s)", model, stream, stored.path, stored.origin)
                self._install(slot, key, stored, persist=False)
            elif fallback == "first_records":
                slot.builder = FirstRecords(
                    self.reference_settings.records, dim, self.max_rows, seed=self._seed(key, 0)
                )
            return slot

    def _install(self, slot: StreamSlot, key: StreamKey, ref: StoredReference, *, persist: bool) -> None:
        """Make ``ref`` the stream's reference: new detectors, fresh verdict history (lock held)."""
        slot.reference = ref
        slot.builder = None
        slot.lagged = None
        slot.history.clear()
        slot.last_end = None
        if key in self._results:
            self._results = {k: v for k, v in self._results.items() if k != key}
        self._start_online(slot, key, ref.profile)
        slot.evidence = None
        if ref.profile.regions is not None:
            self._start_evidence(slot, key, ref.profile.regions)
        if persist:
            try:
                self._writer.submit(self._save, ref)
            except RuntimeError:  # shutting down: the writer is gone, write it here
                self._save(ref)

    def _save(self, ref: StoredReference) -> None:
        try:
            path = self.store.save(ref)
        except Exception:  # the reference stays in memory; a restart would re-capture it
            self._count_error("store")
            logger.exception("drift: could not store the reference of %s/%s", ref.model, ref.stream)
            return
        logger.info("drift: stored the %s reference of %s/%s in %s", ref.origin, ref.model, ref.stream, path)

    def _start_online(self, slot: StreamSlot, key: StreamKey, profile: ReferenceProfile) -> None:
        slot.online = None
        slot.online_for = profile.captured_at
        online = self.settings.online
        if not online.enabled:
            return
        try:
            baseline = profile.signal_baseline()
        except ValueError as exc:
            logger.error("drift: no online detectors for %s/%s: %s", key[0], key[1], exc)
            return
        slot.online = OnlineDriftMonitor(
            baseline, online.detectors, signals=online.signals, aggregate=online.aggregate
        )
        for signal in online.signals:
            for detector in online.detectors:
                self._totals.changes.setdefault((*key, signal, detector), ChangeTotals(0, None))

    def _start_evidence(self, slot: StreamSlot, key: StreamKey, regions: Regions) -> None:
        """A new accumulating detector on the fixed reference's regions (lock held); none when it is off."""
        threshold = self.settings.evidence_threshold
        if threshold is None or slot.reference is None:
            return
        # seeded by the regions' content: the same reference gives the same bets on the same rows, on
        # whichever process (one daemon, a reducer), whenever it was captured
        content = zlib.crc32(np.ascontiguousarray(regions.centres, dtype=np.float64).tobytes())
        slot.evidence = EvidenceFeed(regions, threshold, self.settings.evidence_rows, self._seed(key, content))
        self._totals.evidence_alarms.setdefault(key, 0)

    def _seed(self, key: StreamKey, cycle: int) -> int:
        entropy = [self.settings.seed, zlib.crc32(f"{key[0]}/{key[1]}".encode()), cycle]
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])

    def _window_profile(
        self, key: StreamKey, window: WindowSnapshot, now: float, rows: int, source: str
    ) -> ReferenceProfile:
        kept = subsample_index(len(window.sample), rows, np.random.default_rng(self._seed(key, int(now * 1000))))
        return ReferenceProfile(
            sample=window.sample[kept], centroid=window.stats.mean, count=window.records, captured_at=now,
            source=source, sample_ids=subsample_ids(window.sample_ids, kept),
        )

    def reference(self, model: str, stream: str) -> ReferenceProfile | None:
        """The reference (model, stream) is compared with now (for a lagged one: at the last cycle)."""
        with self._lock:
            slot = self._streams.get((model, stream))
            if slot is None:
                return None
            return slot.reference.profile if slot.reference is not None else slot.lagged

    def evidence_feed(self, model: str, stream: str) -> EvidenceFeed | None:
        """The stream's accumulating detector and its pending labels (None: it has none now);
        scaled out, the reducer adds the merged sub-windows' rows to it (:mod:`monitor.scaleout.evidence`)."""
        with self._lock:
            slot = self._streams.get((model, stream))
            return None if slot is None else slot.evidence

    def flush(self) -> None:
        """Wait until every reference handed to the background writer is on disk."""
        self._writer.submit(lambda: None).result()

    # ------------------------------------------------------------------ ingest thread
    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        key = (batch.model, batch.stream)
        vectors, norms = batch.vectors, batch.norms
        with self._lock:
            slot = self._streams.get(key) or self._init_stream(key, vectors.shape[1])
            if slot.dim != vectors.shape[1]:
                return
            if slot.builder is not None:
                used = slot.builder.add(vectors, batch.ids)
                if not slot.builder.done:
                    return
                profile = slot.builder.profile(captured_at=now)
                logger.info("drift: captured the reference of %s/%s from its first %d records", *key, profile.count)
                self._install(slot, key, StoredReference(*key, profile, "first_records"), persist=True)
                vectors = vectors[used:]
                norms = None if norms is None else norms[used:]
            online, evidence = slot.online, slot.evidence
        if not len(vectors):
            return
        if evidence is not None:
            evidence.add(vectors)
        if online is None:
            return
        found = online.update(vectors, now, norms)
        if found:
            with self._lock:
                self._totals.count_changes(key, found)

    def record_change_points(
        self, key: StreamKey, found: Sequence[ChangePoint], signals: Sequence[str], detectors: Sequence[str]
    ) -> None:
        """Count change points found elsewhere (the reducer's detectors, :mod:`monitor.scaleout.detectors`)
        as this component's own: exported and checkpointed like them, every (signal, detector) of
        ``key`` exported from its first call on, at zero until one fires."""
        with self._lock:
            for signal in signals:
                for detector in detectors:
                    self._totals.changes.setdefault((*key, signal, detector), ChangeTotals(0, None))
            self._totals.count_changes(key, found)

    # ------------------------------------------------------------------ the test cycle
    def jobs(self) -> list[ScheduledJob]:
        interval = self.settings.interval_seconds
        return [ScheduledJob("drift", self.run_cycle, interval, timeout_seconds=interval)]

    def run_cycle(self) -> Mapping[StreamKey, CycleResult]:
        """One test cycle over every (model, stream) in the latest published windows; returns the results.

        It ends within ``cycle_budget × interval_seconds`` on the context's clock, give or take
        the one test per stream that was running at its deadline (module docstring).
        """
        with self._cycle_lock:
            clock = self.context.clock
            now = clock()
            deadline = Deadline(now + self.settings.cycle_budget * self.settings.interval_seconds, clock)
            windows = sorted(self.context.latest_windows().items())
            with self._lock:
                self._totals.cycles += 1
                cycle = self._totals.cycles
            failed: list[tuple[StreamKey, BaseException]] = []
            for turn, (key, window) in enumerate(windows):
                try:
                    self._cycle_one(key, window, now, cycle, deadline.share(len(windows) - turn))
                except Exception as exc:  # one stream's failure must not skip the others
                    self._count_error("cycle")
                    failed.append((key, exc))
                    logger.debug("drift cycle for %s/%s failed", *key, exc_info=True)
            if failed:
                (model, stream), first_error = failed[0]
                message = f"drift cycle failed for {len(failed)} stream(s), first {model}/{stream}"
                raise RuntimeError(message) from first_error
            return self._results

    def _cycle_one(self, key: StreamKey, window: WindowSnapshot, now: float, cycle: int, deadline: Deadline) -> None:
        slot = self._streams.get(key) or self._init_stream(key, window.dim)
        if slot.problem is not None or slot.dim != window.dim:
            return
        enough = window.records >= self.min_records and len(window.sample) >= 2
        if self.ring is not None and enough:
            if self.ring.due(key, now):
                self.ring.add(key, self._window_profile(key, window, now, self.settings.reference_sample_size,
                                                        f"window ending {window.end:.3f}"), now)
            with self._lock:
                if slot.reference is None and slot.online is None:
                    # lagged mode: the detectors standardise with the first window they see
                    self._start_online(slot, key, self._window_profile(key, window, now, self.max_rows, "first window"))
        with self._lock:
            fixed = slot.reference
        reference: ReferenceProfile | None
        if fixed is not None:
            reference = fixed.profile
        elif self.ring is not None:
            reference = self.ring.pick(key, now)
            with self._lock:
                slot.lagged = reference
        else:
            return
        if reference is None or not enough or window.end == slot.last_end:
            return
        regions = self._regions(key, reference) if self.settings.regions.enabled else None
        if fixed is not None and regions is not None and fixed.profile.regions is None:
            fixed = self._store_regions(slot, fixed, regions)
        report = run_drift_suite(
            window.sample, reference.sample, self.suite_settings, seed=self._seed(key, cycle), deadline=deadline,
            window_ids=window.sample_ids, regions=regions,
        )
        if report.errors:
            self._count_error("test", len(report.errors))
        evidence = self._bet(slot, key, fixed, regions)
        with self._lock:
            self._totals.count_planned(key, report.planned, report.cut, report.screened)
            if slot.reference is not fixed:  # replaced while the tests ran: this verdict is about the old one
                return
            slot.last_end = window.end
            previous = self._results.get(key)
            was = previous is not None and previous.detected
            slot.history.append(report.detected)
            alarmed = evidence is not None and evidence.alarmed
            if alarmed:
                self._totals.evidence_alarms[key] = self._totals.evidence_alarms.get(key, 0) + 1
            # an alarm of the accumulating detector is an alert on its own (it restarts after it)
            sustained = sum(slot.history) >= self.settings.sustained.detections or alarmed
            result = CycleResult(report, sustained, now, reference.captured_at, evidence)
            self._results = {**self._results, key: result}
        if result.detected and not was:
            logger.warning("drift: %s/%s drifted from its reference (%s)", key[0], key[1], _why(result))
        elif was and not result.detected:
            logger.info("drift: %s/%s is back in line with its reference", key[0], key[1])

    def _bet(
        self, slot: StreamSlot, key: StreamKey, fixed: StoredReference | None, regions: Regions | None
    ) -> EvidenceResult | None:
        """The accumulating detector's bet on the rows since the last cycle (None: it is off, or no row came)."""
        if fixed is None or regions is None:
            return None
        with self._lock:
            if slot.reference is not fixed:
                return None
            if slot.evidence is None or slot.evidence.regions is not regions:
                self._start_evidence(slot, key, regions)
            feed = slot.evidence
        return None if feed is None else feed.step()

    def _regions(self, key: StreamKey, reference: ReferenceProfile) -> Regions | None:
        """The reference's regions: stored with it, or fitted now (once per reference)."""
        if reference.regions is not None:
            return reference.regions
        fitted = self._fitted.get(key)
        if fitted is None or fitted[0] is not reference:
            regions = fit_regions(
                reference.sample, reference.sample_ids, max_regions=self.settings.regions.max_regions,
                exemplars=self.settings.regions.exemplars, seed=self._seed(key, 0),
            )
            if regions is None:
                logger.info("drift: the reference of %s/%s has too few sample rows for regions", *key)
            fitted = self._fitted[key] = (reference, regions)
        return fitted[1]

    def _store_regions(self, slot: StreamSlot, ref: StoredReference, regions: Regions) -> StoredReference:
        """Keep freshly fitted regions with the stream's reference, in memory and on disk."""
        with self._lock:
            if slot.reference is not ref:
                return ref
            slot.reference = replace(ref, profile=replace(ref.profile, regions=regions))
            self._fitted.pop((ref.model, ref.stream), None)
            try:
                self._writer.submit(self._save, slot.reference)
            except RuntimeError:  # shutting down: it is stored at the next start
                pass
            return slot.reference

    # ------------------------------------------------------------------ admin (monitor.drift.admin)
    def last_results(self, model: str, stream: str) -> tuple[list[StreamKey], dict[StreamKey, CycleResult]]:
        """The (model, stream)s seen for ``model`` (one ``stream``, or all when empty) and their last verdicts."""
        with self._lock:
            known = sorted(k for k in self._streams if k[0] == model and (not stream or k[1] == stream))
            return known, {k: self._results[k] for k in known if k in self._results}

    def capture_current(self, states: Iterable[Any]) -> list[StoredReference]:
        """Pin each stream's current window as its reference; stored on disk before it is used."""
        now = self.context.clock()
        captured: list[tuple[StreamKey, WindowSnapshot]] = []
        for state in sorted(states, key=lambda s: (s.model, s.stream)):
            with state.lock:
                window = state.window.snapshot(now)
            if window.records < 2 or len(window.sample) < 2:
                raise ValueError(f"{state.model}/{state.stream}: the window holds {window.records} records")
            captured.append(((state.model, state.stream), window))
        refs = []
        for key, window in captured:
            pin, _ = self.pins.match(key[0], key[1], window.dim)
            profile = self._window_profile(key, window, now, self.max_rows, "window captured via /admin/baseline")
            ref = StoredReference(*key, profile, "captured", None if pin is None else pin.sha256)
            # through the writer, after any write it still holds for this stream, and before it is used:
            # the response promises the reference is durable
            path = self._writer.submit(self.store.save, ref).result()
            ref = replace(ref, path=path)
            with self._lock:
                slot = self._streams.get(key) or self._init_stream(key, window.dim)
                slot.problem = None
                self._install(slot, key, ref, persist=False)
            logger.info("drift: %s/%s re-pinned to its current window (%d records)", key[0], key[1], window.records)
            refs.append(ref)
        return refs

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Reference metadata (arrays live in the state directory), first-N builders, detectors, last verdicts."""
        with self._lock:
            streams = [slot.state_dict(key, self._results.get(key)) for key, slot in sorted(self._streams.items())]
            return {"version": STATE_VERSION, "streams": streams, **self._totals.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what fits the references on disk (a reference changed since: its detectors start afresh)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported drift state version {state.get('version')!r}")
        for entry in state.get("streams") or []:  # all or nothing: refused before any stream takes part of it
            check_entry(entry)
        parse_totals(state)
        builds = self.reference_settings.fallback_mode == "first_records"
        with self._lock:
            for entry in state.get("streams") or []:
                key = (str(entry["model"]), str(entry["stream"]))
                slot = self._streams.get(key) or self._init_stream(key, int(entry["dim"]))
                if slot.dim != int(entry["dim"]):
                    continue
                if entry.get("reference") is not None and slot.reference is None and builds:
                    logger.warning(
                        "drift: the checkpoint has a reference for %s/%s but %s is missing; capturing a new one",
                        key[0], key[1], self.store.path(*key),
                    )
                result = slot.restore(
                    key, entry, online_enabled=self.settings.online.enabled, lagged=self.ring is not None
                )
                if result is not None:
                    self._results = {**self._results, key: result}
            self._totals.load_state_dict(state)

    # ------------------------------------------------------------------ scrape
    def snapshot(self) -> DriftSnapshot:
        with self._lock:
            references = {}
            for key, slot in self._streams.items():
                if slot.reference is not None:
                    p, origin = slot.reference.profile, slot.reference.origin
                elif slot.lagged is not None:
                    p, origin = slot.lagged, "lagged"
                else:
                    continue
                references[key] = ReferenceInfo(p.count, p.captured_at, origin, p.source, p.dim)
            return DriftSnapshot(
                results=self._results, references=references, changes=dict(self._totals.changes),
                errors=dict(self._totals.errors), cuts=dict(self._totals.cuts),
                screens=dict(self._totals.screens),
                evidence_alarms=dict(self._totals.evidence_alarms),
            )

    def collect(self) -> Iterable[Metric]:
        return families(self.snapshot())

    def _count_error(self, stage: str, count: int = 1) -> None:
        """One of :data:`~monitor.drift.export.ERROR_STAGES` failed (exported as ``embmon_drift_errors_total``)."""
        with self._lock:
            self._totals.errors[stage] += count

    def close(self) -> None:
        self._writer.shutdown(wait=True)


def _why(result: CycleResult) -> str:
    """What flagged a cycle, for the log: the suite's tests, the accumulated evidence, or both."""
    parts = []
    if result.report.detected:
        parts.append(", ".join(result.report.detected_tests))
    if result.evidence is not None and result.evidence.alarmed:
        parts.append(f"accumulated evidence: log R = {result.evidence.log_evidence:.2f} "
                     f">= log A = {result.evidence.log_threshold:.2f} over {result.evidence.rows} fresh rows")
    return "; ".join(parts)


def _check_detector_values(settings: DriftSettings) -> None:
    """Build each configured detector once, so a value river refuses stops the start (settings only
    check the parameter names: they never import river)."""
    for kind, params in settings.online.detectors.items():
        try:
            build_detector(kind, params)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"drift.online.detectors.{kind}: {exc}") from None
