"""What every worker shares, numpy and the standard library only (it runs in the peers' virtualenvs).

A *plan* (built by :mod:`bench.detection.streams`, saved as one ``.npz``) holds the pooled rows of
every embedding variant and, per case and replicate, the row ids of the reference sample and of the
record stream. A row id ``v * N + i`` is row ``i`` of variant ``v``.

The streams. A cycle is ``C = n / 4`` records; a batch method decides once per cycle on the last
four cycles' records (``n`` rows, the window) against ``n`` reference rows, so at decision ``k``
after a change a share ``min(1, k / 4)`` of the window follows it. An online method sees the
same records one by one. Every case's stream is ``WARM`` cycles before the change (the online
methods settle on them; the batch windows before the change are never decided) and ``horizon``
cycles after it.

Each batch method turns a (reference, window) pair into a *score* (larger: more drift) and the
decision its own default rule takes; the runner derives other operating points (the matched
false-alarm rate) from the null replicates' scores. A worker writes one JSON of results per method.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

WARM = 40  # cycles of the stream before the change (the online detectors settle on them: 10,000 records at n = 1000)
FILL = 4  # cycles per window

Score = tuple[float, dict[str, bool]]  # (score, {operating point: decided})


@dataclass
class Plan:
    rows: np.ndarray  # (variants * N, d) float32
    labels: np.ndarray  # (N,) class of each pooled text
    classes: list[str]
    seen: list[str]
    meta: dict[str, Any]
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        data = np.load(path, allow_pickle=False)
        meta = json.loads(str(data["meta"]))
        plan = cls(data["rows"], data["labels"], meta["classes"], meta["seen"], meta)
        for name, info in meta["cases"].items():
            plan.cases[name] = dict(info, reference=data[f"{name}/reference"], stream=data[f"{name}/stream"])
        return plan

    def label_of(self, ids: np.ndarray) -> np.ndarray:
        return self.labels[ids % len(self.labels)]

    def records_per_cycle(self, case: str) -> int:
        return int(self.cases[case]["n"]) // FILL


def windows(plan: Plan, case: str, replicate: int) -> Iterator[tuple[int, np.ndarray]]:
    """(k, window row ids) for the decisions k = 1 .. horizon after the change of one replicate."""
    info = plan.cases[case]
    per = plan.records_per_cycle(case)
    stream = info["stream"][replicate]
    for k in range(1, int(info["horizon"]) + 1):
        end = (WARM + k) * per
        yield k, stream[end - FILL * per : end]


class PeakMemory:
    """The resident set's peak above where it stood when entered, sampled every 2 ms from /proc (bytes)."""

    def __enter__(self) -> PeakMemory:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def grown(self) -> int:
        return self.peak - self.start


def _rss() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def phase() -> str:
    """Which part a worker runs (``EMBMON_DETECTION_PHASE``): ``cases`` (the streams, every method at
    once), ``cost`` (the timed decisions, one method at a time on an otherwise idle machine) or ``all``."""
    value = os.environ.get("EMBMON_DETECTION_PHASE", "all")
    if value not in ("all", "cases", "cost"):
        raise ValueError(f"EMBMON_DETECTION_PHASE must be all, cases or cost; got {value!r}")
    return value


MATCHED = 0.01  # the matched per-decision false-alarm rate: the (1 - MATCHED) quantile of a method's null scores
COST_DECISIONS = 7  # decisions timed per method and dimension, their median (of three, one slow one moved it 20%)


def null_case(plan: Plan, case: str) -> str:
    """The null case whose scores set the matched threshold of ``case`` (same n)."""
    n = int(plan.cases[case]["n"])
    return "null" if n == int(plan.meta["n"]) else f"null_n{n}"


def matched_threshold(scores: list[float], rate: float = MATCHED) -> float:
    """The score a decision must exceed for a per-decision false-alarm rate of at most ``rate`` on these nulls."""
    return float(np.quantile(np.asarray(scores), 1 - rate, method="higher"))


def run_batch(plan: Plan, name: str, fit: Callable[..., Any], decide: Callable[..., Any],
              stop_when: Callable[[float, dict[str, bool]], bool],
              cost: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
              explain: bool = False, null_limit: int | None = None,
              log: Callable[[str], None] = print, progress: Callable[[dict[str, Any]], None] | None = None,
              before: Callable[[Any, np.ndarray], None] | None = None,
              ) -> dict[str, Any]:
    """Every case of the plan through one batch method: ``fit(reference, seed, ids) -> state`` (``ids``:
    the reference rows' ids in the plan, for a method that reads their classes) and
    ``decide(state, window, seed) -> (score, decisions[, info])`` (with ``explain``, also given the
    window's row ids and the injected classes). A shift replicate stops once ``stop_when(score,
    decisions)`` and the score exceeds the matched threshold (every operating point has fired), one
    decision later with ``explain`` (the explanation's second cycle). ``before(state, rows)``: a
    method that keeps state from cycle to cycle is handed the stream's records before the change
    (``WARM`` cycles, in order) after its fit. ``cost``: ``{label: rows}``
    timed separately (median seconds of ``COST_DECISIONS`` decisions and the peak memory they added). ``null_limit``:
    at most this many replicates of each null case (a method whose fit is too slow for them all)."""
    out: dict[str, Any] = {"method": name, "kind": "batch", "cases": {}, "cost": {}}
    started = time.perf_counter()
    thresholds: dict[str, float] = {}
    for case, info in plan.cases.items():
        if "batch" not in info["runs"] or phase() == "cost":
            continue
        records = []
        replicates = len(info["reference"])
        if info["null"] and null_limit is not None:
            replicates = min(replicates, null_limit)
        for r in range(replicates):
            reference = plan.rows[info["reference"][r]]
            state = fit(reference, r, info["reference"][r])
            if before is not None:
                before(state, plan.rows[info["stream"][r][: WARM * plan.records_per_cycle(case)]])
            injected = info["injected"][r]
            classes = ([plan.classes.index(injected)] if injected else
                       [plan.classes.index(c) for c in plan.meta["unseen"]] if info["shift"] == "unseen" else [])
            per_k: list[dict[str, Any]] = []
            fired_at = None
            for k, ids in windows(plan, case, r):
                window = plan.rows[ids]
                t0 = time.perf_counter()
                if explain and not info["null"]:
                    answer = decide(state, window, 1000 * r + k, ids, classes)
                else:
                    answer = decide(state, window, 1000 * r + k)
                seconds = time.perf_counter() - t0
                score, decided = answer[0], answer[1]
                record = {"k": k, "score": _finite(score), "decided": decided, "seconds": seconds}
                if len(answer) > 2:
                    record["info"] = answer[2]
                per_k.append(record)
                if info["null"]:
                    break
                threshold = thresholds.get(null_case(plan, case), -math.inf)
                if fired_at is None and stop_when(score, decided) and _finite(score) > threshold:
                    fired_at = k
                if fired_at is not None and k >= fired_at + (1 if explain else 0):
                    break
            records.append(per_k)
        out["cases"][case] = records
        if info["null"]:
            thresholds[case] = matched_threshold([rec[0]["score"] for rec in records])
        out["thresholds"] = thresholds
        log(f"  {name}: {case} ({len(records)} replicates) at {time.perf_counter() - started:.0f}s")
        if progress is not None:  # what is done so far survives a run stopped early
            progress(out)
    for label, (rows, ids) in (cost or {}).items() if phase() != "cases" else ():
        half = len(rows) // 2
        t0 = time.perf_counter()
        state = fit(rows[:half], 0, ids[:half])
        fit_seconds = time.perf_counter() - t0
        seconds, grown = [], []
        for i in range(COST_DECISIONS):
            with PeakMemory() as memory:
                t0 = time.perf_counter()
                decide(state, rows[half:], i)
                seconds.append(time.perf_counter() - t0)
            grown.append(memory.grown)
        out["cost"][label] = {"seconds": float(np.median(seconds)), "peak_bytes": int(max(grown)),
                              "fit_seconds": fit_seconds}
        log(f"  {name}: cost {label} {out['cost'][label]}")
    return out


def run_online(plan: Plan, name: str, make: Callable[[np.ndarray, int], Any],
               step: Callable[[Any, np.ndarray], int | None], warm: int | None = None,
               log: Callable[[str], None] = print, progress: Callable[[dict[str, Any]], None] | None = None,
               replicate_limit: int | None = None) -> dict[str, Any]:
    """Every online case of the plan through an online method: ``make(reference, seed) -> detector``,
    ``step(detector, rows) -> index of the first alarm in rows or None`` (the detector resets itself
    after an alarm). Null streams: alarms over the stream after its warm-up; shift streams: records from
    the change to the first alarm after it (an alarm during the warm-up restarts the detector).
    ``warm``: records before the change to feed (default: the whole warm-up). ``replicate_limit``: at
    most this many replicates per case (a detector whose calibration per reference is slow). In the
    ``cost`` phase: the fit on n reference rows and the seconds per record over ``COST_RECORDS``
    records, timed alone."""
    out: dict[str, Any] = {"method": name, "kind": "online", "cases": {}, "cost": {}}
    started = time.perf_counter()
    block = 50
    if phase() == "cost":
        rows, _ = cost_rows(plan)["d384"]
        half = len(rows) // 2
        t0 = time.perf_counter()
        detector = make(rows[:half], 0)
        fit_seconds = time.perf_counter() - t0
        fed, t0 = 0, time.perf_counter()
        while fed < COST_RECORDS:
            for start in range(0, len(rows) - half, block):
                if step(detector, rows[half + start : half + start + block]) is not None:
                    detector = make(rows[:half], 0)  # an alarm: restart, as a detector would
            fed += len(rows) - half
        out["cost"]["online"] = {"seconds_per_record": (time.perf_counter() - t0) / fed, "fit_seconds": fit_seconds}
        log(f"  {name}: cost {out['cost']['online']}")
        return out
    for case, info in plan.cases.items():
        if "online" not in info["runs"]:
            continue
        per = plan.records_per_cycle(case)
        records = []
        seconds = 0.0
        seen = 0
        replicates = len(info["reference"])
        for r in range(replicates if replicate_limit is None else min(replicates, replicate_limit)):
            detector = make(plan.rows[info["reference"][r]], r)
            skip = 0 if warm is None else max(WARM * per - warm, 0)
            stream = plan.rows[info["stream"][r][skip:]]
            change = WARM * per - skip
            alarms: list[int] = []
            warm_alarms = 0
            position = 0
            t0 = time.perf_counter()
            while position < len(stream):
                chunk = stream[position : position + block]
                hit = step(detector, chunk)
                if hit is None:
                    position += len(chunk)
                    continue
                at = position + hit
                position = at + 1
                if at < change:
                    warm_alarms += 1
                    detector = make(plan.rows[info["reference"][r]], r)
                    continue
                alarms.append(at - change)
                if not info["null"]:
                    break
                detector = make(plan.rows[info["reference"][r]], r)
            seconds += time.perf_counter() - t0
            seen += position
            records.append({"alarms": alarms, "warm_alarms": warm_alarms, "records": len(stream) - change})
        out["cases"][case] = records
        out["cost"].setdefault("seconds_per_record", {})[case] = seconds / max(seen, 1)
        log(f"  {name}: {case} ({len(records)} replicates) at {time.perf_counter() - started:.0f}s")
        if progress is not None:
            progress(out)
    return out


def _finite(value: float) -> float:
    value = float(value)
    if math.isnan(value):
        return -math.inf
    return value


COST_RECORDS = 5000  # records an online method's cost is timed over


def cost_rows(plan: Plan) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Rows to time one decision on at d = 384 and d = 768 (n window rows and n reference rows, n from
    the plan's ``cost_n``): MiniLM mean-pooled rows, and for 768 each row beside its CLS-pooled twin."""
    n = int(plan.meta["cost_n"])
    count = len(plan.labels)
    rng = np.random.default_rng(7)
    ids = rng.choice(count, 2 * n, replace=count < 2 * n)
    mean = plan.rows[ids]
    cls = plan.rows[plan.meta["variants"].index("cls") * count + ids]
    wide = np.concatenate([mean, cls], axis=1) / np.sqrt(2.0)
    return {"d384": (mean, ids), "d768": (wide.astype(np.float32), ids)}


def write(path: str | Path, results: list[dict[str, Any]]) -> None:
    Path(path).write_text(json.dumps(results), encoding="utf-8")


def main_args(argv: list[str] | None = None) -> tuple[Plan, Path, list[str]]:
    """``worker PLAN OUT [methods...]``."""
    args = sys.argv[1:] if argv is None else argv
    return Plan.load(args[0]), Path(args[1]), args[2:]
