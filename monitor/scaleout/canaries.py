"""Canaries when scaled out: replicas forward canary arrivals, the reducer compares them with its pins.

A single daemon compares each canary record with the vector pinned for its (model, id)
(:mod:`monitor.canary.component`). Scaled out, the canary records of one model land on whatever
replica owns their partition, so the comparison moves to the one place that can hold the pins:

* a replica runs :class:`CanaryArrivals`: each canary record's vector, id and arrival time, filed
  under the sub-window its statistics were counted in, part of the replica's checkpoint and so of
  the publication built from it (:mod:`monitor.scaleout.canary_rows`; :func:`with_arrivals`
  attaches them to the sub-window partials). A replica holds no pins and exports no canary
  gauges;
* the reducer runs :class:`ReducerCanaries`, the single daemon's component fed from the merge
  table instead of the ingest thread: on each publishing job (and before a re-pin) it takes every
  arrival of the replicas' current publications numbered above what it already counted for that
  replica's (model, stream), in arrival-time order, and compares it exactly as one daemon does. Its pins are
  ``canary-pins.json`` in the reducer's state directory (first sightings; ``canaries.pins_file``
  wins), its counters and cosines are in the reducer's checkpoint with the highest number
  counted per replica, taken at the same batch boundary as the merge table, so a restart neither
  recounts nor skips an arrival. Counted per (replica, model, stream), not per replica: in a group
  of reducers a stream taken over from another reducer carries the replica's older numbers, which
  a per-replica high-water mark from this reducer's other streams would skip.
  ``embmon_canary_*`` is exported once per model, by the reducer,
  and ``POST /admin/canaries/repin`` (``embedding-monitor canary repin``) is the reducer's.

Why not pins on the replicas: first sightings of one canary on two partitions would pin two
vectors, a re-pin would have to reach every replica (which would count mismatches against the
old pins until it did), and the vector a re-pin takes, the latest arrival, is on whichever
replica saw it last. The price is the vectors in the partials topic: d × 4 bytes per arrival,
re-sent with their sub-window.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from monitor.canary.component import CanaryComponent, CanarySnapshot
from monitor.component import Component, MonitorContext
from monitor.daemon.features import default_component_factories
from monitor.decoding.records import EmbeddingBatch
from monitor.logs import RateLimitedLog
from monitor.scaleout.canary_rows import MAX_ARRIVALS, CanaryRows, next_seq
from monitor.state import checks

if TYPE_CHECKING:
    from monitor.config import Settings

logger = logging.getLogger(__name__)

ARRIVALS = "canary_arrivals"  # the replica component's name: its key in a checkpoint's components
SubKey = tuple[str, str, int]  # (model, stream, sub-window index)


class CanaryArrivals(Component):
    """A replica's canary records of the live window, by the sub-window that counted them."""

    name = ARRIVALS

    def __init__(self, context: MonitorContext):
        settings = context.settings
        self._ids = {model: frozenset(ids) for model, ids in settings.canaries.ids.items()}
        self.width = settings.window.seconds / settings.window.subwindows
        self.subwindows = settings.window.subwindows
        self._rows: dict[SubKey, list[tuple[int, float, str, np.ndarray]]] = {}
        self._heads: dict[tuple[str, str], int] = {}  # as the window's head: never moves back
        self._seq = 0
        self._lock = threading.Lock()
        self._log = RateLimitedLog(logger, interval=60.0)

    def on_embeddings(self, batch: EmbeddingBatch, now: float) -> None:
        canaries = self._ids.get(batch.model)
        if not canaries or batch.ids is None:
            return
        rows = [i for i, ident in enumerate(batch.ids) if ident in canaries]
        if not rows:
            return
        stream = (batch.model, batch.stream)
        with self._lock:
            # the sub-window SlidingWindow.add counted the batch in (its head, never behind)
            head = max(self._heads.get(stream, math.floor(now / self.width)), math.floor(now / self.width))
            self._heads[stream] = head
            held = self._rows.setdefault((*stream, head), [])
            for i in rows:
                self._seq = next_seq(self._seq, now)
                held.append((self._seq, now, batch.ids[i], batch.vectors[i].copy()))
            if len(held) > MAX_ARRIVALS:
                del held[: len(held) - MAX_ARRIVALS]
                self._log.warning(f"flood:{batch.model}", "more than %d canary records of %s in one sub-window: "
                                  "the oldest are not forwarded", MAX_ARRIVALS, batch.model)
            oldest = head - self.subwindows + 1
            for key in [k for k in self._rows if k[:2] == stream and k[2] < oldest]:
                del self._rows[key]

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "seq": self._seq,
                "heads": [[m, s, h] for (m, s), h in sorted(self._heads.items())],
                "rows": [[m, s, i, CanaryRows.of(rows, len(rows[0][3])).state_dict()]
                         for (m, s, i), rows in sorted(self._rows.items()) if rows],
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        seq = checks.count(state["seq"], "canary sequence number")
        heads = {(str(m), str(s)): checks.integer(h, "canary head", -checks.INT64_MAX) for m, s, h in state["heads"]}
        rows: dict[SubKey, list[tuple[int, float, str, np.ndarray]]] = {}
        for model, stream, index, raw in state["rows"]:
            parsed = CanaryRows.from_state_dict(raw, int(np.asarray(raw["vectors"]).shape[1]))
            rows[(str(model), str(stream), checks.integer(index, "canary sub-window", -checks.INT64_MAX))] = [
                (int(q), float(t), i, v) for q, t, i, v in zip(parsed.seq, parsed.times, parsed.ids, parsed.vectors,
                                                              strict=True)
            ]
        with self._lock:
            self._seq, self._heads, self._rows = seq, heads, rows


def with_arrivals(streams: Sequence[Mapping[str, Any]], arrivals: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """A checkpoint's ``streams`` with each sub-window's canary arrivals attached (``canaries``), as
    the publisher encodes them (the arrivals come from :meth:`CanaryArrivals.state_dict`)."""
    if not arrivals or not arrivals.get("rows"):
        return list(streams)
    by_key = {(str(m), str(s), int(i)): raw for m, s, i, raw in arrivals["rows"]}
    out: list[Mapping[str, Any]] = []
    for entry in streams:
        model, stream, window = str(entry["model"]), str(entry["stream"]), entry["window"]
        live = [{**sub, "canaries": by_key[key]} if (key := (model, stream, int(sub["index"]))) in by_key else sub
                for sub in window["live"]]
        out.append({**entry, "window": {**window, "live": live}})
    return out


def replica_component_factories(settings: Settings) -> list[Callable[[MonitorContext], Component]]:
    """What a replica runs: the canary forwarder when canaries are configured (drift and probes run
    on the reducer, whose answers are not partial)."""
    return [CanaryArrivals] if settings.canaries.enabled else []


class ReducerCanaries(CanaryComponent):
    """The canary component on the reducer: fed from the replicas' publications (module docstring)."""

    def __init__(self, context: MonitorContext, extra_ids: Mapping[str, Iterable[str]] | None = None):
        # (replica, model, stream) -> highest arrival number compared there
        self._counted: dict[tuple[str, str, str], int] = {}
        self._floor: dict[str, int] = {}  # replica -> high-water mark of a checkpoint from before the split
        self._feed_lock = threading.Lock()
        # set by the reducer once its intake exists: feeding runs between two polls, as captures do
        self.boundary: Callable[[Callable[[], Any]], Any] | None = None
        super().__init__(context, extra_ids)

    def _arrivals(self) -> Iterable[tuple[str, str, str, CanaryRows]]:
        arrivals = getattr(self.context.registry, "canary_arrivals", None)
        return arrivals() if arrivals is not None else ()

    def feed(self) -> int:
        """Compare every arrival not compared yet; returns how many were."""
        if self.boundary is None:
            return self._feed()
        return int(self.boundary(self._feed))

    def _feed(self) -> int:
        with self._feed_lock:
            new: list[tuple[float, str, int, str, str, str, np.ndarray]] = []
            for replica, model, stream, rows in self._arrivals():
                after = max(self._counted.get((replica, model, stream), -1), self._floor.get(replica, -1))
                for q, t, ident, vector in zip(rows.seq, rows.times, rows.ids, rows.vectors, strict=True):
                    if int(q) > after:
                        new.append((float(t), replica, int(q), model, stream, ident, vector))
            new.sort(key=lambda a: (a[0], a[1], a[2]))
            for t, replica, q, model, stream, ident, vector in new:
                self.on_embeddings(EmbeddingBatch(model, "", vector[None, :], ids=(ident,)), t)
                key = (replica, model, stream)
                self._counted[key] = max(self._counted.get(key, -1), q)
            return len(new)

    def publish(self) -> CanarySnapshot:
        if hasattr(self, "_feed_lock"):
            self.feed()
        return super().publish()

    def repin(self, model: str) -> dict[str, Any]:
        """Re-pin to the latest arrival any replica published (compared first, so none is left out)."""
        self.feed()
        return super().repin(model)

    def state_dict(self) -> dict[str, Any]:
        with self._feed_lock:
            return {**super().state_dict(), "counted_streams": [[*key, q] for key, q in sorted(self._counted.items())],
                    "counted": dict(self._floor)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        # "counted": per replica, as written before the count was split by stream; kept as a floor
        floor = {str(r): checks.count(q, f"canaries counted of {r}")
                 for r, q in dict(state.get("counted") or {}).items()}
        counted = {(str(r), str(m), str(s)): checks.count(q, f"canaries counted of {r} on {m}/{s}")
                   for r, m, s, q in state.get("counted_streams") or ()}
        with self._feed_lock:
            before = self._counted, self._floor
            self._counted, self._floor = counted, floor
        try:
            super().load_state_dict(state)  # then publishes, comparing what the restored table holds beyond
        except Exception:
            with self._feed_lock:
                self._counted, self._floor = before
            raise


Factory = Callable[[MonitorContext], Component]


def for_reducer(settings: Settings) -> list[Factory]:
    """The reducer's components: the canary component is the one fed from the merge table, also
    the one the serving probe feeds, so the probe runs where the pins are."""
    return default_component_factories(settings, ReducerCanaries)
