"""A small partition of the reference's space, so a drift verdict can say *where* the data moved.

k-means on the reference sample gives k ≤ 32 regions (topics, in practice). Each drift cycle
then compares the share of window rows in each region with the reference's share
(:mod:`monitor.drift.attribution.region_shares`) and counts the window rows that lie farther from every
region than the reference's own rows almost ever do (the *novel* share: a topic the reference
never had).

Held out, so the comparison is fair. The centres are fitted on one random half of the reference
sample; the reference's region counts and the novelty radius come from the *other* half. Rows
a centre was fitted on sit closer to it than new rows would (k-means over-fits), so in-sample
counts and distances would make an unchanged window look different. The held-out half and an
unchanged window are exchangeable given the centres: the share test is exact, and the novel
share of an unchanged window is 1% in expectation (the radius is the held-out rows' 99th
percentile distance to their nearest centre).

numpy only (a seeded k-means++ / Lloyd's), so references, their ``.npz`` form and the stores that
carry regions stay light.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> blobs = np.concatenate([rng.normal(c, 0.1, size=(300, 4)) for c in (0.0, 1.0, 2.0)])
>>> regions = fit_regions(blobs.astype(np.float32), max_regions=3, seed=1)
>>> regions.k, regions.reference_rows, np.round(np.sort(regions.reference_shares), 2).tolist()
(3, 450, [0.31, 0.33, 0.36])
>>> labels, distances = regions.assign(np.full((1, 4), 1.02, dtype=np.float32))
>>> bool(np.allclose(regions.centres[labels[0]], 1.0, atol=0.05)), bool(distances[0] < regions.novel_radius)
(True, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MIN_ROWS_PER_REGION = 50  # held-out reference rows per region: k = min(max_regions, held-out rows / 50)
NOVEL_QUANTILE = 0.99
_ITERATIONS = 100
# The .npz members of regions: (name, number of dimensions, dtype kinds: monitor/storage/archives.py)
REGION_MEMBERS = (("regions_centres", 2, "fiu"), ("regions_reference_counts", 1, "iu"),
                  ("regions_novel_radius", 0, "fiu"), ("regions_exemplar_ids", (1, 2), "U"),
                  ("regions_novel_reference_count", 0, "iu"))
_MEMBERS = tuple(name for name, _, _ in REGION_MEMBERS)


@dataclass(frozen=True)
class Regions:
    """k regions of a reference: centres, held-out reference counts, the novelty radius, exemplar ids.

    ``reference_counts[j]`` held-out reference rows are nearest centre j; ``novel_radius`` is the
    99th percentile of their distances to the nearest centre, and ``novel_reference_count`` of
    them lie beyond it (about 1%); ``exemplar_ids[j]`` are the ids of the reference rows nearest
    centre j (empty when the records carried no ids).
    """

    centres: np.ndarray
    reference_counts: np.ndarray
    novel_radius: float
    exemplar_ids: tuple[tuple[str, ...], ...]
    novel_reference_count: int = 0

    def __post_init__(self) -> None:
        centres = np.ascontiguousarray(self.centres, dtype=np.float32)
        counts = np.asarray(self.reference_counts, dtype=np.int64)
        if centres.ndim != 2 or len(centres) < 2 or counts.shape != (len(centres),) or counts.sum() < 1:
            raise ValueError(f"regions need (k >= 2, d) centres and k counts; got {centres.shape}, {counts.shape}")
        if not np.isfinite(centres).all() or (counts < 0).any():
            raise ValueError("regions need finite centres and non-negative counts")
        if len(self.exemplar_ids) != len(centres) or not np.isfinite(self.novel_radius):
            raise ValueError("regions need one exemplar list per centre and a finite novelty radius")
        object.__setattr__(self, "centres", centres)
        object.__setattr__(self, "reference_counts", counts)
        object.__setattr__(self, "novel_radius", float(self.novel_radius))
        object.__setattr__(self, "novel_reference_count", int(self.novel_reference_count))
        object.__setattr__(self, "exemplar_ids", tuple(tuple(str(i) for i in ids) for ids in self.exemplar_ids))

    @property
    def k(self) -> int:
        return int(len(self.centres))

    @property
    def dim(self) -> int:
        return int(self.centres.shape[1])

    @property
    def reference_rows(self) -> int:
        return int(self.reference_counts.sum())

    @property
    def reference_shares(self) -> np.ndarray:
        return self.reference_counts / self.reference_rows

    def assign(self, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The nearest region of each row (n,) and the distance to its centre (n,)."""
        return nearest(np.asarray(vectors, dtype=np.float64), self.centres.astype(np.float64))

    def to_arrays(self) -> dict[str, Any]:
        """``.npz`` members (next to a reference profile's own)."""
        width = max([len(ids) for ids in self.exemplar_ids] + [1])
        table = np.array([list(ids) + [""] * (width - len(ids)) for ids in self.exemplar_ids], dtype=np.str_)
        values = (self.centres, self.reference_counts, np.float64(self.novel_radius), table,
                  np.int64(self.novel_reference_count))
        return dict(zip(_MEMBERS, values, strict=True))

    @classmethod
    def from_arrays(cls, data: Any) -> Regions | None:
        """The regions stored with a profile, or None when it has none (written before regions existed)."""
        if _MEMBERS[0] not in data:
            return None
        centres, counts, radius, table, novel = (data[name] for name in _MEMBERS)
        exemplars = tuple(tuple(str(i) for i in row if str(i)) for row in np.atleast_2d(table))
        return cls(centres, counts, float(radius), exemplars, int(novel))


def nearest(rows: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest centre for each row and the Euclidean distance to it (float64)."""
    d2 = (rows * rows).sum(axis=1)[:, None] + (centres * centres).sum(axis=1)[None, :] - 2.0 * rows @ centres.T
    labels = np.argmin(d2, axis=1)
    return labels, np.sqrt(np.clip(d2[np.arange(len(rows)), labels], 0.0, None))


def region_count(held_out_rows: int, max_regions: int) -> int:
    """k for a held-out half of ``held_out_rows`` rows: about 50 rows per region, at most ``max_regions``."""
    return min(max_regions, held_out_rows // MIN_ROWS_PER_REGION)


def kmeans(rows: np.ndarray, k: int, rng: np.random.Generator, iterations: int = _ITERATIONS) -> np.ndarray:
    """Lloyd's algorithm from a k-means++ start (seeded); an emptied cluster restarts at the row
    farthest from its centre. Returns the (k, d) centres, float64."""
    rows = np.asarray(rows, dtype=np.float64)
    centres = np.empty((k, rows.shape[1]))
    centres[0] = rows[rng.integers(len(rows))]
    closest = ((rows - centres[0]) ** 2).sum(axis=1)
    for j in range(1, k):
        total = closest.sum()
        pick = rng.choice(len(rows), p=closest / total) if total > 0 else rng.integers(len(rows))
        centres[j] = rows[pick]
        closest = np.minimum(closest, ((rows - centres[j]) ** 2).sum(axis=1))
    labels = np.full(len(rows), -1)
    for _ in range(iterations):
        new_labels, distances = nearest(rows, centres)
        if np.array_equal(new_labels, labels):
            break
        labels = new_labels
        for j in range(k):
            members = labels == j
            if members.any():
                centres[j] = rows[members].mean(axis=0)
            else:
                far = int(np.argmax(distances))
                centres[j], labels[far], distances[far] = rows[far], j, 0.0
    return centres


def fit_regions(
    sample: np.ndarray,
    ids: Sequence[str | None] | None = None,
    *,
    max_regions: int = 32,
    exemplars: int = 3,
    seed: int = 0,
) -> Regions | None:
    """Regions of a reference sample (module docstring), or None when it is too small for two.

    ``ids``: the ids of the sample rows (None entries or None: no ids); the ``exemplars`` rows
    nearest each centre that have an id name the region.
    """
    sample = np.asarray(sample, dtype=np.float64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sample))
    half = len(sample) // 2
    fit_rows, held_out = sample[order[:half]], sample[order[half:]]
    k = region_count(len(held_out), max_regions)
    if k < 2:
        return None
    centres = kmeans(fit_rows, k, rng)
    labels, distances = nearest(held_out, centres)
    radius = float(np.quantile(distances, NOVEL_QUANTILE, method="higher"))
    return Regions(
        centres, np.bincount(labels, minlength=k), radius, exemplar_ids(sample, ids, centres, exemplars),
        int((distances > radius).sum()),
    )


def exemplar_ids(
    rows: np.ndarray, ids: Sequence[str | None] | None, centres: np.ndarray, count: int
) -> tuple[tuple[str, ...], ...]:
    """Per centre, the ``count`` distinct ids of the rows nearest it among the rows assigned to it
    (rows without an id are passed over)."""
    if ids is None or count == 0 or not any(ids):
        return ((),) * len(centres)
    labels, distances = nearest(np.asarray(rows, dtype=np.float64), np.asarray(centres, dtype=np.float64))
    return ranked_ids(labels, distances, ids, len(centres), count)


def ranked_ids(
    labels: np.ndarray, scores: np.ndarray, ids: Sequence[str | None] | None, k: int, count: int
) -> tuple[tuple[str, ...], ...]:
    """Per region, the ``count`` distinct ids of its lowest-scoring rows (a stream sees popular items
    again; one of each is enough), passing over rows without an id."""
    if ids is None or count == 0:
        return ((),) * k
    out = []
    for j in range(k):
        members = np.flatnonzero(labels == j)
        chosen: list[str] = []
        for i in members[np.argsort(scores[members], kind="stable")]:
            if ids[i] and str(ids[i]) not in chosen:
                chosen.append(str(ids[i]))
                if len(chosen) == count:
                    break
        out.append(tuple(chosen))
    return tuple(out)
