"""alibi-detect's detectors, in ``.venv-alibi`` (``scripts/setup alibi``: it needs numpy < 2).

- ``alibi MMDDrift`` / ``alibi LSDDDrift``: the batch kernel tests with their defaults (PyTorch
  backend, p-value 0.05, 100 permutations, no preprocessing). Score: the statistic (``distance``);
  default decision: ``is_drift``.
- ``alibi MMDDriftOnline`` / ``alibi LSDDDriftOnline``: the online forms, calibrated by their own
  bootstrap to an expected run time (ERT) of 100 cycles of records, the matched false-alarm rate of
  the batch table (window of 20 records; 1.2 × ERT bootstraps, the fewest its quantile estimate
  accepts). They see the stream one record at a time
  from ``window`` records before the change (their calibration holds from the first record: no warm-up).
  At most 5 replicates per case: a calibration takes 20 s (MMD) and 27 s (LSDD) of a core per
  reference at n = 500, 15,000 bootstraps (measured on the development machine, idle).

Run: ``.venv-alibi/bin/python -m bench.detection.alibi_worker PLAN OUT [methods...]``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from typing import Any

import numpy as np

from bench.detection import protocol

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ONLINE_WINDOW = 20
BOOTSTRAPS = 2000
ERT_CYCLES = 100
ONLINE_REPLICATES = 5  # per case: each replicate's reference takes its own calibration (20-27 s of a core, measured)


def batch_method(kind: str) -> tuple[Any, Any]:
    from alibi_detect.cd import LSDDDrift, MMDDrift

    detector_class = {"MMDDrift": MMDDrift, "LSDDDrift": LSDDDrift}[kind]

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray) -> Any:
        return detector_class(reference, backend="pytorch", p_val=0.05)

    def decide(detector: Any, window: np.ndarray, seed: int) -> protocol.Score:
        data = detector.predict(window)["data"]
        return float(data["distance"]), {"default": bool(data["is_drift"])}

    return fit, decide


def online_method(kind: str, ert: int) -> tuple[Any, Any]:
    import torch
    from alibi_detect.cd import LSDDDriftOnline, MMDDriftOnline

    detector_class = {"MMDDriftOnline": MMDDriftOnline, "LSDDDriftOnline": LSDDDriftOnline}[kind]
    cache: dict[str, Any] = {}

    def make(reference: np.ndarray, seed: int) -> Any:
        key = hashlib.blake2b(reference.tobytes(), digest_size=16).hexdigest()
        if key not in cache:  # one calibration per reference; a restart after an alarm resets the state
            torch.manual_seed(seed)
            cache.clear()
            cache[key] = detector_class(reference, ert=ert, window_size=ONLINE_WINDOW, backend="pytorch",
                                        n_bootstraps=max(BOOTSTRAPS, int(1.2 * ert)), verbose=False)
        detector = cache[key]
        detector.reset_state()
        return detector

    def step(detector: Any, rows: np.ndarray) -> int | None:
        for i, row in enumerate(rows):
            if detector.predict(row)["data"]["is_drift"]:
                return i
        return None

    return make, step


BATCH = ("alibi MMDDrift", "alibi LSDDDrift")
ONLINE = ("alibi MMDDriftOnline", "alibi LSDDDriftOnline")


def main() -> None:
    plan, out, methods = protocol.main_args()
    results = []
    ert = ERT_CYCLES * plan.records_per_cycle("share10")
    for name in methods or [*BATCH, *ONLINE]:
        kind = name.split()[1]
        try:
            if name in BATCH:
                fit, decide = batch_method(kind)
                results.append(protocol.run_batch(plan, name, fit, decide, lambda s, d: all(d.values()),
                                                  protocol.cost_rows(plan),
                                                  progress=lambda partial: protocol.write(out, [*results, partial])))
            else:
                make, step = online_method(kind, ert)
                result = protocol.run_online(plan, name, make, step, warm=ONLINE_WINDOW,
                                             progress=lambda partial: protocol.write(out, [*results, partial]),
                                             replicate_limit=ONLINE_REPLICATES)
                result["ert"] = ert
                results.append(result)
        except Exception as error:  # one detector failing must not lose the others' results
            logging.getLogger(__name__).exception("%s failed", name)
            results.append({"method": name, "kind": "batch" if name in BATCH else "online",
                            "error": f"{type(error).__name__}: {error}"})
        protocol.write(out, results)


if __name__ == "__main__":
    main()
