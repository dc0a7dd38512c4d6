"""The accumulating detector (:mod:`monitor.drift.online.evidence`) on the detection benchmark's traffic.

    PYTHONPATH=. .venv/bin/python -m bench.evidence_delay                  # δ = 2, 5, 10%, 60 cycles, 5 replicates
    PYTHONPATH=. .venv/bin/python -m bench.evidence_delay --replicates 10 --null-cycles 2000

The traffic of ``bench/detection`` (WordNet glosses, MiniLM mean pooling, 16 seen classes in equal
shares; :mod:`bench.detection.streams`): per replicate a reference of ``n`` rows, its regions
(:func:`~monitor.drift.attribution.regions.fit_regions`, as the daemon fits them), then a stream of
``n / 4`` fresh rows a cycle (the benchmark's cycle: a window is four cycles), ``warm`` cycles
unchanged and then one class's share raised by δ for up to ``horizon`` cycles. The detector's
threshold is a false alarm a week at a 60 s cycle with half the budget (A = 20,160 cycles). Reports
the delay (cycles after the change to the first alarm) per δ and replicate, and the false alarms
over ``null-cycles`` unchanged cycles per replicate. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from bench.detection import corpus
from bench.detection.streams import Traffic
from monitor.drift.attribution.regions import fit_regions
from monitor.drift.online.evidence import EvidenceDetector, threshold_for


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="reference rows and window rows (default 500)")
    parser.add_argument("--replicates", type=int, default=5)
    parser.add_argument("--horizon", type=int, default=60)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--null-cycles", type=int, default=1000)
    parser.add_argument("--deltas", default="0.02,0.05,0.10")
    args = parser.parse_args(argv)
    started = time.monotonic()
    texts = corpus.load()
    rows = corpus.embeddings(texts, ("mean",))["mean"]
    traffic = Traffic(texts)
    threshold = threshold_for(60 / (7 * 86400), 0.5)
    per = args.n // 4
    out: dict[str, object] = {"n": args.n, "rows_per_cycle": per, "threshold": threshold, "horizon": args.horizon}
    delays: dict[str, list[int | None]] = {}
    null_alarms = 0
    for replicate in range(args.replicates):
        rng = np.random.default_rng(replicate)
        reference = rows[traffic.base(rng, args.n)]
        regions = fit_regions(reference, seed=replicate)
        if regions is None:
            raise RuntimeError("too few reference rows for regions")
        detector = EvidenceDetector(regions.reference_counts, threshold, seed=replicate)
        for _ in range(args.null_cycles):
            detector.update(regions.assign(rows[traffic.base(rng, per)])[0])
        null_alarms += detector.alarms
        for delta in (float(d) for d in args.deltas.split(",")):
            detector = EvidenceDetector(regions.reference_counts, threshold, seed=1000 + replicate)
            for _ in range(args.warm):
                detector.update(regions.assign(rows[traffic.base(rng, per)])[0])
            case = f"share{round(delta * 100)}"
            found = None
            for k in range(1, args.horizon + 1):
                labels = regions.assign(rows[traffic.shifted(rng, per, case, replicate)])[0]
                if detector.update(labels).alarmed:
                    found = k
                    break
            delays.setdefault(f"{delta:g}", []).append(found)
    out["delays"] = delays
    out["summary"] = {
        delta: {"found": sum(d is not None for d in found), "of": len(found),
                "median_cycles": statistics.median(d for d in found if d is not None)
                if any(d is not None for d in found) else None}
        for delta, found in delays.items()
    }
    out["null"] = {"cycles": args.null_cycles * args.replicates, "false_alarms": null_alarms,
                   "bound": args.null_cycles * args.replicates / threshold}
    out["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
