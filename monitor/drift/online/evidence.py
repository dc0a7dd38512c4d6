"""Evidence that accumulates: a change detector that bets on conformal p-values of the reference's cells.

The drift suite decides on one window at a time and forgets it, so a shift too small for one
window is missed in every window. This detector keeps the evidence. Each fresh row (a row of a
sub-window that no earlier cycle saw: every row is bet on once, so overlapping windows never
count the same row twice) is turned into a *conformal p-value*, the evidence in a cycle's rows is
a product of bets on those p-values, and a Shiryaev–Roberts statistic accumulates the cycles'
evidence with a false-alarm guarantee that holds however long the stream runs.

Conformal p-values. The rows' score is a *cell* fixed before the stream from one half of the
reference: their region (:class:`~monitor.drift.attribution.regions.Regions`: the nearest of the k
centres fitted on that half) or, finer, an :class:`EvidenceCells` code (the region in several
partitions, the side of principal directions, far or not). The *bag* starts with the cell counts
of the reference's other, held-out half and takes in every stream row after it is scored. A row
of cell ``b`` arriving when the bag holds ``N`` rows, ``G`` of them in a cell numbered above ``b``
and ``C`` in ``b``, gets ``p = (G + U (C + 1)) / (N + 1)`` with ``U`` uniform on (0, 1) (Vovk,
Gammerman & Shafer 2005, smoothed conformal p-values). When the held-out reference rows and the
stream rows are exchangeable (in particular: independent draws from one distribution), these
p-values are independent and uniform on (0, 1), exactly, whatever the cells or the distribution
are (Vovk et al. 2003).

Betting: a mixture. Before each cycle the detector fixes, from the past alone, several densities
on [0, 1] that integrate to one. The *adaptive* bet gives the interval of cell ``b``'s p-values (its
share ``π_b`` of the bag, by cell number) the height ``(1 - λ) + λ q_b / π_b``, ``q_b`` a forgetful
estimate of the recent stream's share (a prior of ``prior_rows`` rows at the bag's shares plus the
recent rows' counts, each cycle's weighing ``forget`` times the last). Each *alternative* set of
cells ``S`` (``sets``: by default each cell alone; :meth:`EvidenceCells.sets`: each region of each
partition, each side of each direction, the far rows) and stake ``λ`` in ``lambdas`` gives
``1 + λ (1{p in S} / w_S - 1)``, ``w_S`` the bag's share of ``S``. A cycle's evidence ``e_t`` for a
bet is the product of its rows' ``f(p)``.

Accumulation. Each bet runs a Shiryaev–Roberts statistic ``R_t = (1 + R_{t-1}) e_t`` (``R_0 = 0``);
the detector's statistic is their average, which alarms when it reaches ``A`` and restarts every
bet at 0. Every bet is a function of past p-values only: its cells are intervals of [0, 1] fixed
once, from the reference's held-out counts (cell ``b``: region ``b``'s share of them), ``q_b`` counts
the past p-values that fell in each, and ``w_S`` is the fixed cells' width. So under no change
``R_t - t`` is a martingale with respect to the p-values, for each bet and for the average, and the
mean number of cycles to a false alarm is at least ``A`` (optional stopping; Shin, Ramdas & Rinaldo
2023, e-detectors), exactly. (Cells taken from the growing bag would read the past rows' regions,
which say slightly more than their p-values; fixed cells give that up, and only lose the alignment
of a region's p-values with its cell as the bag drifts from the reference.) ``log_evidence`` is the
log of the average, exported per stream.

Assumptions, stated where the guarantee is used (docs/drift.md, "Evidence that accumulates"):
the held-out reference rows and every stream row since the detector started are exchangeable
(the stream has the reference's distribution and its rows are independent); the cells and
their held-out counts do not change (a new reference starts a new detector). Not assumed: any
model of the embeddings or the number of rows per cycle.

numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_LAMBDA = 0.5
DEFAULT_FORGET = 0.8
DEFAULT_PRIOR_ROWS = 200.0
DEFAULT_LAMBDAS = (0.02, 0.05, 0.1, 0.2, 0.4)
_CHUNK_ROWS = 512  # rows per block of the conformal p-values of one stream


@dataclass(frozen=True)
class EvidenceStep:
    """One cycle's outcome: its rows' log-evidence, the statistic after it, and whether it alarmed."""

    rows: int
    log_e: float
    log_evidence: float
    alarmed: bool


def conformal_p_values(labels: np.ndarray, bag: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Smoothed conformal p-values of ``labels`` (n,), scored in order, each against ``bag`` and the rows before it.

    ``bag`` (k,) holds the counts per label before the first row; it is not changed. Also for many
    streams at once: ``labels`` (S, n) against ``bag`` (S, k) gives (S, n).

    Examples
    --------
    >>> p = conformal_p_values(np.array([0, 1]), np.array([3, 1]), np.random.default_rng(0))
    >>> bool(1 / 5 <= p[0] <= 1.0), bool(0.0 <= p[1] <= 2 / 6)
    (True, True)
    """
    labels = np.asarray(labels, dtype=np.int64)
    bag = np.asarray(bag)
    k = bag.shape[-1]
    if labels.ndim == 1 and len(labels) > _CHUNK_ROWS:
        # the same values in chunks that stay in cache (the (n, k) counts of 10,000 rows do not):
        # each chunk against the bag plus the rows before it, the uniforms drawn in the same order
        parts, bag = [], bag.copy()
        for start in range(0, len(labels), _CHUNK_ROWS):
            chunk = labels[start : start + _CHUNK_ROWS]
            parts.append(conformal_p_values(chunk, bag, rng))
            bag = bag + np.bincount(chunk, minlength=k)
        return np.concatenate(parts)
    onehot = (labels[..., None] == np.arange(k)).astype(np.int64)  # (..., n, k)
    before = np.cumsum(onehot, axis=-2) - onehot + bag[..., None, :]  # counts before each row, bag included
    at_least = np.cumsum(before[..., ::-1], axis=-1)[..., ::-1]  # at_least[..., b]: rows with a label >= b
    equal = np.take_along_axis(before, labels[..., None], axis=-1)[..., 0]
    greater = np.take_along_axis(at_least, labels[..., None], axis=-1)[..., 0] - equal
    total = before.sum(axis=-1)
    return (greater + rng.random(labels.shape) * (equal + 1)) / (total + 1)


def bet_density(bag: np.ndarray, recent: np.ndarray, bet: float, prior_rows: float) -> tuple[np.ndarray, np.ndarray]:
    """The bet fixed from the past: cell edges (..., k + 1), decreasing, and heights (..., k).

    Region ``b``'s cell is ``[edges[b + 1], edges[b])``, its share of the bag in region order from
    the top (its p-values lie above those of the regions numbered after it); its height is
    ``(1 - bet) + bet · q_b / π_b`` (module docstring). The heights times the cell widths sum to 1.
    """
    shares = bag / bag.sum(axis=-1, keepdims=True)
    predicted = (prior_rows * shares + recent) / (prior_rows + recent.sum(axis=-1, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(shares > 0, predicted / np.where(shares > 0, shares, 1.0), 1.0)
    heights = (1.0 - bet) + bet * ratio
    tail = np.cumsum(shares[..., ::-1], axis=-1)[..., ::-1]  # tail[..., b]: share of regions >= b
    edges = np.concatenate([np.ones_like(tail[..., :1]), tail[..., 1:], np.zeros_like(tail[..., :1])], axis=-1)
    return edges, heights


def log_evidence_of(p_values: np.ndarray, edges: np.ndarray, heights: np.ndarray) -> np.ndarray:
    """``log Π f(p)`` over the last axis of ``p_values`` (..., n) for the cells ``edges`` at ``heights``."""
    k = heights.shape[-1]
    # the cell of p: how many of edges[1..k] (decreasing) are at least p
    cell = (edges[..., None, 1:] >= p_values[..., None]).sum(axis=-1)
    cell = np.minimum(cell, k - 1)
    return np.log(np.take_along_axis(heights, cell, axis=-1)).sum(axis=-1)


def bet_cycle(
    bag: np.ndarray, recent: np.ndarray, labels: np.ndarray, rng: np.random.Generator, bet: float, prior_rows: float,
    fixed: np.ndarray | None = None,
) -> np.ndarray:
    """One cycle's log-evidence (...,) of ``labels`` (..., n) against ``bag`` and ``recent`` (..., k), unchanged;
    the bet's cells from ``fixed`` counts (the reference's; default ``bag``)."""
    edges, heights = bet_density(bag if fixed is None else fixed, recent, bet, prior_rows)
    return log_evidence_of(conformal_p_values(labels, bag, rng), edges, heights)


def sr_step(log_evidence: np.ndarray, log_e: np.ndarray) -> np.ndarray:
    """The Shiryaev–Roberts recursion ``R_t = (1 + R_{t-1}) e_t`` in logs (``R_0 = 0``: ``-inf``)."""
    return np.logaddexp(0.0, log_evidence) + log_e


def region_sets(k: int) -> np.ndarray:
    """The default alternatives: one set per region, ``(k, k)`` (each region's share up)."""
    return np.eye(k, dtype=bool)


def check_sets(sets: np.ndarray | None, k: int) -> np.ndarray:
    """``sets`` (J, k) as booleans, each a non-empty proper subset of the k cells (default :func:`region_sets`)."""
    if sets is None:
        return region_sets(k)
    sets = np.asarray(sets)
    if sets.ndim != 2 or sets.shape[1] != k or sets.shape[0] < 1 or sets.dtype != bool:
        raise ValueError(f"sets must be a boolean (J, {k}) array of cells, J >= 1; got {sets.shape}, {sets.dtype}")
    if not sets.any(axis=1).all() or sets.all(axis=1).any():
        raise ValueError("every set must hold some cells and not all of them")
    return sets


def mixture_cycle(
    bag: np.ndarray, recent: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
    bet: float, prior_rows: float, sets: np.ndarray, lambdas: np.ndarray, fixed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One cycle's log-evidence per component (..., 1 + J·L) of ``labels`` (..., n) against ``bag`` (..., k),
    and the cycle's p-values counted per cell (..., k).

    The cells are intervals of [0, 1] fixed once, from ``fixed`` (the reference's held-out counts;
    default ``bag``): cell ``b`` is region ``b``'s share of them, in region order from the top.
    Component 0 is the adaptive bet of :func:`bet_density`, ``recent`` the forgetful counts of past
    p-values per cell; component ``1 + j·L + l`` bets that the p-values fall in set ``j``'s cells more
    often than their width ``w_j``: the density ``1 + λ_l (1{p in set j} / w_j - 1)``, which
    integrates to one. Every bet is a function of the cells, fixed before the stream, and of past
    p-values only, so each component's e-value has mean 1 given the past p-values whenever the
    p-values are independent and uniform: exactly, when the rows are exchangeable with the bag's
    reference rows. A set of zero width is not bet on.
    """
    fixed = bag if fixed is None else np.asarray(fixed)
    edges, heights = bet_density(fixed, recent, bet, prior_rows)
    p_values = conformal_p_values(labels, bag, rng)
    k = heights.shape[-1]
    cell = np.minimum((edges[..., None, 1:] >= p_values[..., None]).sum(axis=-1), k - 1)  # (..., n)
    counts = (cell[..., None] == np.arange(k)).sum(axis=-2).astype(np.float64)  # (..., k) rows per cell
    rows = counts.sum(axis=-1)
    adaptive = (counts * np.log(heights)).sum(axis=-1)
    member = sets.astype(np.float64)  # (J, k)
    shares = fixed / fixed.sum(axis=-1, keepdims=True)
    width = shares @ member.T  # (..., J)
    inside = counts @ member.T  # (..., J)
    lam = np.where(width[..., None] > 0, lambdas, 0.0)  # (..., J, L)
    safe = np.where(width > 0, width, 1.0)[..., None]
    per_set = inside[..., None] * np.log1p(lam * (1.0 / safe - 1.0)) + (rows[..., None, None]
                                                                         - inside[..., None]) * np.log1p(-lam)
    return np.concatenate([adaptive[..., None], per_set.reshape(*per_set.shape[:-2], -1)], axis=-1), counts


def mixture_log(components: np.ndarray) -> np.ndarray:
    """``log`` of the equal-weight average of the components' statistics (last axis, in logs)."""
    return np.logaddexp.reduce(components, axis=-1) - math.log(components.shape[-1])


def simulate_null_alarms(
    reference_counts: np.ndarray, shares: np.ndarray, rows: int, cycles: int, streams: int, threshold: float,
    *, bet: float = DEFAULT_LAMBDA, forget: float = DEFAULT_FORGET, prior_rows: float = DEFAULT_PRIOR_ROWS,
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS, sets: np.ndarray | None = None, seed: int = 0,
) -> int:
    """False alarms of ``streams`` detectors over ``cycles`` cycles each when nothing changes.

    Each stream's rows fall in the cells at ``shares`` and the bag starts at ``reference_counts``
    (drawn from the same ``shares`` for the guarantee to apply); the same steps as
    :meth:`EvidenceDetector.update`, for all streams at once. A stream restarts after an alarm.
    """
    rng = np.random.default_rng(seed)
    k = len(shares)
    member = check_sets(sets, k)
    lam = np.asarray(lambdas, dtype=np.float64)
    bag = np.tile(np.asarray(reference_counts, dtype=np.int64), (streams, 1))
    fixed = bag.copy()
    recent = np.zeros((streams, k))
    components = np.full((streams, 1 + len(member) * len(lam)), -np.inf)
    alarms, limit = 0, math.log(threshold)
    cumulative = np.cumsum(shares)
    for _ in range(cycles):
        labels = np.minimum(np.searchsorted(cumulative, rng.random((streams, rows)), side="right"), k - 1)
        log_e, cells = mixture_cycle(bag, recent, labels, rng, bet, prior_rows, member, lam, fixed)
        bag += (labels[..., None] == np.arange(k)).sum(axis=1)
        recent = forget * recent + cells
        components = sr_step(components, log_e)
        alarmed = mixture_log(components) >= limit
        alarms += int(alarmed.sum())
        components[alarmed] = -np.inf
    return alarms


class EvidenceDetector:
    """The per-stream accumulator (module docstring); ``update`` once per cycle with its fresh rows' regions.

    ``sets`` (J, k) booleans: the alternatives bet on one by one (default: each region's share up);
    ``lambdas``: the fixed stakes each is bet at. With labels that are cells of several partitions at
    once (:class:`EvidenceCells`), a set is one region of one partition.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> shares = np.full(8, 1 / 8)
    >>> detector = EvidenceDetector(np.full(8, 100), threshold=1000.0, seed=1)
    >>> quiet = [detector.update(rng.choice(8, 200, p=shares)) for _ in range(50)]
    >>> any(step.alarmed for step in quiet)
    False
    >>> moved = np.r_[0.3, np.full(7, 0.1)]
    >>> delay = next(i for i in range(1, 20) if detector.update(rng.choice(8, 200, p=moved)).alarmed)
    >>> delay <= 3
    True
    """

    def __init__(
        self,
        reference_counts: np.ndarray,
        threshold: float,
        *,
        bet: float = DEFAULT_LAMBDA,
        forget: float = DEFAULT_FORGET,
        prior_rows: float = DEFAULT_PRIOR_ROWS,
        lambdas: tuple[float, ...] = DEFAULT_LAMBDAS,
        sets: np.ndarray | None = None,
        seed: int | np.random.SeedSequence | None = 0,
    ):
        counts = np.asarray(reference_counts, dtype=np.int64)
        if counts.ndim != 1 or len(counts) < 2 or (counts < 0).any() or counts.sum() < 1:
            raise ValueError(f"reference_counts must be k >= 2 non-negative counts, not all zero; got {counts}")
        if not threshold > 1:
            raise ValueError(f"threshold must be above 1 (the mean cycles to a false alarm), got {threshold}")
        if not 0 < bet < 1 or not 0 <= forget < 1 or not prior_rows > 0:
            raise ValueError(f"need 0 < bet < 1, 0 <= forget < 1, prior_rows > 0; got {bet}, {forget}, {prior_rows}")
        lam = np.asarray(lambdas, dtype=np.float64)
        if lam.ndim != 1 or not len(lam) or not ((lam > 0) & (lam < 1)).all():
            raise ValueError(f"lambdas must be stakes in (0, 1); got {lambdas}")
        self.reference_counts = counts.copy()  # the bets' cells, fixed for the detector's life
        self.bag = counts.copy()
        self.threshold = float(threshold)
        self.bet, self.forget, self.prior_rows = bet, forget, prior_rows
        self.lambdas = lam
        self.sets = check_sets(sets, len(counts))
        self.recent = np.zeros(len(counts))
        self.components = np.full(1 + len(self.sets) * len(lam), -np.inf)  # each bet's log R_t; R_0 = 0
        self.rng = np.random.default_rng(seed)
        self.cycles = 0
        self.alarms = 0

    @property
    def k(self) -> int:
        return len(self.bag)

    @property
    def log_evidence(self) -> float:
        """``log R_t`` of the mixture: the log of the components' average statistic."""
        return float(mixture_log(self.components))

    def update(self, labels: np.ndarray) -> EvidenceStep:
        """Bet on one cycle's fresh rows (their region labels, in arrival order); the statistic after it."""
        labels = np.asarray(labels, dtype=np.int64).ravel()
        if labels.size and (labels.min() < 0 or labels.max() >= self.k):
            raise ValueError(f"region labels must be in [0, {self.k}); got {labels.min()}..{labels.max()}")
        before = self.log_evidence
        log_e, cells = mixture_cycle(self.bag, self.recent, labels, self.rng, self.bet, self.prior_rows, self.sets,
                                     self.lambdas, self.reference_counts)
        self.bag += np.bincount(labels, minlength=self.k)
        self.recent = self.forget * self.recent + cells
        self.components = sr_step(self.components, log_e)
        self.cycles += 1
        after = self.log_evidence
        alarmed = after >= math.log(self.threshold)
        # the mixture's own cycle evidence: R_t = (1 + R_{t-1}) e_t for the averaged statistic too
        step = EvidenceStep(int(labels.size), after - float(np.logaddexp(0.0, before)), after, alarmed)
        if alarmed:
            self.alarms += 1
            self.components[:] = -np.inf
        return step


@dataclass(frozen=True)
class EvidenceCells:
    """A finer score than one partition's region: the cell of a row in several partitions at once, on
    which side of the median it lies along the reference's first principal directions, and whether
    it lies far from its nearest centre.

    Fitted on one half of a reference: ``partitions`` k-means partitions of ``regions`` centres each
    (different seeds), the first ``directions`` principal directions of the fit rows with the median
    of their projections, and the ``far_quantile`` of the fit rows' distance to the first
    partition's nearest centre; the other half's cell counts are the bag. A row's cell is the
    mixed-radix code of its region in each partition, its side of each direction and its far bit.
    ``sets()``: the alternatives for :class:`EvidenceDetector`, one per region of each partition,
    one per side of each direction (a class that moves the mean moves rows across a median) and
    one for the far rows. The score is fixed before the stream (it depends on the fit half alone).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> cells = EvidenceCells.fit(rng.normal(size=(400, 8)), regions=4, partitions=2, directions=1, seed=0)
    >>> cells.reference_counts.sum(), cells.sets().shape, int(cells.assign(rng.normal(size=(5, 8))).max()) < 64
    (np.int64(200), (11, 64), True)
    """

    centres: tuple[np.ndarray, ...]
    radius: float
    reference_counts: np.ndarray
    mean: np.ndarray | None = None
    axes: np.ndarray | None = None  # (directions, d)
    medians: np.ndarray | None = None  # (directions,)

    @classmethod
    def fit(cls, reference: np.ndarray, *, regions: int | tuple[int, ...] = 16, partitions: int = 2,
            directions: int = 0, far_quantile: float = 0.95, seed: int = 0) -> EvidenceCells:
        """``regions``: the centres of each of the ``partitions`` partitions, or a tuple of them, one per
        partition (then ``partitions`` is its length)."""
        from monitor.drift.attribution.regions import kmeans, nearest

        rows = np.asarray(reference, dtype=np.float64)
        half = len(rows) // 2
        counts = (regions,) * partitions if isinstance(regions, int) else tuple(regions)
        if (not counts or min(counts) < 2 or half < max(counts) or not 0 < far_quantile < 1
                or not 0 <= directions <= min(half, rows.shape[1])):
            raise ValueError(f"need 2 <= regions <= half the reference ({half}), partitions >= 1, 0 <= directions "
                             f"<= the rows' dimension and 0 < far_quantile < 1; got {regions}, {partitions}, "
                             f"{directions}, {far_quantile}")
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(rows))
        fit_rows, held_out = rows[order[:half]], rows[order[half:]]
        centres = tuple(kmeans(fit_rows, k, rng) for k in counts)
        radius = float(np.quantile(nearest(fit_rows, centres[0])[1], far_quantile))
        mean = axes = medians = None
        if directions:
            mean = fit_rows.mean(axis=0)
            axes = np.linalg.svd(fit_rows - mean, full_matrices=False)[2][:directions]
            medians = np.median((fit_rows - mean) @ axes.T, axis=0)
        cells = cls(centres, radius, np.zeros(0, dtype=np.int64), mean, axes, medians)
        return cls(centres, radius, np.bincount(cells.assign(held_out), minlength=cells.k), mean, axes, medians)

    @property
    def directions(self) -> int:
        return 0 if self.axes is None else len(self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The radix of each part of a cell's code: the partitions, then the directions' sides, then far."""
        return (*(len(c) for c in self.centres), *(2,) * self.directions, 2)

    @property
    def k(self) -> int:
        return int(np.prod(self.sizes))

    def assign(self, rows: np.ndarray) -> np.ndarray:
        """Each row's cell (n,) in [0, k)."""
        from monitor.drift.attribution.regions import nearest

        rows = np.asarray(rows, dtype=np.float64)
        code = np.zeros(len(rows), dtype=np.int64)
        scale = 1
        for i, centres in enumerate(self.centres):
            label, distance = nearest(rows, centres)
            code += label * scale
            if i == 0:
                far = distance > self.radius
            scale *= len(centres)
        if self.axes is not None and self.mean is not None and self.medians is not None:
            sides = ((rows - self.mean) @ self.axes.T > self.medians).astype(np.int64)
            code += (sides * (2 ** np.arange(self.directions))).sum(axis=1) * scale
            scale *= 2**self.directions
        return code + far.astype(np.int64) * scale

    def sets(self) -> np.ndarray:
        """(J, k) booleans: each region of each partition, each side of each direction, then the far rows."""
        cells = np.arange(self.k)
        out, scale = [], 1
        for i, size in enumerate(self.sizes):
            part = (cells // scale) % size
            out += [part == 1] if i == len(self.sizes) - 1 else [part == b for b in range(size)]
            scale *= size
        return np.array(out)


def threshold_for(cycle_alpha: float, share: float) -> float:
    """The Shiryaev–Roberts threshold that spends ``share`` of a cycle false-alarm budget ``cycle_alpha``.

    A mean of at least ``1 / (share · cycle_alpha)`` cycles between false alarms: with the suite
    deciding at ``(1 - share) · cycle_alpha``, the two together raise false alarms at most
    ``cycle_alpha`` times per cycle in the long run.

    Examples
    --------
    >>> threshold_for(60 / (7 * 86400), 0.5)  # a 60 s cycle, one false alarm a week, half of it here
    20160.0
    """
    if not 0 < cycle_alpha < 1 or not 0 < share < 1:
        raise ValueError(f"need 0 < cycle_alpha < 1 and 0 < share < 1; got {cycle_alpha}, {share}")
    return 1.0 / (share * cycle_alpha)
