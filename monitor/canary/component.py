"""The canary component: compare every canary arrival with its pin, export the worst cosine.

A silent model change (new weights, a different pooling, a rotated space with identical
intrinsic metrics) moves the embedding of a fixed text; float nondeterminism across hardware
barely does. So each canary record is compared with the vector pinned for its (model, id):
cosine below ``1 - canaries.tolerance`` is a mismatch, counted and logged on the first arrival
after the change. Re-pinning after an intended upgrade is ``POST /admin/canaries/repin?model=M``
(``embedding-monitor canary repin``), which is logged.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.metrics_core import Metric

from monitor import catalog
from monitor.canary.pins import Pins, PinStore, unit
from monitor.canary.settings import CanarySettings
from monitor.component import Component, MonitorContext, ScheduledJob
from monitor.decoding.records import EmbeddingBatch
from monitor.errors import ConfigError
from monitor.logs import RateLimitedLog
from monitor.server.admin_routes import json_response, model_and_stream
from monitor.state import checks

logger = logging.getLogger(__name__)

REPIN_PATH = "/admin/canaries/repin"
MAX_RECENT = 10_000  # cosines kept per model for the window minimum (canaries arrive on a schedule)


@dataclass(frozen=True)
class CanarySnapshot:
    """What a scrape shows; replaced whole by the publishing job."""

    cosine_min: Mapping[str, float] = field(default_factory=dict)
    pins: Mapping[str, int] = field(default_factory=dict)
    checked: Mapping[str, int] = field(default_factory=dict)
    mismatches: Mapping[str, int] = field(default_factory=dict)
    last_seen: Mapping[str, float] = field(default_factory=dict)


class CanaryComponent(Component):
    name = "canary"

    def __init__(self, context: MonitorContext, extra_ids: Mapping[str, Iterable[str]] | None = None):
        """``extra_ids``: canaries beyond ``canaries.ids`` (the serving probe's texts, model -> ids)."""
        self.context = context
        self.settings: CanarySettings = context.settings.canaries
        self.window_seconds = float(context.settings.window.seconds)
        self._ids = {model: frozenset(ids) for model, ids in self.settings.ids.items()}
        for model, ids in (extra_ids or {}).items():
            self._ids[model] = self._ids.get(model, frozenset()) | frozenset(ids)
        self.repin_listeners: list[Callable[[str], None]] = []  # told the model of every re-pin
        self._store = PinStore(context.state_dir)
        self._store.remove_stale_temporaries()
        try:
            file_pins = self.settings.file_pins()
        except ValueError as exc:
            raise ConfigError(f"canaries: {exc}") from None
        declared = {name: m.dim for name, m in context.settings.models.items() if m.dim}
        for model, ident, vector in file_pins:
            if declared.get(model, len(vector)) != len(vector):
                raise ConfigError(f"canaries.pins_file: {model}/{ident} is pinned with a {len(vector)}-d vector, "
                                  f"model {model} is {declared[model]}-d (models.{model}.dim)")
        stored = self._stored_pins(declared)
        self._fixed = {(model, ident) for model, ident, _ in file_pins}
        self._pins: Pins = {model: dict(ids) for model, ids in stored.items() if model in self._ids}
        for model, ident, vector in file_pins:
            self._pins.setdefault(model, {})[ident] = unit(np.asarray(vector))
        self._latest: Pins = {}  # the last arrival of each canary (what a re-pin pins)
        self._recent: dict[str, deque[tuple[float, float]]] = {}
        self._checked: Counter[str] = Counter()
        self._mismatches: Counter[str] = Counter()
        self._last_seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._log = RateLimitedLog(logger, interval=60.0)
        self._snapshot = CanarySnapshot()
        self.publish()
        if context.add_route is not None:
            context.add_route(REPIN_PATH, self.handle_repin, methods=("POST",))

    def _stored_pins(self, declared: Mapping[str, int]) -> Pins:
        """The pins of ``canary-pins.json``; a file that cannot be used is set aside (the pins form
        again from the next arrivals) rather than stopping the daemon at every start."""
        try:
            stored = self._store.load()
            for model, ids in stored.items():
                dims = {len(v) for v in ids.values()}
                if model in declared and dims - {declared[model]}:
                    raise ValueError(f"the pins of model {model} are {dims.pop()}-d, models.{model}.dim is "
                                     f"{declared[model]}")
        except ValueError as exc:
            self.context.rejected_files.set_aside("canary_pins", self._store.path, str(exc))
            return {}
        return stored

    # ------------------------------------------------------------------ ingest hook
    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        canaries = self._ids.get(batch.model)
        if not canaries or batch.ids is None:
            return
        rows = [(i, ident) for i, ident in enumerate(batch.ids) if ident in canaries]
        if not rows:
            return
        pinned_now = False
        with self._lock:
            pins = self._pins.setdefault(batch.model, {})
            for row, ident in rows:
                vector = unit(batch.vectors[row])
                self._latest.setdefault(batch.model, {})[ident] = vector
                self._last_seen[batch.model] = now
                pin = pins.get(ident)
                if pin is None:
                    pins[ident] = vector
                    pinned_now = True
                    logger.info("canary %s/%s: pinned at its first sighting", batch.model, ident)
                    continue
                self._checked[batch.model] += 1
                if pin.shape != vector.shape:  # never re-pinned silently: a model swap, or a wrong pins_file
                    self._mismatches[batch.model] += 1
                    self._log.warning(
                        f"dimension:{batch.model}",
                        "canary %s/%s: a %d-d vector, pinned %d-d (%s): model %s changed; if intended, re-pin with "
                        "`embedding-monitor canary repin --model %s`",
                        batch.model, ident, vector.shape[0], pin.shape[0],
                        "canaries.pins_file" if (batch.model, ident) in self._fixed else "canary-pins.json",
                        batch.model, batch.model,
                    )
                    continue
                cosine = float(np.dot(vector, pin))
                self._recent.setdefault(batch.model, deque(maxlen=MAX_RECENT)).append((now, cosine))
                if cosine < 1.0 - self.settings.tolerance:
                    self._mismatches[batch.model] += 1
                    self._log.warning(
                        f"mismatch:{batch.model}",
                        "canary %s/%s: cosine %.6f to its pinned vector (tolerance %g): the model's embeddings "
                        "changed; if intended, re-pin with `embedding-monitor canary repin --model %s`",
                        batch.model, ident, cosine, self.settings.tolerance, batch.model,
                    )
            if pinned_now:
                self._save_locked()

    # ------------------------------------------------------------------ publishing
    def jobs(self) -> list[ScheduledJob]:
        return [ScheduledJob("canary", self.publish, self.context.settings.refresh_seconds)]

    def publish(self) -> CanarySnapshot:
        """Drop cosines older than the window and publish what a scrape shows."""
        horizon = self.context.clock() - self.window_seconds
        with self._lock:
            cosine_min = {}
            for model, recent in self._recent.items():
                while recent and recent[0][0] < horizon:
                    recent.popleft()
                if recent:
                    cosine_min[model] = min(c for _, c in recent)
            self._snapshot = CanarySnapshot(
                cosine_min=cosine_min,
                pins={model: len(self._pins.get(model, {})) for model in self._ids},
                checked={model: self._checked[model] for model in self._ids},
                mismatches={model: self._mismatches[model] for model in self._ids},
                last_seen=dict(self._last_seen),
            )
        return self._snapshot

    def pinned(self, model: str) -> dict[str, np.ndarray]:
        """The current pins of ``model`` (id -> unit vector; the arrays are never changed in place)."""
        with self._lock:
            return dict(self._pins.get(model, {}))

    @property
    def snapshot(self) -> CanarySnapshot:
        """What the last publishing job computed (what a scrape shows)."""
        return self._snapshot

    def collect(self) -> Iterable[Metric]:
        snap = self._snapshot
        families = [
            ("embmon_canary_cosine_min", snap.cosine_min),
            ("embmon_canary_pins", snap.pins),
            ("embmon_canary_last_seen_timestamp_seconds", snap.last_seen),
        ]
        for name, values in families:
            family = catalog.gauge(name)
            for model, value in sorted(values.items()):
                family.add_metric([model], float(value))
            yield family
        for name, counts in (("embmon_canary_records_total", snap.checked),
                             ("embmon_canary_mismatches_total", snap.mismatches)):
            counter = catalog.counter(name)
            for model, count in sorted(counts.items()):
                counter.add_metric([model], float(count))
            yield counter

    # ------------------------------------------------------------------ re-pinning
    def repin(self, model: str) -> dict[str, Any]:
        """Pin each canary of ``model`` to its latest arrival (an intended model change); canaries
        not seen since start are unpinned, so their next arrival pins them. Pins from
        ``pins_file`` are replaced too: the operator said the model changed."""
        if model not in self._ids:
            raise KeyError(model)
        with self._lock:
            latest = dict(self._latest.get(model, {}))
            self._pins[model] = latest
            self._recent.pop(model, None)
            self._save_locked()
        for listener in self.repin_listeners:
            listener(model)
        unpinned = sorted(self._ids[model] - latest.keys())
        logger.warning(
            "canary: pins of model %s replaced by an operator: %d re-pinned to their latest arrival, %d unpinned %s",
            model, len(latest), len(unpinned), unpinned[:10],
        )
        self.publish()
        return {"model": model, "repinned": sorted(latest), "unpinned": unpinned}

    def handle_repin(self, environ: Mapping[str, Any]) -> tuple[int, str, bytes]:
        """``POST /admin/canaries/repin?model=M`` (admin token)."""
        model, _, refused = model_and_stream(environ, stream_allowed=False)
        if refused is not None:
            return refused
        try:
            return json_response(200, self.repin(model))
        except KeyError:
            return json_response(404, {"error": f"model {model!r} has no canaries configured"})

    def _save_locked(self) -> None:
        saveable = {m: {i: v for i, v in ids.items() if (m, i) not in self._fixed} for m, ids in self._pins.items()}
        try:
            self._store.save(saveable)
        except OSError:
            self._log.warning("save", "canary pins could not be saved to %s (kept in memory)", self._store.path)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "checked": dict(self._checked),
                "mismatches": dict(self._mismatches),
                "recent": {m: [[t, c] for t, c in r] for m, r in self._recent.items()},
                "last_seen": dict(self._last_seen),
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        checked = Counter({str(m): checks.count(n, f"canary checks of {m}") for m, n in state["checked"].items()})
        mismatches = Counter({str(m): checks.count(n, f"mismatches of {m}") for m, n in state["mismatches"].items()})
        recent = {
            str(m): deque(
                ((checks.finite(t, "canary time"), checks.finite(c, "canary cosine", -1.01)) for t, c in rows),
                maxlen=MAX_RECENT,
            )
            for m, rows in state["recent"].items()
        }
        last_seen = {str(m): checks.finite(t, f"last canary of {m}") for m, t in dict(state["last_seen"]).items()}
        with self._lock:
            self._checked, self._mismatches, self._recent, self._last_seen = checked, mismatches, recent, last_seen
        self.publish()
