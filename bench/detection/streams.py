"""The plan: the cases, their replicates' reference samples and record streams (:mod:`.protocol`).

Base traffic: the seen classes in equal shares (MiniLM, mean pooling). The shifts, from the change on:

- ``share<δ>``: one seen class's share raised by δ (the others shrink in proportion); the class is
  the replicate's (replicate ``r`` injects seen class ``r mod 16``), so every class is injected;
- ``unseen``: 10% of the records come from the four classes the reference never had;
- ``swap``: the same traffic embedded by another model (multilingual-e5-small);
- ``pooling``: the same model with CLS pooling instead of mean pooling;
- ``norm``: the same model without its final normalisation (norms 2-7 instead of 1);
- ``spread``: the same rows spread 30% wider about the base traffic's mean along its top 5
  principal axes (:func:`spread_rows`): the mean stays where it was, the covariance changes (what a
  fine-tuned or re-quantised model can do to a space). A difference of means cannot see it;
- ``null``: nothing changes.

The sample-size grid repeats ``null`` and ``share10`` at other ``n``; ``online_null`` is one long null
stream per replicate for the online methods' false alarms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.detection.corpus import SEEN, UNSEEN, VARIANTS, Corpus
from bench.detection.protocol import FILL, WARM

DELTAS = (0.01, 0.02, 0.05, 0.10, 0.20, 0.30)
UNSEEN_SHARE = 0.10
SPREAD_AXES, SPREAD = 5, 0.30
PLAN_VARIANTS = (*VARIANTS, "spread")  # the plan's row blocks: the corpus's embeddings, then the derived one


def spread_rows(rows: np.ndarray, base: np.ndarray, axes: int = SPREAD_AXES, wider: float = SPREAD) -> np.ndarray:
    """``rows`` spread ``1 + wider`` times wider about the mean of ``rows[base]`` along its ``axes`` top
    principal axes: ``x + wider · P (x - μ)``, ``P`` the projection onto those axes. The base
    traffic's mean does not move (``E[x - μ] = 0``); its variance along each axis grows by
    ``(1 + wider)²``.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(2000, 6)) * np.array([3.0, 2.0, 1.0, 1.0, 1.0, 1.0])
    >>> moved = spread_rows(x, np.arange(2000), axes=1, wider=0.5)
    >>> bool(np.allclose(moved.mean(axis=0), x.mean(axis=0))), round(float(moved[:, 0].std() / x[:, 0].std()), 2)
    (True, 1.5)
    """
    rows64 = rows.astype(np.float64)
    mean = rows64[base].mean(axis=0)
    _, _, vt = np.linalg.svd(rows64[base] - mean, full_matrices=False)
    top = vt[:axes]
    return (rows64 + wider * ((rows64 - mean) @ top.T) @ top).astype(np.float32)


class Traffic:
    """Draws row ids (``variant * N + i``) of base or shifted traffic."""

    def __init__(self, corpus: Corpus) -> None:
        self.count = len(corpus.texts)
        self.by_class = {name: corpus.members(name) for name in corpus.classes}
        self.seen = np.concatenate([self.by_class[c] for c in SEEN])
        self.unseen = np.concatenate([self.by_class[c] for c in UNSEEN])

    @classmethod
    def from_plan(cls, plan: Any) -> Traffic:
        """The same traffic from a plan's labels (a worker has the plan, not the corpus)."""
        traffic = cls.__new__(cls)
        traffic.count = len(plan.labels)
        traffic.by_class = {name: np.flatnonzero(plan.labels == i) for i, name in enumerate(plan.classes)}
        traffic.seen = np.concatenate([traffic.by_class[c] for c in SEEN])
        traffic.unseen = np.concatenate([traffic.by_class[c] for c in UNSEEN])
        return traffic

    def base(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return self.seen[rng.integers(0, len(self.seen), size)]

    def shifted(self, rng: np.random.Generator, size: int, case: str, replicate: int) -> np.ndarray:
        if case.startswith("share"):
            delta = int(case[len("share"):].split("_")[0]) / 100
            injected = SEEN[replicate % len(SEEN)]
            extra = rng.random(size) < delta / (1 - 1 / len(SEEN))  # raises the class's share by delta
            rows = self.base(rng, size)
            members = self.by_class[injected]
            rows[extra] = members[rng.integers(0, len(members), int(extra.sum()))]
            return rows
        if case == "unseen":
            rows = self.base(rng, size)
            new = rng.random(size) < UNSEEN_SHARE
            rows[new] = self.unseen[rng.integers(0, len(self.unseen), int(new.sum()))]
            return rows
        variant = {"swap": "e5", "pooling": "cls", "norm": "raw", "spread": "spread"}.get(case)
        if variant is not None:
            return PLAN_VARIANTS.index(variant) * self.count + self.base(rng, size)
        if case.startswith("null") or case == "online_null":
            return self.base(rng, size)
        raise ValueError(f"unknown case {case}")


def injected_class(case: str, replicate: int) -> str | None:
    return SEEN[replicate % len(SEEN)] if case.startswith("share") else None


def build(corpus: Corpus, rows: dict[str, np.ndarray], path: Path, *, n: int = 1000, replicates: int = 10,
          small_replicates: int | None = None,
          null_replicates: int = 200, horizon: int = 6, grid: tuple[int, ...] = (100, 300, 3000),
          grid_replicates: int = 10, grid_null: int = 100, online_null: int = 4, online_null_cycles: int = 100,
          cost_n: int = 1000, seed: int = 0, only: tuple[str, ...] | None = None,
          deltas: tuple[float, ...] = DELTAS, week_nulls: int | None = None) -> dict[str, Any]:
    """Writes the plan to ``path`` and returns its meta. ``only``: just these cases (a variant no case uses
    may be missing from ``rows``). ``deltas``: the share shifts. ``week_nulls``: fresh null decisions
    that set a peer's threshold at a false alarm a week (the peer worker's default when None)."""
    traffic = Traffic(corpus)
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    cases: dict[str, dict[str, Any]] = {}

    def add(name: str, size: int, reps: int, after: int, null: bool, runs: list[str], shift: str) -> None:
        if only is not None and name not in only:
            return
        per = size // FILL
        references, streams = [], []
        for r in range(reps):
            references.append(traffic.base(rng, size))
            before = traffic.base(rng, WARM * per)
            streams.append(np.concatenate([before, traffic.shifted(rng, after * per, shift, r)]))
        arrays[f"{name}/reference"] = np.stack(references)
        arrays[f"{name}/stream"] = np.stack(streams)
        cases[name] = {"n": size, "horizon": after, "null": null, "runs": runs, "shift": shift,
                       "injected": [injected_class(shift, r) for r in range(reps)]}

    add("null", n, null_replicates, 1, True, ["batch"], "null")
    for delta in sorted(deltas, key=lambda d: (d < 0.05, -d)):  # 30, 20, 10, 5, then 2 and 1 (a run cut short)
        name = f"share{round(delta * 100)}"  # δ of 1% and 2% are missed by most: every cycle of the horizon
        reps = small_replicates if small_replicates and delta < 0.05 else replicates
        add(name, n, reps, horizon, False, ["batch", "online"], name)
    for shift in ("unseen", "swap", "pooling", "norm", "spread"):
        add(shift, n, replicates, horizon, False, ["batch", "online"], shift)
    add("online_null", n, online_null, online_null_cycles, True, ["online"], "online_null")
    for size in grid:
        add(f"null_n{size}", size, grid_null, 1, True, ["batch"], "null")
        add(f"share10_n{size}", size, grid_replicates, FILL, False, ["batch"], "share10")
    stacked = np.concatenate([*(rows.get(v, rows["mean"]) for v in VARIANTS),
                              spread_rows(rows["mean"], traffic.seen)]).astype(np.float32)
    meta = {"classes": list(corpus.classes), "seen": list(SEEN), "unseen": list(UNSEEN),
            "variants": list(PLAN_VARIANTS),
            "n": n, "cost_n": cost_n, "fill": FILL, "warm": WARM, "cases": cases, "horizon": horizon}
    if week_nulls is not None:
        meta["week_nulls"] = week_nulls
    np.savez(path, rows=stacked, labels=corpus.labels, meta=json.dumps(meta), **arrays)
    return meta
