"""The accumulating detector (:mod:`monitor.drift.online.evidence`) on the detection benchmark's traffic.

    PYTHONPATH=. .venv/bin/python -m bench.evidence_delay                    # δ = 2, 5, 10%, unseen; 125 rows a cycle
    PYTHONPATH=. .venv/bin/python -m bench.evidence_delay --rows-per-cycle 500,2000 --score regions

The traffic of ``bench/detection`` (WordNet glosses, MiniLM mean pooling, 16 seen classes in equal
shares; :mod:`bench.detection.streams`): per replicate a reference of ``n`` rows and its score fitted
on half of it, then a stream of fresh rows (``n / 4`` a cycle by default, the benchmark's cycle: a
window is four cycles), ``warm`` cycles unchanged and then the shift for up to ``horizon`` cycles:
one class's share raised by δ, or 10% of the records from the four unseen classes. The score:
``cells`` (:class:`~monitor.drift.online.evidence.EvidenceCells`: two partitions of 16 regions and
the far bit, what the benchmark's ``embedding-monitor evidence`` runs) or ``regions`` (the daemon's
:func:`~monitor.drift.attribution.regions.fit_regions` labels, k = held-out rows / 50). The
threshold is a false alarm a week at a 60 s cycle with half the budget (A = 20,160 cycles).
Reports the delay (cycles after the change to the first alarm; a miss counts as the horizon in
the mean) per case, rate and replicate, and the false alarms over ``null-cycles`` unchanged cycles
per replicate and rate. Prints JSON.

Beside each delay, the *information bound* of the score: the Kullback–Leibler divergence of the
shifted traffic's cell shares from the unchanged traffic's (exact, from the traffic's mixture of
classes), times the rows a cycle. That is the mean log-evidence a cycle gives a bet that knows the
shifted shares; no bet on these cells gains more on average, so by Wald's identity a detector on
them needs about ``log A`` divided by it cycles at the least (``bound_cycles``, median over
replicates). A case whose bound is near the horizon cannot be found within it on these cells at
this rate, however the bets are tuned; ``None``: unbounded (a cell holds only shifted rows of this
finite corpus).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from bench.detection import corpus
from bench.detection.streams import SEEN, UNSEEN_SHARE, Traffic
from monitor.drift.attribution.regions import fit_regions
from monitor.drift.online.evidence import EvidenceCells, EvidenceDetector, threshold_for

Scorer = tuple[Callable[[np.ndarray], np.ndarray], Callable[[int], EvidenceDetector]]


def scorer(kind: str, reference: np.ndarray, seed: int, partitions: tuple[int, ...] = (16, 16),
           directions: int = 0) -> Scorer:
    """(rows -> labels, seed -> a fresh detector) for one replicate's reference."""
    threshold = threshold_for(60 / (7 * 86400), 0.5)
    if kind == "cells":
        cells = EvidenceCells.fit(reference, regions=partitions, directions=directions, seed=seed)
        return cells.assign, lambda s: EvidenceDetector(cells.reference_counts, threshold, sets=cells.sets(), seed=s)
    regions = fit_regions(reference, seed=seed)
    if regions is None:
        raise RuntimeError("too few reference rows for regions")
    return (lambda rows: regions.assign(rows)[0]), lambda s: EvidenceDetector(regions.reference_counts, threshold,
                                                                               seed=s)


def information_per_row(table: np.ndarray, traffic: Traffic, case: str, replicate: int, k: int) -> float:
    """KL(shifted cell shares || unchanged cell shares) in nats per row, exactly, from the traffic's mixture.

    Unchanged traffic draws uniformly from the seen classes' rows; a share case replaces a row by one
    of the injected class's with probability ``δ / (1 - 1/16)``, the unseen case by an unseen
    class's with probability 0.1 (:meth:`bench.detection.streams.Traffic.shifted`): so the shifted
    shares are that mixture of the cell shares of the rows drawn from."""
    def shares(ids: np.ndarray) -> np.ndarray:
        return np.bincount(table[ids], minlength=k) / len(ids)

    base = shares(traffic.seen)
    if case.startswith("share"):
        weight = int(case[len("share"):]) / 100 / (1 - 1 / len(SEEN))
        moved = (1 - weight) * base + weight * shares(traffic.by_class[SEEN[replicate % len(SEEN)]])
    elif case == "unseen":
        moved = (1 - UNSEEN_SHARE) * base + UNSEEN_SHARE * shares(traffic.unseen)
    else:
        raise ValueError(f"no information bound for the case {case}")
    seen = moved > 0
    with np.errstate(divide="ignore"):
        return float(np.sum(moved[seen] * np.log(moved[seen] / base[seen])))  # inf where only shifted rows go


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="reference rows and window rows (default 500)")
    parser.add_argument("--rows-per-cycle", default="", help="fresh rows a cycle, comma-separated (default n / 4)")
    parser.add_argument("--score", choices=("cells", "regions"), default="cells")
    parser.add_argument("--partitions", default="16,16", help="cells: the regions of each k-means partition")
    parser.add_argument("--directions", type=int, default=0, help="cells: principal directions' sides (default 0)")
    parser.add_argument("--replicates", type=int, default=5)
    parser.add_argument("--horizon", type=int, default=60)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--null-cycles", type=int, default=1000)
    parser.add_argument("--cases", default="share2,share5,share10,unseen")
    args = parser.parse_args(argv)
    started = time.monotonic()
    texts = corpus.load()
    rows = corpus.embeddings(texts, ("mean",))["mean"]
    traffic = Traffic(texts)
    rates = [int(r) for r in args.rows_per_cycle.split(",")] if args.rows_per_cycle else [args.n // 4]
    out: dict[str, object] = {"n": args.n, "score": args.score, "partitions": args.partitions,
                              "directions": args.directions, "threshold": threshold_for(60 / (7 * 86400), 0.5),
                              "horizon": args.horizon, "warm": args.warm, "replicates": args.replicates}
    delays: dict[str, dict[str, list[int | None]]] = {}
    information: dict[str, list[float]] = {}
    null: dict[str, dict[str, float]] = {}
    for replicate in range(args.replicates):
        rng = np.random.default_rng(replicate)
        reference = rows[traffic.base(rng, args.n)]
        partitions = tuple(int(k) for k in args.partitions.split(","))
        assign, make = scorer(args.score, reference, replicate, partitions, args.directions)
        table = assign(rows)  # the corpus is small: every row's label once, a stream's by lookup
        k = int(table.max()) + 1
        for case in args.cases.split(","):
            information.setdefault(case, []).append(information_per_row(table, traffic, case, replicate, k))
        for per in rates:
            detector = make(replicate)
            for _ in range(args.null_cycles):
                detector.update(table[traffic.base(rng, per)])
            entry = null.setdefault(str(per), {"cycles": 0, "false_alarms": 0})
            entry["cycles"] += args.null_cycles
            entry["false_alarms"] += detector.alarms
            for case in args.cases.split(","):
                detector = make(1000 + replicate)
                for _ in range(args.warm):
                    detector.update(table[traffic.base(rng, per)])
                found = None
                for k in range(1, args.horizon + 1):
                    if detector.update(table[traffic.shifted(rng, per, case, replicate)]).alarmed:
                        found = k
                        break
                delays.setdefault(str(per), {}).setdefault(case, []).append(found)
    out["delays"] = delays
    log_a = float(np.log(float(out["threshold"])))  # type: ignore[arg-type]
    # None: unbounded (some cell holds only shifted rows of this finite corpus, so a perfect bet is sure at once)
    out["information"] = {case: {"nats_per_row": round(median, 5) if np.isfinite(median) else None,
                                 "bound_cycles": {per: round(log_a / max(median * int(per), 1e-12), 1)
                                                  for per in map(str, rates)}}
                          for case, median in ((c, statistics.median(v)) for c, v in information.items())}
    out["summary"] = {
        per: {case: {"found": sum(d is not None for d in found), "of": len(found),
                     "mean_cycles": round(statistics.mean(args.horizon if d is None else d for d in found), 1),
                     "median_found": statistics.median(d for d in found if d is not None)
                     if any(d is not None for d in found) else None}
              for case, found in by_case.items()}
        for per, by_case in delays.items()
    }
    threshold = float(out["threshold"])  # type: ignore[arg-type]
    out["null"] = {per: dict(entry, bound=entry["cycles"] / threshold) for per, entry in null.items()}
    out["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
