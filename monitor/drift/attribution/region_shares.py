"""Which regions of the reference gained or lost share in the window, and what is new: the explanation.

Each cycle assigns the window sample to the reference's regions (:mod:`monitor.drift.attribution.regions`)
and, per region, compares the window's count with the held-out reference's by Fisher's exact
test (two-sided, conditional on the region's total: exact under no drift, since the held-out
reference rows and the window rows are exchangeable given the centres). The novel share gets the
same test against the held-out reference's own share beyond the radius (about 1%).

The explanation is tested hierarchically (Yekutieli 2008): the suite's calibrated verdict is the
parent hypothesis "nothing changed"; only when it rejected are the children (the regions and the
novel share) tested, by Benjamini–Hochberg at ``alpha`` = ``drift.regions.fdr_q`` / 2 (the suite
passes it; the factor is Yekutieli's bound for a hierarchy). A region has *shifted* when the
verdict fired and its adjusted p-value is at most ``alpha``. So without a verdict nothing is
named, and under no drift something is named in at most the suite's false-alarm rate of cycles
(the cycle's alpha), whatever ``q``; given a verdict, the expected share of named regions that
did not move is at most about ``q`` (docs/drift.md, "What moved": the guarantee, measured).
Testing the regions at the cycle's alpha, as if each were a fresh alarm, left them silent after
real verdicts: alpha is set for a false alarm a month, not for explaining an alarm already raised.

Regions are ranked by their part of the MMD statistic (:func:`witness_shares`, the witness
function of the kernel test: attribution from a test that fires, not a separate score), and
carry their share change beside it.

Exemplars, so a person can open the items that moved: per region, the reference's ids nearest
its centre (what the region is about, chosen when the regions were fitted) and the window's ids
ranked by a *local* witness among the window rows of that region: the share of window rows among
a row's 20 nearest rows of the pooled sample (:func:`neighbour_shares`, the window's density over
the pooled one, estimated by its neighbours), ties by the kernel witness. Those are the rows where
the window has most more than the reference nearby: the arrivals of a share that rose, and the
items of a topic the reference never had. The rows nearest the centre would show the same old
items as the reference's; the rows least like any reference row (the first rule) are the region's
outliers when the arrivals are items of a kind the reference already had; the kernel witness at
the median bandwidth alone (the second rule) is smooth, and also scores the old items that lie
toward the arrivals. For the novel share, the novel rows nearest the novel rows' own mean (the
most typical of what is new).

The share test does not enter the cycle's drift verdict (the suite's tests decide, with the whole
budget); it explains it. numpy and scipy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy import stats

from monitor.drift.attribution.regions import NOVEL_QUANTILE, Regions, exemplar_ids, ranked_ids
from monitor.drift.references.profile import subsample_index
from monitor.drift.twosample.heldout import kernel_witness
from monitor.drift.twosample.mmd import median_bandwidth
from monitor.multiple_testing import benjamini_hochberg
from monitor.state import checks

MIN_CALIBRATION_ROWS = 100  # reference rows per half below which the novelty falls back to the regions' radius
WITNESS_POINTS = 1000  # rows per side that estimate the witness's kernel means
NEIGHBOURS = 20  # the pooled rows nearest a window row that rank it as an exemplar (:func:`neighbour_shares`)
NEIGHBOUR_POINTS = 2000  # rows per side in that pool: the default samples whole (half of them ranked worse)


@dataclass(frozen=True)
class RegionShift:
    """One region at one cycle: its shares, its share test and exemplar ids from both sides."""

    region: int
    reference_share: float
    window_share: float
    p_value: float  # Fisher's exact test of the share change
    p_adjusted: float  # Benjamini–Hochberg across the regions
    shifted: bool
    reference_exemplars: tuple[str, ...] = ()
    window_exemplars: tuple[str, ...] = ()
    mmd_share: float = 0.0  # the region's part of the MMD statistic (:func:`witness_shares`); 0 in old states

    @property
    def change(self) -> float:
        return self.window_share - self.reference_share


@dataclass(frozen=True)
class RegionReport:
    """Every region's shift, the novel share (its test, its exemplars), at the level ``alpha``."""

    regions: tuple[RegionShift, ...]
    novel_share: float
    novel_exemplars: tuple[str, ...]
    alpha: float
    window_rows: int
    reference_rows: int
    novel_reference_share: float = 0.0
    novel_p_value: float = 1.0
    novel_p_adjusted: float = 1.0
    verdict: bool = True  # the gate: did the suite reject? (a report from before the gate: as if it did)

    @property
    def novel_shifted(self) -> bool:
        return self.verdict and self.novel_p_adjusted <= self.alpha

    def gated(self, verdict: bool) -> RegionReport:
        """This report behind the suite's verdict: without one, nothing has shifted."""
        regions = tuple(replace(r, shifted=r.shifted and verdict) for r in self.regions)
        return replace(self, regions=regions, verdict=verdict)

    @property
    def shifted(self) -> tuple[int, ...]:
        return tuple(r.region for r in self.regions if r.shifted)

    def ranked(self) -> list[RegionShift]:
        """Regions by their part of the MMD statistic, largest first (then by the size of their share
        change: a report from before the witness has only that, and by adjusted p-value)."""
        return sorted(self.regions, key=lambda r: (-r.mmd_share, -abs(r.change), r.p_adjusted, r.region))

    def state_dict(self) -> dict[str, Any]:
        return {
            "regions": [
                [r.region, r.reference_share, r.window_share, r.p_value, r.p_adjusted, r.shifted,
                 list(r.reference_exemplars), list(r.window_exemplars), r.mmd_share]
                for r in self.regions
            ],
            "novel_share": self.novel_share,
            "novel_exemplars": list(self.novel_exemplars),
            "alpha": self.alpha,
            "window_rows": self.window_rows,
            "reference_rows": self.reference_rows,
            "novel": [self.novel_reference_share, self.novel_p_value, self.novel_p_adjusted],
            "verdict": self.verdict,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> RegionReport:
        share = checks.probability
        regions = tuple(
            RegionShift(checks.count(j, "region index"), share(rs, f"region {j} reference share"),
                        share(ws, f"region {j} window share"), share(p, f"region {j} p-value"),
                        share(pa, f"region {j} adjusted p-value"), bool(s), tuple(map(str, re)), tuple(map(str, we)),
                        checks.finite(witness[0], f"region {j} MMD share") if witness else 0.0)
            for j, rs, ws, p, pa, s, re, we, *witness in state["regions"]
        )
        novel_reference, novel_p, novel_adjusted = (
            share(v, "novel share statistics") for v in state.get("novel") or (0.0, 1.0, 1.0)
        )
        return cls(regions, share(state["novel_share"], "novel share"), tuple(map(str, state["novel_exemplars"])),
                   share(state["alpha"], "region alpha"), checks.count(state["window_rows"], "region window rows"),
                   checks.count(state["reference_rows"], "region reference rows"), novel_reference, novel_p,
                   novel_adjusted, verdict=bool(state.get("verdict", True)))


def share_p_values(window_counts: np.ndarray, reference_counts: np.ndarray) -> np.ndarray:
    """Two-sided Fisher exact p-value per region: window count of m vs reference count of n.

    Examples
    --------
    >>> share_p_values(np.array([50, 50]), np.array([50, 50])).round(3).tolist()
    [1.0, 1.0]
    >>> bool(share_p_values(np.array([90, 10]), np.array([50, 50]))[0] < 1e-8)
    True
    """
    m, n = int(window_counts.sum()), int(reference_counts.sum())
    return np.array([
        stats.fisher_exact([[int(w), m - int(w)], [int(r), n - int(r)]]).pvalue
        for w, r in zip(window_counts, reference_counts, strict=True)
    ])


def compare_regions(
    regions: Regions,
    window_sample: np.ndarray,
    window_ids: Sequence[str | None] | None,
    reference_sample: np.ndarray,
    alpha: float,
    exemplars: int = 3,
    seed: int | np.random.SeedSequence = 0,
) -> RegionReport:
    """Shares of the window sample (m, d) in each region vs the reference's, tested at ``alpha`` (BH).

    ``reference_sample`` serves the window exemplars and the novelty threshold
    (:func:`calibrated_novelty`, its split drawn from ``seed``).

    Examples
    --------
    >>> from monitor.drift.attribution.regions import fit_regions
    >>> rng = np.random.default_rng(0)
    >>> blob = lambda c, n: rng.normal(c, 0.1, size=(n, 4))
    >>> reference = np.concatenate([blob(0.0, 300), blob(1.0, 300)])
    >>> regions = fit_regions(reference, max_regions=2, seed=1)
    >>> same = compare_regions(regions, np.concatenate([blob(0.0, 150), blob(1.0, 150)]), None, reference, 0.01)
    >>> same.shifted, same.novel_share < 0.03, same.novel_shifted  # about 1% by construction
    ((), True, False)
    >>> window = np.concatenate([blob(0.0, 60), blob(1.0, 140), blob(3.0, 100)])
    >>> ids = [f"doc-{i}" for i in range(300)]
    >>> moved = compare_regions(regions, window, ids, reference, 0.01, exemplars=2)
    >>> len(moved.shifted), round(moved.novel_share, 2), moved.novel_shifted, len(moved.novel_exemplars)
    (2, 0.33, True, 2)
    >>> all(int(i.split("-")[1]) >= 200 for i in moved.novel_exemplars)  # the new blob's own rows
    True
    """
    window = np.asarray(window_sample, dtype=np.float64)
    labels, distances = regions.assign(window)
    counts = np.bincount(labels, minlength=regions.k)
    reference = np.asarray(reference_sample, dtype=np.float64)
    if len(reference) >= 2 * MIN_CALIBRATION_ROWS:
        novel, novel_reference, calibration_rows = calibrated_novelty(window, reference, np.random.default_rng(seed))
    else:  # too few reference rows to calibrate on: the regions' own radius (coarser, same null rate)
        novel, novel_reference = distances > regions.novel_radius, regions.novel_reference_count
        calibration_rows = regions.reference_rows
    p_values = np.r_[
        share_p_values(counts, regions.reference_counts),
        share_p_values(np.array([novel.sum(), len(window) - novel.sum()]),
                       np.array([novel_reference, calibration_rows - novel_reference]))[0],
    ]
    adjusted = benjamini_hochberg(p_values)
    mmd_shares, window_witness = witness_parts(window, labels, reference, regions.assign(reference)[0], regions.k,
                                               np.random.default_rng(seed))
    window_exemplars: tuple[tuple[str, ...], ...] = ((),) * regions.k
    if window_ids is not None and exemplars > 0:
        local = neighbour_shares(window, reference, np.random.default_rng(seed))
        window_exemplars = ranked_ids(labels, exemplar_order(local, window_witness), window_ids, regions.k,
                                      exemplars)
    novel_exemplars: tuple[str, ...] = ()
    if novel.any() and window_ids is not None:
        novel_rows = np.flatnonzero(novel)
        centre = window[novel_rows].mean(axis=0, keepdims=True)
        novel_exemplars = exemplar_ids(
            window[novel_rows], [window_ids[i] for i in novel_rows.tolist()], centre, exemplars
        )[0]
    reference_shares = regions.reference_shares
    shifts = tuple(
        RegionShift(
            region=j,
            reference_share=float(reference_shares[j]),
            window_share=float(counts[j] / len(window)),
            p_value=float(p_values[j]),
            p_adjusted=float(adjusted[j]),
            shifted=bool(adjusted[j] <= alpha),
            reference_exemplars=regions.exemplar_ids[j],
            window_exemplars=window_exemplars[j],
            mmd_share=float(mmd_shares[j]),
        )
        for j in range(regions.k)
    )
    return RegionReport(
        shifts, float(novel.mean()), novel_exemplars, float(alpha), len(window), regions.reference_rows,
        novel_reference / calibration_rows, float(p_values[-1]), float(adjusted[-1]),
    )


def witness_shares(
    window: np.ndarray, window_labels: np.ndarray, reference: np.ndarray, reference_labels: np.ndarray, k: int,
    rng: np.random.Generator, points: int = WITNESS_POINTS,
) -> np.ndarray:
    """Each region's part of the MMD statistic (:func:`witness_parts` without the rows' witness values)."""
    return witness_parts(window, window_labels, reference, reference_labels, k, rng, points)[0]


def witness_parts(
    window: np.ndarray, window_labels: np.ndarray, reference: np.ndarray, reference_labels: np.ndarray, k: int,
    rng: np.random.Generator, points: int = WITNESS_POINTS,
) -> tuple[np.ndarray, np.ndarray]:
    """Each region's part of the MMD statistic, and the witness at each window row.

    The parts: where the kernel test sees the window differ.

    The MMD witness ``f(z) = mean k(z, window) - mean k(z, reference)`` (Gretton et al. 2012; the
    suite's RBF kernel and median bandwidth) has ``mean_window f - mean_reference f`` = the biased
    MMD². Split both means by region: ``part_j = (1/m) Σ_{window rows in j} f - (1/n) Σ_{reference
    rows in j} f``, and the parts sum to the statistic. A region that gained share carries its part
    through its window rows (``f > 0`` there), one that lost share through its reference rows
    (``f < 0`` there), so both rank high; evaluating the witness at the window's rows only would
    miss what left. Returned as shares of the sum (0 everywhere when it is not positive). The
    kernel means use at most ``points`` rows per side, drawn from ``rng`` (bounded cost:
    ``(m + n) × 2·points`` kernel entries). The window rows' witness values break the ties of a region's window
    exemplars' local ranking (:func:`exemplar_order`).
    """
    sigma = median_bandwidth(np.concatenate([window, reference]), rng)
    fit = kernel_witness(sigma)
    witness = fit(window[subsample_index(len(window), points, rng)],
                  reference[subsample_index(len(reference), points, rng)])
    at_window = witness(window)
    parts = (np.bincount(window_labels, weights=at_window, minlength=k) / len(window)
             - np.bincount(reference_labels, weights=witness(reference), minlength=k) / len(reference))
    total = float(parts.sum())
    return (parts / total if total > 0 else np.zeros(k)), at_window


def neighbour_shares(
    window: np.ndarray, reference: np.ndarray, rng: np.random.Generator, neighbours: int = NEIGHBOURS,
    points: int = NEIGHBOUR_POINTS, block: int = 1024,
) -> np.ndarray:
    """Each window row's share of window rows among its ``neighbours`` nearest rows of a pooled sample.

    The pool: at most ``points`` rows of each side, drawn from ``rng``; a window row in the pool is
    not its own neighbour. A k-nearest-neighbour estimate of the window's density over the pooled
    one at the row (Schilling 1986: the statistic of the nearest-neighbour two-sample test, per
    row): high where the window has more than the reference *nearby*. The kernel witness at the
    suite's median bandwidth is smooth (it follows the shift of the mean), so among a region's
    window rows it also scores the old items that lie toward the arrivals; the neighbours see the
    arrivals themselves (measured on MiniLM, WordNet classes the reference never had: docs/drift.md,
    "What moved"; with 1,000 rows a side instead of the default samples whole, the neighbours reach
    farther and the ranking loses most of its gain). Bounded cost: ``len(window) × 2·points``
    distances, a ``block`` of rows at a time.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> reference = rng.normal(0.0, 1.0, size=(200, 3))
    >>> window = np.concatenate([rng.normal(0.0, 1.0, size=(150, 3)), rng.normal(6.0, 0.5, size=(50, 3))])
    >>> shares = neighbour_shares(window, reference, rng, neighbours=10)
    >>> float(shares[150:].min()), bool(shares[:150].mean() < 0.6)  # the arrivals' neighbours are all arrivals
    (1.0, True)
    """
    window = np.asarray(window, dtype=np.float32)  # a ranking: single precision halves the cost
    window_pool = subsample_index(len(window), points, rng)
    pool = np.concatenate([window[window_pool], np.asarray(reference, dtype=np.float32)[
        subsample_index(len(reference), points, rng)]])
    count = min(neighbours, len(pool) - 1)
    if count < 1:
        return np.zeros(len(window))
    place = np.full(len(window), -1)
    place[window_pool] = np.arange(len(window_pool))
    pool_sq = (pool * pool).sum(axis=1)
    out = np.empty(len(window))
    for start in range(0, len(window), block):
        part = window[start : start + block]
        d2 = pool_sq[None, :] - 2.0 * part @ pool.T  # less the row's own squared norm: the same order
        rows = np.flatnonzero(place[start : start + block] >= 0)
        d2[rows, place[start + rows]] = np.inf  # not its own neighbour
        nearest_rows = np.argpartition(d2, count - 1, axis=1)[:, :count]
        out[start : start + block] = (nearest_rows < len(window_pool)).mean(axis=1)
    return out


def exemplar_order(local: np.ndarray, witness: np.ndarray) -> np.ndarray:
    """Each window row's rank as an exemplar, 0 first: by its neighbour share (:func:`neighbour_shares`),
    ties (the share takes ``neighbours + 1`` values) by the kernel witness.

    Examples
    --------
    >>> exemplar_order(np.array([0.5, 1.0, 1.0, 0.2]), np.array([9.0, 0.1, 0.3, 5.0])).tolist()
    [2, 1, 0, 3]
    """
    order = np.lexsort((-witness, -local))
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


def calibrated_novelty(
    window: np.ndarray, reference: np.ndarray, rng: np.random.Generator, quantile: float = NOVEL_QUANTILE
) -> tuple[np.ndarray, int, int]:
    """Which window rows are novel, by a threshold whose null rate is known.

    The reference splits at random into anchors and calibration rows. A row's novelty score is
    its distance to the nearest anchor; the threshold is the ``quantile`` of the calibration
    rows' scores. Under no drift a window row and a calibration row are exchangeable given the
    anchors, so a window row exceeds the threshold with probability about 1 - ``quantile`` (1%),
    and the window's novel count is compared with the calibration rows' own count (exact).
    Nearest reference *rows*, not k-means centres: the centres' radius let most items of topics
    the reference never had pass as familiar (measured on MiniLM: 13% of them flagged, against 41%
    here, at the same 1.0% null rate). Returns the window's novel mask, the calibration rows
    beyond the threshold, and the number of calibration rows.
    """
    order = rng.permutation(len(reference))
    half = len(reference) // 2
    anchors, calibration = reference[order[:half]], reference[order[half:]]
    scores = nearest_distance(calibration, anchors)
    threshold = float(np.quantile(scores, quantile, method="higher"))
    return nearest_distance(window, anchors) > threshold, int((scores > threshold).sum()), len(calibration)


def nearest_distance(rows: np.ndarray, others: np.ndarray, block: int = 1024) -> np.ndarray:
    """Each row's Euclidean distance to its nearest row of ``others`` (blocked: memory ~ block × len(others))."""
    out = np.empty(len(rows))
    others_sq = (others * others).sum(axis=1)
    for start in range(0, len(rows), block):
        part = rows[start : start + block]
        d2 = (part * part).sum(axis=1)[:, None] + others_sq[None, :] - 2.0 * part @ others.T
        out[start : start + block] = np.sqrt(np.clip(d2.min(axis=1), 0.0, None))
    return out
