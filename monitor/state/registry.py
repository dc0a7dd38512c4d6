"""Per (model, stream) state and the label budget that keeps it bounded.

The registry is written by the ingest thread and read by the refresh job. Each stream has its own
lock, held by the writer for one batch update and by the reader only while it copies the window's
totals, so ingest never waits on metric computation.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monitor.decoding.records import EmbeddingBatch, StreamKey
from monitor.devices import use_cuda
from monitor.state import checks
from monitor.state.window import SlidingWindow, WindowSnapshot

if TYPE_CHECKING:
    from monitor.config import Settings


@dataclass
class StreamState:
    model: str
    stream: str
    window: SlidingWindow
    records_total: int = 0
    last_record_time: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class StateRegistry:
    """All (model, stream) states, created on first sight within the label budget."""

    def __init__(self, settings: Settings, window_factory: Callable[[str, str, int], SlidingWindow] | None = None):
        self.settings = settings
        self._states: dict[StreamKey, StreamState] = {}
        self._streams_per_model: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._window_factory = window_factory or self._default_window
        # CUDA for large batches' products when configured and present (monitor/devices.py)
        self._device = "cuda" if use_cuda(settings.device) else None

    def _default_window(self, model: str, stream: str, dim: int) -> SlidingWindow:
        w = self.settings.window
        # A per-stream seed derived from the names keeps reservoirs reproducible across restarts.
        seed = (self.settings.seed * 1_000_003 + zlib.crc32(f"{model}\0{stream}".encode())) & 0xFFFFFFFF
        return SlidingWindow(
            dim=dim,
            window_seconds=w.seconds,
            subwindows=w.subwindows,
            reservoir_size=w.reservoir_size,
            seed=seed,
            alignment_alpha=self.settings.quality.alignment_alpha,
            gram_precision=w.gram_precision,
            device=self._device,
            # the drift tests' window sample is full whatever the traffic's shape (state/window.py)
            min_sample=self.settings.drift.window_sample_size if self.settings.drift.enabled else 0,
        )

    def admit(self, model: str, stream: str) -> bool:
        """Whether a (model, stream) may have state: known, or new and within the label budget.

        Admitting a new pair reserves its place, so one poll full of new names cannot overshoot.
        """
        known = self._streams_per_model.get(model)
        if known is not None and stream in known:
            return True
        limits = self.settings.limits
        with self._lock:
            known = self._streams_per_model.get(model)
            if known is None:
                if len(self._streams_per_model) >= limits.max_models:
                    return False
                known = self._streams_per_model[model] = set()
            elif stream not in known and len(known) >= limits.max_streams_per_model:
                return False
            known.add(stream)
        return True

    def admit_model(self, model: str) -> bool:
        """Whether records about ``model`` (e.g. interactions) may be counted under its label."""
        if model in self._streams_per_model:
            return True
        with self._lock:
            if model in self._streams_per_model:
                return True
            if len(self._streams_per_model) >= self.settings.limits.max_models:
                return False
            self._streams_per_model[model] = set()
        return True

    def known_streams(self) -> set[str]:
        """Every stream name that holds (or has reserved) a label under some model."""
        with self._lock:
            return {stream for streams in self._streams_per_model.values() for stream in streams}

    @property
    def models(self) -> list[str]:
        return sorted(self._streams_per_model)

    def apply(self, batch: EmbeddingBatch, now: float) -> StreamState:
        """Fold an admitted batch into its stream's window."""
        state = self._states.get((batch.model, batch.stream))
        if state is None:
            state = self._create(batch.model, batch.stream, batch.dim)
        with state.lock:
            state.window.add(batch, now)
            state.records_total += batch.size
            state.last_record_time = now
        return state

    def _create(self, model: str, stream: str, dim: int) -> StreamState:
        with self._lock:
            state = self._states.get((model, stream))
            if state is None:
                state = StreamState(model, stream, self._window_factory(model, stream, dim))
                self._states[(model, stream)] = state
                self._streams_per_model.setdefault(model, set()).add(stream)  # restored state skips admit
        return state

    def snapshot_windows(self, now: float) -> dict[StreamKey, WindowSnapshot]:
        """A consistent copy of every stream's current window (taken stream by stream)."""
        out: dict[StreamKey, WindowSnapshot] = {}
        for key, state in list(self._states.items()):
            with state.lock:
                out[key] = state.window.snapshot(now)
        return out

    def __iter__(self) -> Iterator[StreamState]:
        return iter(list(self._states.values()))

    def __len__(self) -> int:
        return len(self._states)

    def get(self, model: str, stream: str) -> StreamState | None:
        return self._states.get((model, stream))

    # -- checkpointing ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every stream's window and counters, and the label budget's reservations."""
        streams = []
        for state in self:
            with state.lock:
                streams.append(
                    {
                        "model": state.model,
                        "stream": state.stream,
                        "records_total": state.records_total,
                        "last_record_time": state.last_record_time,
                        "window": state.window.state_dict(),
                    }
                )
        with self._lock:
            labels = {model: sorted(streams) for model, streams in self._streams_per_model.items()}
        return {"streams": streams, "labels": labels}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Install what ``state_dict`` returned into an empty registry.

        Raises ``ValueError`` and changes nothing when a saved window was built with other window
        settings than the running ones (its sums would not mean what the settings say), holds a
        value no run produces (monitor/state/checks.py), or has another dimension than ``dims``
        (the checkpoint's learned model dimensions, when given) says for its model.
        """
        dims: dict[str, int] | None = state.get("dims")
        rebuilt: dict[tuple[str, str], StreamState] = {}
        for entry in state["streams"]:
            model, stream = entry["model"], entry["stream"]
            if not (isinstance(model, str) and isinstance(stream, str)) or (model, stream) in rebuilt:
                raise checks.InvalidState(f"stream {model!r}/{stream!r} is not a pair of names, or appears twice")
            saved = entry["window"]
            dim = checks.integer(saved["dim"], f"{model}/{stream}: dim", 1, self.settings.limits.max_dimension)
            if dims is not None and dims.get(model) != dim:
                raise checks.InvalidState(
                    f"{model}/{stream}: window of dim {dim}, the model's dimension is {dims.get(model)}"
                )
            fresh = self._window_factory(model, stream, dim)
            for attr in ("window_seconds", "subwindows", "reservoir_size", "seed", "alignment_alpha"):
                if getattr(fresh, attr) != saved[attr]:
                    raise ValueError(
                        f"{model}/{stream}: window {attr} is {saved[attr]!r} in the checkpoint, "
                        f"{getattr(fresh, attr)!r} configured"
                    )
            window = SlidingWindow.from_state_dict(saved, min_sample=fresh.min_sample)
            window.use_arithmetic(fresh.gram_precision, fresh.device)
            last = entry.get("last_record_time")
            rebuilt[(model, stream)] = StreamState(
                model, stream, window, checks.count(entry["records_total"], f"{model}/{stream}: records_total"),
                None if last is None else checks.finite(last, f"{model}/{stream}: last_record_time"),
            )
        labels = {str(m): {str(s) for s in streams} for m, streams in dict(state["labels"]).items()}
        with self._lock:
            for stream_state in rebuilt.values():
                self._states[(stream_state.model, stream_state.stream)] = stream_state
                labels.setdefault(stream_state.model, set()).add(stream_state.stream)
            for model, streams in labels.items():
                self._streams_per_model.setdefault(model, set()).update(streams)
