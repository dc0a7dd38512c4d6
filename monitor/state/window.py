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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from monitor.records import EmbeddingBatch
from monitor.state.reservoir import Reservoir
from monitor.state.stats import GramPrecision, SufficientStats, check_precision

logger = logging.getLogger(__name__)

__all__ = ["PositivePairMatcher", "SlidingWindow", "WindowSnapshot", "uniform_sample"]

_STATE_VERSION = 1
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


class PositivePairMatcher:
    """Matches the two halves of positive pairs by ``pair_id`` and sums ‖u₁ − u₂‖^α.

    The first record seen with a pair id waits (as a float32 unit vector) until a second record
    with the same id arrives; then the pair's distance is returned and the id is forgotten, so a
    third record with that id starts a new pair. At most ``max_pending`` halves wait; beyond
    that the oldest are evicted and counted in ``evicted``.

    Examples
    --------
    >>> matcher = PositivePairMatcher(max_pending=10, alpha=2.0)
    >>> units = np.eye(2)
    >>> matcher.match(units[[0]], ["q1"])
    (0.0, 0)
    >>> total, pairs = matcher.match(units[[1]], ["q1"])
    >>> round(total, 6), pairs
    (2.0, 1)
    """

    def __init__(self, max_pending: int, alpha: float) -> None:
        if int(max_pending) < 0:
            raise ValueError(f"max_pending_pairs must be non-negative, got {max_pending!r}")
        if not alpha > 0:
            raise ValueError(f"alignment_alpha must be positive, got {alpha!r}")
        self.max_pending = int(max_pending)
        self.alpha = float(alpha)
        self.evicted = 0
        # pair id -> waiting unit vector (float32), oldest first (dicts keep insertion order).
        self._pending: dict[str, np.ndarray | int] = {}

    @property
    def pending(self) -> int:
        """Number of first halves waiting for their partner."""
        return len(self._pending)

    def match(self, unit_vectors: np.ndarray, pair_ids: Sequence[str]) -> tuple[float, int]:
        """Feed rows (unit vectors) in stream order; return (Σ distance^α, pairs completed)."""
        if len(pair_ids) != len(unit_vectors):
            raise ValueError(f"got {len(pair_ids)} pair ids for {len(unit_vectors)} rows")
        firsts: list[np.ndarray | int] = []
        seconds: list[int] = []
        added: list[str] = []
        for row, pair_id in enumerate(pair_ids):
            partner = self._pending.pop(pair_id, None)
            if partner is None:
                self._pending[pair_id] = row  # a row of this batch, copied below if it stays
                added.append(pair_id)
            else:
                firsts.append(partner)
                seconds.append(row)

        while len(self._pending) > self.max_pending:
            del self._pending[next(iter(self._pending))]
            self.evicted += 1
        for pair_id in added:
            waiting = self._pending.get(pair_id)
            if isinstance(waiting, int):
                self._pending[pair_id] = np.array(unit_vectors[waiting], dtype=np.float32)

        if not seconds:
            return 0.0, 0
        first_rows = np.stack(
            [unit_vectors[p] if isinstance(p, int) else p for p in firsts]
        ).astype(np.float64)
        diff = first_rows - np.asarray(unit_vectors[seconds], dtype=np.float64)
        sq_dist = np.einsum("ij,ij->i", diff, diff)
        return float(np.sum(sq_dist ** (self.alpha / 2.0))), len(seconds)

    def state_dict(self) -> dict[str, Any]:
        ids = list(self._pending)
        vectors = [self._pending[i] for i in ids]
        return {
            "max_pending": self.max_pending,
            "alpha": self.alpha,
            "evicted": self.evicted,
            "ids": ids,
            "vectors": np.stack(vectors) if vectors else None,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PositivePairMatcher:
        matcher = cls(int(state["max_pending"]), float(state["alpha"]))
        matcher.evicted = int(state["evicted"])
        ids = list(state["ids"])
        vectors = state["vectors"]
        if ids:
            vectors = np.asarray(vectors, dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(ids):
                raise ValueError("pending pair state has mismatched ids and vectors")
            matcher._pending = {pair_id: vectors[i].copy() for i, pair_id in enumerate(ids)}
        return matcher


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
    def from_state_dict(cls, state: dict[str, Any]) -> _SubWindow:
        return cls(
            index=int(state["index"]),
            stats=SufficientStats.from_state_dict(state["stats"]),
            reservoir=Reservoir.from_state_dict(state["reservoir"]),
            alignment_sum=float(state["alignment_sum"]),
            alignment_pairs=int(state["alignment_pairs"]),
        )


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
        Target window sample size; each sub-window keeps ``ceil(reservoir_size / subwindows)``.
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
    >>> from monitor.records import EmbeddingBatch
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
        self.dim = int(dim)
        self.window_seconds = float(window_seconds)
        self.subwindows = int(subwindows)
        self.reservoir_size = int(reservoir_size)
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
        """Reservoir rows per sub-window: ``ceil(reservoir_size / subwindows)``."""
        return -(-self.reservoir_size // self.subwindows)

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
            if rows:
                units = vectors[rows] / norms[rows, None]
                total, pairs = self._pairs.match(units, [batch.pair_ids[i] for i in rows])
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
        return uniform_sample([sub.reservoir for sub in live], self.dim, rng, share=closed)

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
            "seed": self.seed,
            "alignment_alpha": self.alignment_alpha,
            "max_pending_pairs": self.max_pending_pairs,
            "head": self._head,
            "records_total": self._records_total,
            "live": [self._live[k].state_dict() for k in sorted(self._live)],
            "pairs": self._pairs.state_dict(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SlidingWindow:
        """Rebuild a window from ``state_dict()`` output."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported window state version {state.get('version')!r}")
        window = cls(
            dim=state["dim"],
            window_seconds=state["window_seconds"],
            subwindows=state["subwindows"],
            reservoir_size=state["reservoir_size"],
            seed=state["seed"],
            alignment_alpha=state["alignment_alpha"],
            max_pending_pairs=state["max_pending_pairs"],
        )
        window._head = None if state["head"] is None else int(state["head"])
        window._records_total = int(state["records_total"])
        for sub_state in state["live"]:
            sub = _SubWindow.from_state_dict(sub_state)
            if sub.stats.dim != window.dim or sub.reservoir.capacity != window.subwindow_capacity:
                raise ValueError("sub-window state does not match the window configuration")
            window._live[sub.index] = sub
        window._pairs = PositivePairMatcher.from_state_dict(state["pairs"])
        if len(window._live) > window.subwindows:
            raise ValueError("window state holds more sub-windows than configured")
        return window


def uniform_sample(
    reservoirs: Sequence[Reservoir],
    dim: int,
    rng: np.random.Generator,
    share: Sequence[bool] | None = None,
) -> tuple[np.ndarray, tuple[str | None, ...]]:
    """One sample of the union of several reservoirs' streams, every record equally likely.

    Reservoir j saw n_j records and holds r_j = min(n_j, capacity) of them, each with
    probability r_j/n_j; so p = min_j r_j/n_j and reservoir j contributes a uniform subset of
    p·n_j of its rows (randomised rounding keeps the expectation exact). The pieces may be the
    sub-windows of one window or those of several replicas (the reducer merges those).
    Returns the rows in random order (any prefix is itself such a sample) and their ids.
    A reservoir marked in ``share`` (one that takes no more records: a closed sub-window) whose
    every row is taken keeps its rows only inside the returned sample, which saves a copy.

    >>> rng = np.random.default_rng(0)
    >>> a, b = Reservoir(4, 2, rng), Reservoir(4, 2, rng)
    >>> _ = a.add(np.ones((8, 2), dtype=np.float32)); _ = b.add(np.zeros((2, 2), dtype=np.float32))
    >>> sample, ids = uniform_sample([a, b], 2, np.random.default_rng(1))
    >>> len(sample)  # p = min(4/8, 2/2) = 0.5: 4 rows of a, 1 of b
    5
    """
    seen = np.array([r.seen for r in reservoirs], dtype=np.int64)
    held = np.array([r.size for r in reservoirs], dtype=np.int64)
    if seen.sum() == 0 or held.sum() == 0:
        return np.empty((0, dim), dtype=np.float32), ()
    nonempty = seen > 0
    p = float(np.min(held[nonempty] / seen[nonempty]))
    share = share if share is not None else [False] * len(reservoirs)
    parts: list[np.ndarray] = []
    ids: list[str | None] = []
    whole: list[tuple[Reservoir, int]] = []  # shareable reservoirs whose every held row is taken
    for reservoir, n_j, r_j, shareable in zip(reservoirs, seen, held, share, strict=True):
        if n_j == 0:
            continue
        take = _randomised_round(p * n_j, int(r_j), rng)
        chosen = np.sort(rng.choice(int(r_j), size=take, replace=False))
        if take == r_j and shareable:
            whole.append((reservoir, sum(len(part) for part in parts)))
        parts.append(reservoir.take(chosen))
        reservoir_ids = reservoir.ids
        ids.extend(reservoir_ids[i] for i in chosen)
    total = sum(len(part) for part in parts)
    order = rng.permutation(total)
    sample = np.concatenate(parts)[order]
    position = np.empty(total, dtype=np.int64)
    position[order] = np.arange(total)
    for reservoir, start in whole:
        reservoir.share(sample, position[start : start + reservoir.size])
    return sample, tuple(ids[i] for i in order)


def _randomised_round(value: float, ceiling: int, rng: np.random.Generator) -> int:
    """floor(value) plus a Bernoulli(frac) draw, so the expectation is exactly ``value``."""
    nearest = round(value)
    if abs(value - nearest) < 1e-9:
        return min(int(nearest), ceiling)
    base = math.floor(value)
    return min(base + int(rng.random() < value - base), ceiling)
