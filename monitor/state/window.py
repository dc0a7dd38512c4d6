"""A sliding processing-time window over one (model, stream), built from tumbling sub-windows.

Exact statistics cannot be "un-added" cheaply, but they can be summed. So the window is cut into
``subwindows`` tumbling sub-windows; each keeps its own ``SufficientStats``, reservoir share and
alignment sums, and the window is the sum of the live ones. Expiring old data is dropping a
sub-window, and memory is bounded by ``subwindows`` regardless of stream length.

Window semantics (also in docs/metrics.md):

* Sub-window k covers processing time ``[k·w, (k + 1)·w)`` with ``w = window_seconds /
  subwindows``; boundaries are multiples of ``w`` (not relative to start-up), so all streams
  and restarts agree on them.
* At time ``now`` with ``h = floor(now / w)`` the window holds sub-windows ``h − subwindows + 1
  … h``: the current, partial one plus the previous ``subwindows − 1`` full ones. It therefore
  spans between ``window_seconds − w`` and ``window_seconds`` of traffic.
* Processing time never runs backwards here: a ``now`` earlier than the newest sub-window seen
  is counted in that newest sub-window.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.decoding.records import EmbeddingBatch
from monitor.state import checks
from monitor.state.pairs import PositivePairMatcher
from monitor.state.reservoir import Reservoir, uniform_sample
from monitor.state.stats import GramPrecision, SufficientStats, check_precision

logger = logging.getLogger(__name__)

__all__ = ["SlidingWindow", "WindowSnapshot"]

_STATE_VERSION = 1
MAX_MIN_SAMPLE = 100_000  # drift.window_sample_size's bound: what a restored state may ask for
_INDEX_MASK = (1 << 62) - 1  # seed sequences need non-negative entropy


@dataclass(frozen=True)
class WindowSnapshot:
    """Everything the intrinsic metrics need from one window, detached from live state.

    Attributes
    ----------
    stats : SufficientStats
        Exact sums over every record in the window (a private copy).
    sample : ndarray, float32 (m, d)
        A sample in which every record of the window had the same inclusion probability, in
        random order (so any prefix is itself such a sample). Shared with the window (its closed
        sub-windows keep their rows only here): read it, never write to it.
    sample_ids : tuple
        Ids of the sample rows (``None`` where a record had no id).
    alignment_sum, alignment_pairs :
        Σ ‖u₁ − u₂‖^α and the number of positive pairs that completed inside the window.
    start, end : float
        Processing-time bounds: start of the oldest live sub-window slot, and ``now``.
    records : int
        Number of records in the window (``stats.count``).
    """

    stats: SufficientStats
    sample: np.ndarray
    sample_ids: tuple[str | None, ...]
    alignment_sum: float
    alignment_pairs: int
    start: float
    end: float
    records: int
    dim: int
    alignment_alpha: float = 2.0
    live_subwindows: int = 0
    pending_pairs: int = 0
    pending_pairs_evicted: int = 0


@dataclass
class _SubWindow:
    """One tumbling slice of the window: exact stats, a reservoir share and alignment sums."""

    index: int
    stats: SufficientStats
    reservoir: Reservoir
    alignment_sum: float = 0.0
    alignment_pairs: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "stats": self.stats.state_dict(),
            "reservoir": self.reservoir.state_dict(),
            "alignment_sum": self.alignment_sum,
            "alignment_pairs": self.alignment_pairs,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], window: SlidingWindow) -> _SubWindow:
        """Rebuild one of ``window``'s sub-windows; its sizes are checked before anything is allocated."""
        reservoir = state["reservoir"]
        # a sub-window written before min_sample was raised (or lowered) keeps its capacity until it expires
        capacities = {window.subwindow_capacity, -(-window.reservoir_size // window.subwindows)}
        if reservoir["capacity"] not in capacities | {window.min_sample} or reservoir["dim"] != window.dim:
            raise checks.InvalidState("sub-window state does not match the window configuration")
        sub = cls(
            index=checks.integer(state["index"], "sub-window index", -checks.INT64_MAX),
            stats=SufficientStats.from_state_dict(state["stats"]),
            reservoir=Reservoir.from_state_dict(reservoir),
            alignment_sum=checks.finite(state["alignment_sum"], "alignment_sum", low=0.0),
            alignment_pairs=checks.count(state["alignment_pairs"], "alignment_pairs"),
        )
        if sub.stats.dim != window.dim:
            raise checks.InvalidState(f"sub-window statistics of dim {sub.stats.dim} in a window of dim {window.dim}")
        return sub


class SlidingWindow:
    """Sliding processing-time window of ``window_seconds`` over tumbling sub-windows.

    Parameters
    ----------
    dim : int
        Vector dimension of the stream.
    window_seconds : float
        Nominal window length.
    subwindows : int
        Number of tumbling sub-windows (the memory bound: at most this many are held).
    reservoir_size : int
        Target window sample size; each sub-window keeps ``ceil(reservoir_size / subwindows)`` rows,
        or ``min_sample`` where that is more.
    min_sample : int
        The largest sample a reader takes from the window (the drift tests' ``window_sample_size``).
        A window sample holds at least min(this, records) rows whatever the traffic's shape: with
        per-sub-window shares alone, a burst inside one sub-window would leave the sample at one
        share (the rest of the window cannot be sampled more densely than the burst). Memory:
        at most ``subwindows × max(ceil(reservoir_size / subwindows), min_sample)`` rows.
    seed : int
        Seeds every sub-window's reservoir and the snapshot subsampling (deterministic runs).
    alignment_alpha : float
        Exponent α of the alignment distance ‖u₁ − u₂‖^α.
    max_pending_pairs : int
        Bound on first halves of positive pairs waiting for their partner.
    gram_precision : {"float64", "float32"}
        Arithmetic of each sub-window's second-moment product (``SufficientStats``); a setting
        of the running daemon, not of the data, so a checkpoint restores under either.
    device : str, optional
        A CUDA device for the products of large batches (``"cuda"`` where :func:`monitor.devices.use_cuda`
        says so); None: CPU.

    Examples
    --------
    >>> from monitor.decoding.records import EmbeddingBatch
    >>> rng = np.random.default_rng(0)
    >>> window = SlidingWindow(dim=4, window_seconds=60, subwindows=6, reservoir_size=12)
    >>> for t in range(0, 120, 5):
    ...     vectors = rng.standard_normal((10, 4)).astype(np.float32)
    ...     window.add(EmbeddingBatch("m", "s", vectors), now=float(t))
    >>> snap = window.snapshot(now=120.0)  # holds sub-windows [70, 80) ... [120, 130)
    >>> snap.records, snap.start, snap.end, snap.live_subwindows
    (100, 70.0, 120.0, 5)
    """

    def __init__(
        self,
        dim: int,
        window_seconds: float = 900.0,
        subwindows: int = 10,
        reservoir_size: int = 10_000,
        seed: int = 0,
        alignment_alpha: float = 2.0,
        max_pending_pairs: int = 10_000,
        gram_precision: GramPrecision = "float64",
        device: str | None = None,
        min_sample: int = 0,
    ) -> None:
        if int(dim) < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if not (window_seconds > 0 and math.isfinite(window_seconds)):
            raise ValueError(f"window_seconds must be positive and finite, got {window_seconds!r}")
        if int(subwindows) < 1:
            raise ValueError(f"subwindows must be at least 1, got {subwindows!r}")
        if int(reservoir_size) < 0:
            raise ValueError(f"reservoir_size must be non-negative, got {reservoir_size!r}")
        if int(seed) < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if int(min_sample) < 0:
            raise ValueError(f"min_sample must be non-negative, got {min_sample!r}")
        self.dim = int(dim)
        self.window_seconds = float(window_seconds)
        self.subwindows = int(subwindows)
        self.reservoir_size = int(reservoir_size)
        self.min_sample = int(min_sample)
        self.seed = int(seed)
        self.alignment_alpha = float(alignment_alpha)
        self.max_pending_pairs = int(max_pending_pairs)
        self.gram_precision = check_precision(gram_precision)
        self.device = device
        self._pairs = PositivePairMatcher(self.max_pending_pairs, self.alignment_alpha)
        self._live: dict[int, _SubWindow] = {}  # sub-window index -> sub-window
        self._head: int | None = None  # index of the newest sub-window reached
        self._records_total = 0

    # -- geometry -------------------------------------------------------------------------

    @property
    def subwindow_seconds(self) -> float:
        """Width ``w`` of one tumbling sub-window."""
        return self.window_seconds / self.subwindows

    @property
    def subwindow_capacity(self) -> int:
        """Reservoir rows per sub-window: ``ceil(reservoir_size / subwindows)``, at least ``min_sample``."""
        return max(-(-self.reservoir_size // self.subwindows), self.min_sample)

    @property
    def sample_limit(self) -> int:
        """Rows a snapshot's sample holds at most (about this many once the window has them)."""
        return max(self.reservoir_size, self.min_sample)

    @property
    def live_subwindows(self) -> int:
        """Number of sub-windows currently held (never more than ``subwindows``)."""
        return len(self._live)

    @property
    def pending_pairs(self) -> int:
        return self._pairs.pending

    @property
    def pending_pairs_evicted(self) -> int:
        """Lifetime count of pair halves evicted unmatched because too many were waiting."""
        return self._pairs.evicted

    def _advance(self, now: float) -> int:
        """Move the head to ``now``'s sub-window (never backwards) and drop expired ones."""
        index = math.floor(now / self.subwindow_seconds)
        if self._head is None or index > self._head:
            self._head = index
        oldest_live = self._head - self.subwindows + 1
        for expired in [k for k in self._live if k < oldest_live]:
            del self._live[expired]
        return self._head

    def _subwindow(self, index: int) -> _SubWindow:
        current = self._live.get(index)
        if current is None:
            rng = np.random.default_rng([self.seed, 0, index & _INDEX_MASK])
            current = _SubWindow(
                index=index,
                stats=SufficientStats(self.dim, self.gram_precision, self.device),
                reservoir=Reservoir(self.subwindow_capacity, self.dim, rng),
            )
            self._live[index] = current
        return current

    # -- ingest ---------------------------------------------------------------------------

    def add(self, batch: EmbeddingBatch, now: float) -> None:
        """Account one validated batch at processing time ``now`` (unix seconds)."""
        vectors = batch.vectors
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"batch has shape {vectors.shape}, window expects dim {self.dim}")
        if vectors.shape[0] == 0:
            self._advance(now)
            return
        sub = self._subwindow(self._advance(now))
        norms = batch.norms
        if norms is None:
            norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64))
        sub.stats.update(vectors, norms=norms)
        sub.reservoir.add(vectors, batch.ids)
        if batch.pair_ids is not None:
            rows = [i for i, pair_id in enumerate(batch.pair_ids) if pair_id is not None]
            ids = [pair_id for pair_id in batch.pair_ids if pair_id is not None]
            if rows:
                units = vectors[rows] / norms[rows, None]
                total, pairs = self._pairs.match(units, ids)
                sub.alignment_sum += total
                sub.alignment_pairs += pairs
        self._records_total += vectors.shape[0]

    # -- reading --------------------------------------------------------------------------

    def snapshot(self, now: float) -> WindowSnapshot:
        """Merge the live sub-windows into a detached ``WindowSnapshot``.

        The sample gives every record of the window the same inclusion probability ``p``. A
        sub-window j with n_j records holds r_j = min(n_j, cap) of them, i.e. each with
        probability r_j/n_j; so p = min_j r_j/n_j and sub-window j contributes a uniform subset
        of p·n_j of its rows (randomised rounding keeps the expectation exact). Consequence: a
        burst in one sub-window lowers p and shrinks the whole window's sample; the sample size
        is reported so operators can see it.
        """
        head = self._advance(now)
        live = [self._live[k] for k in sorted(self._live)]
        if live:
            stats = SufficientStats.merged([sub.stats for sub in live])
        else:
            stats = SufficientStats(self.dim, self.gram_precision)
        alignment_sum, alignment_pairs = 0.0, 0
        for sub in live:
            alignment_sum += sub.alignment_sum
            alignment_pairs += sub.alignment_pairs
        sample, sample_ids = self._uniform_sample(live, head)
        width = self.subwindow_seconds
        return WindowSnapshot(
            stats=stats,
            sample=sample,
            sample_ids=sample_ids,
            alignment_sum=alignment_sum,
            alignment_pairs=alignment_pairs,
            start=(head - self.subwindows + 1) * width,
            end=max(float(now), head * width),
            records=stats.count,
            dim=self.dim,
            alignment_alpha=self.alignment_alpha,
            live_subwindows=len(live),
            pending_pairs=self._pairs.pending,
            pending_pairs_evicted=self._pairs.evicted,
        )

    def _uniform_sample(
        self, live: list[_SubWindow], head: int
    ) -> tuple[np.ndarray, tuple[str | None, ...]]:
        # Deterministic for a given window state, so repeated snapshots agree.
        rng = np.random.default_rng([self.seed, 1, self._records_total, head & _INDEX_MASK])
        closed = [sub.index < head for sub in live]
        return uniform_sample([sub.reservoir for sub in live], self.dim, rng, share=closed, limit=self.sample_limit)

    # -- checkpointing --------------------------------------------------------------------

    def use_arithmetic(self, precision: GramPrecision, device: str | None) -> None:
        """Update every sub-window with ``precision`` on ``device`` from now on (a restored window
        adopts the running configuration; the sums already held stay valid in either)."""
        self.gram_precision = check_precision(precision)
        self.device = device
        for sub in self._live.values():
            sub.stats.precision, sub.stats.device = self.gram_precision, device

    def state_dict(self) -> dict[str, Any]:
        """Configuration, sub-windows (stats, reservoirs with RNG state) and pending pairs."""
        return {
            "version": _STATE_VERSION,
            "dim": self.dim,
            "window_seconds": self.window_seconds,
            "subwindows": self.subwindows,
            "reservoir_size": self.reservoir_size,
            "min_sample": self.min_sample,
            "seed": self.seed,
            "alignment_alpha": self.alignment_alpha,
            "max_pending_pairs": self.max_pending_pairs,
            "head": self._head,
            "records_total": self._records_total,
            "live": [self._live[k].state_dict() for k in sorted(self._live)],
            "pairs": self._pairs.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], min_sample: int | None = None) -> SlidingWindow:
        """Rebuild a window from ``state_dict()`` output; ``ValueError`` names what does not fit
        (monitor/state/checks.py). ``min_sample``: the one configured now (new sub-windows take it;
        restored ones keep the capacity they were written with); default: the stored one."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported window state version {state.get('version')!r}")
        window = cls(
            dim=checks.integer(state["dim"], "window dim", 1),
            window_seconds=checks.finite(state["window_seconds"], "window_seconds"),
            subwindows=checks.integer(state["subwindows"], "subwindows", 1),
            reservoir_size=checks.count(state["reservoir_size"], "reservoir_size"),
            seed=checks.count(state["seed"], "seed"),
            alignment_alpha=checks.finite(state["alignment_alpha"], "alignment_alpha"),
            max_pending_pairs=checks.count(state["max_pending_pairs"], "max_pending_pairs"),
            min_sample=checks.integer(state.get("min_sample", 0), "min_sample", 0, MAX_MIN_SAMPLE),
        )
        head = state["head"]
        window._head = None if head is None else checks.integer(head, "head", -checks.INT64_MAX)
        window._records_total = checks.count(state["records_total"], "window records_total")
        if len(state["live"]) > window.subwindows:
            raise checks.InvalidState("window state holds more sub-windows than configured")
        for sub_state in state["live"]:
            sub = _SubWindow.from_state_dict(sub_state, window)
            if window._head is None or sub.index > window._head or sub.index in window._live:
                raise checks.InvalidState(f"sub-window {sub.index} repeated or after the window's head {window._head}")
            window._live[sub.index] = sub
        if sum(sub.stats.count for sub in window._live.values()) > window._records_total:
            raise checks.InvalidState(
                f"the sub-windows hold more records than the window's total {window._records_total}"
            )
        window._pairs = PositivePairMatcher.from_state_dict(state["pairs"], window.dim)
        if min_sample is not None:
            window.min_sample = min_sample
        return window
