"""embedding-monitor's own methods, and river on the centroid-cosine series (the project's venv).

- ``embedding-monitor``: the drift suite alone (MMD, KS, centroid, classifier; Holm) with a false
  alarm a week (``false_alarm_every: 7d``, ``evidence_share: 0``: the whole budget) at a 60 s cycle:
  the held-out null the 5 s and 60 s cycles use. Score: ``-log10(min_i p_i · W / w_i)`` (the
  weighted-Bonferroni p-value, ``k · min p`` at equal weights; the verdict fires when it exceeds
  ``-log10(cycle alpha)``), decided at the 5 s and the 60 s cycle's alpha. With the reference's
  regions, so each decision also carries the explanation.
- ``embedding-monitor every test``: the same without the staged cycle's screen (``screen_level: 1``):
  the classifier and MMD run every cycle, as the suite did before the screen. No regions.
- ``embedding-monitor 900s``: the same at a 900 s cycle (its alpha is reached by permutations).
- ``embedding-monitor centroid only``: the suite with only its centroid test enabled (analytic null,
  the whole budget): the daemon's own difference of means, what a user who watches only for moved
  means would configure; the trade the four tests make is this row against the suite's.
- ``embedding-monitor online``: the daemon's online detectors (ADWIN and Page-Hinkley on the
  standardised cosine and norm signals, mini-batches of 64).
- ``river ADWIN`` / ``river Page-Hinkley``: river's detectors with their default parameters on each
  record's cosine to the reference centroid.
- ``embedding-monitor explain``: what moved, at the daemon's default sizes (:func:`explain_at_defaults`).
- ``embedding-monitor evidence``: the daemon's default at a false alarm a week: the suite at half the
  week's budget OR the accumulating detector (:class:`~monitor.drift.online.evidence.EvidenceDetector`
  on :class:`~monitor.drift.online.evidence.EvidenceCells` of the reference) at the other half
  (``threshold_for(α, 1/2)``: A = 20,160 cycles), betting on each cycle's fresh ``n / 4`` records
  (from the first cycle of the stream: 40 cycles before the change). Together: a false alarm a week.
  (Until this was written down, the bench took α from settings that had already given half of it to
  the detector, and ran this method at a false alarm every two weeks and the suite at half its budget.)
  Its settings are the daemon's defaults, so the centroid's weight is ``auto``: 6 of 9 here, where
  its null is analytic and the MMD's held out (docs/drift.md, "How the budget is shared"); the suite
  alone's too.
- ``embedding-monitor evidence equal weights``: the same with ``drift.centroid.weight: 1``: every test
  a quarter of the suite's half, as the default was before ``auto``; the trade the weight makes is
  this row against the default's.

Run: ``python -m bench.detection.suite_worker PLAN OUT [methods...]``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from bench.detection import protocol
from monitor.drift.attribution.region_shares import RegionReport
from monitor.drift.attribution.regions import Regions, fit_regions
from monitor.drift.online.detectors import OnlineDriftMonitor
from monitor.drift.online.evidence import EvidenceCells, EvidenceDetector, threshold_for
from monitor.drift.online.signals import SignalBaseline
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import DriftReport, run_drift_suite

BUDGET = "7d"


def settings_for(interval: float, n: int, screen_level: float | None = None, **changes: Any) -> DriftSettings:
    """The daemon's defaults at this cycle and size, one thread, the suite alone (``evidence_share: 0``:
    the whole budget; the accumulating detector is :func:`evidence_method`'s); ``screen_level`` 1 runs
    every test every cycle; ``changes``: other settings."""
    staged = {} if screen_level is None else {"screen_level": screen_level}
    fields: dict[str, Any] = {"interval_seconds": interval, "false_alarm_every": BUDGET, "window_sample_size": n,
                              "reference_sample_size": n, "threads": 1, "evidence_share": 0.0, **staged, **changes}
    return DriftSettings(**fields)


def score_of(report: DriftReport) -> float:
    """``-log10`` of the cycle's weighted-Bonferroni p-value (``report.adjusted_p_value``), unclipped at 1."""
    total = sum(report.weights.values()) or report.family_size
    weight = report.weights or dict.fromkeys(report.planned, 1.0)
    smallest = min((r.p_value * total / weight[r.test] for r in report.results), default=1.0)
    return -math.log10(max(smallest, 1e-300))


def explanation(report: DriftReport, regions: Regions | None, window: np.ndarray, labels: np.ndarray,
                injected: list[int]) -> dict[str, Any]:
    """What the explanation said, scored against the injected classes (``labels`` of the window rows)."""
    explained = report.regions
    if explained is None or regions is None:
        return {}
    assigned, _ = regions.assign(np.asarray(window, dtype=np.float64))
    hit = np.isin(labels, injected)

    def purity(region: int) -> float:
        members = assigned == region
        return float(hit[members].mean()) if members.any() else 0.0

    named = [r.region for r in explained.regions if r.shifted and r.change > 0]
    top = explained.ranked()[0]
    first = top.region if report.detected else None
    # what the on-call reads beside the first region: its window exemplars (ids are row positions)
    shown = [int(e) for e in top.window_exemplars] if first is not None else []
    return {
        "first_exemplars": len(shown),
        "first_exemplars_injected": int(hit[shown].sum()) if shown else 0,
        "named": named,
        "named_purity": [purity(r) for r in named],
        "first": first,
        "first_purity": purity(first) if first is not None else 0.0,
        "novel_share": explained.novel_share,
        "novel_reference_share": explained.novel_reference_share,
        "novel_shifted": explained.novel_shifted,
        "k": regions.k,
    }


def suite_method(plan: protocol.Plan, interval: float, screen_level: float | None = None,
                 tests: tuple[str, ...] | None = None) -> tuple[Any, Any]:
    """The suite at its budget (:func:`settings_for`); ``tests``: only these enabled (the centroid's null
    then analytic, as the suite's is at a 60 s cycle)."""
    only: dict[str, Any] = {} if tests is None else {
        name: {"enabled": name in tests, **({"null": "analytic"} if name == "centroid" else {})}
        for name in ("mmd", "ks", "centroid", "classifier")}
    alphas = {f"{i:g}s": settings_for(i, 1000, **only).cycle_alpha
              for i in ((5.0, 60.0) if interval == 60 else (interval,))}
    explains = interval == 60 and screen_level is None and tests is None

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray | None = None) -> Any:
        regions = fit_regions(reference, seed=seed) if explains else None
        return settings_for(interval, len(reference), screen_level, **only), reference, regions

    def decide(state: Any, window: np.ndarray, seed: int, ids: np.ndarray | None = None,
               injected: list[int] | None = None) -> tuple[float, dict[str, bool], dict[str, Any]]:
        settings, reference, regions = state
        explain = regions if ids is not None else None
        report = run_drift_suite(window, reference, settings, seed=seed, regions=explain)
        score = score_of(report)
        decided = {name: score >= -math.log10(alpha) for name, alpha in alphas.items()}
        info: dict[str, Any] = {"tests": {r.test: r.p_value for r in report.results},
                                "screen": report.screen_p_value}
        if explain is not None and ids is not None:
            info["explanation"] = explanation(report, regions, window, plan.label_of(ids), injected or [])
        return score, decided, info

    return fit, decide


EVIDENCE_SHARE = 0.5  # of the week's budget, spent on the accumulating detector; the suite gets the rest


def evidence_method(plan: protocol.Plan, centroid_weight: float | str = "auto") -> tuple[Any, Any, Any]:
    """``embedding-monitor evidence`` (module docstring): ``(fit, decide, before)`` for
    :func:`~bench.detection.protocol.run_batch`. The score is the larger of the suite's and the
    detector's distance to their own thresholds (``-log10`` p-values and ``log10 R_t`` against
    ``log10 A``), so it is at least 0 exactly when the method fires; each decision's info holds the
    detector's alarms so far (before the change included: a false alarm there restarts it)."""
    per = plan.records_per_cycle("null")
    alpha = settings_for(60.0, int(plan.meta["n"])).cycle_alpha  # the week's whole budget
    threshold = threshold_for(alpha, EVIDENCE_SHARE)

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray | None = None) -> Any:
        # the daemon's split: its settings give the suite (1 - s) of the week's alpha
        settings = settings_for(60.0, len(reference), evidence_share=EVIDENCE_SHARE,
                                centroid={"weight": centroid_weight})
        assert math.isclose(settings.cycle_alpha, (1 - EVIDENCE_SHARE) * alpha)
        cells = EvidenceCells.fit(reference, seed=seed)
        return settings, reference, cells, EvidenceDetector(cells.reference_counts, threshold, sets=cells.sets(),
                                                            seed=seed)

    def before(state: Any, rows: np.ndarray) -> None:
        _, _, cells, detector = state
        for start in range(0, len(rows), per):
            detector.update(cells.assign(rows[start : start + per]))

    def decide(state: Any, window: np.ndarray, seed: int) -> tuple[float, dict[str, bool], dict[str, Any]]:
        settings, reference, cells, detector = state
        report = run_drift_suite(window, reference, settings, seed=seed)
        suite = score_of(report) + math.log10(settings.cycle_alpha)
        step = detector.update(cells.assign(window[-per:]))  # the cycle's fresh records
        evidence = (step.log_evidence - math.log(threshold)) / math.log(10)
        score = max(suite, evidence)
        info = {"suite": suite >= 0, "evidence": bool(step.alarmed), "log_evidence": step.log_evidence,
                "evidence_alarms": detector.alarms, "evidence_cycles": detector.cycles}
        return score, {"60s": bool(suite >= 0 or step.alarmed)}, info

    return fit, decide, before


def online_method(name: str) -> tuple[Any, Any]:
    if name == "embedding-monitor online":
        def make(reference: np.ndarray, seed: int) -> Any:
            return OnlineDriftMonitor(SignalBaseline.from_reference(reference))

        def step(monitor: Any, rows: np.ndarray) -> int | None:
            before = monitor.records_seen
            changes = monitor.update(rows, now=0.0)
            return min(c.record_index for c in changes) - before if changes else None

        return make, step
    from river import drift

    kind = {"river ADWIN": drift.ADWIN, "river Page-Hinkley": drift.PageHinkley}[name]

    def make_river(reference: np.ndarray, seed: int) -> Any:
        centre = reference.mean(axis=0, dtype=np.float64)
        return kind(), centre / np.linalg.norm(centre)

    def step_river(state: Any, rows: np.ndarray) -> int | None:
        detector, unit = state
        cosines = (rows @ unit) / np.linalg.norm(rows, axis=1)
        for i, value in enumerate(cosines.tolist()):
            detector.update(value)
            if detector.drift_detected:
                return i
        return None

    return make_river, step_river


EXPLAIN_CASES = ("share10", "share20", "share30", "unseen")
EXPLAIN_REFERENCE, EXPLAIN_WINDOW = 4000, 2000  # the daemon's stored reference sample and window sample


def explain_at_defaults(plan: protocol.Plan, caps: tuple[int, ...] = (16, 32), seed: int = 31) -> dict[str, Any]:
    """Point 5 at the daemon's default sizes: per case and replicate (one per seen class, each injected
    once), a 4,000-row reference of base traffic with its regions (at each ``caps`` value of
    ``drift.regions.max_regions``) and a 2,000-row window wholly after the change, through the suite
    at a 60 s cycle with its default settings. Records the verdict and, per cap, the explanation
    scored as :func:`explanation` does (gated by the verdict, as the daemon shows it) and ungated
    (the ranking and the regions Benjamini-Hochberg names, whatever the verdict)."""
    from bench.detection.streams import Traffic

    traffic = Traffic.from_plan(plan)
    rng = np.random.default_rng(seed)
    settings = DriftSettings(interval_seconds=60.0, false_alarm_every=BUDGET, threads=1)
    out: dict[str, Any] = {"method": "embedding-monitor explain", "kind": "explain", "cases": {},
                           "sizes": [EXPLAIN_REFERENCE, EXPLAIN_WINDOW], "caps": list(caps)}
    if protocol.phase() == "cost":
        return out
    for case in EXPLAIN_CASES:
        records = []
        for r in range(len(plan.seen)):
            reference = plan.rows[traffic.base(rng, EXPLAIN_REFERENCE)]
            ids = traffic.shifted(rng, EXPLAIN_WINDOW, case, r)
            window = plan.rows[ids]
            injected = ([plan.classes.index(plan.seen[r])] if case.startswith("share") else
                        [plan.classes.index(c) for c in plan.meta["unseen"]])
            record: dict[str, Any] = {"class": plan.classes[injected[0]] if case.startswith("share") else "unseen"}
            for cap in caps:  # the whole cycle per cap: the explanation as the daemon computes it (its
                # reference subsample and seeds), at the price of the same verdict computed twice
                regions = fit_regions(reference, max_regions=cap, seed=r)
                report = run_drift_suite(window, reference, settings, seed=r, regions=regions,
                                         window_ids=tuple(map(str, range(len(ids)))))
                record["detected"] = report.detected
                record[f"gated{cap}"] = explanation(report, regions, window, plan.label_of(ids), injected)
                ungated = replace(report, detected=True, regions=_ungated(report.regions))
                record[f"ungated{cap}"] = explanation(ungated, regions, window, plan.label_of(ids), injected)
            records.append(record)
        out["cases"][case] = records
        print(f"  explain: {case} done", flush=True)
    return out


def _ungated(explained: RegionReport | None) -> RegionReport | None:
    """The explanation as if the verdict had fired: each region named by its own adjusted p-value."""
    if explained is None:
        return None
    return replace(explained, verdict=True, regions=tuple(
        replace(shift, shifted=shift.p_adjusted <= explained.alpha) for shift in explained.regions))


# name: (cycle seconds, screen level); None: the default staged cycle, 1: every test every cycle (the unstaged suite)
BATCH: dict[str, tuple[float, float | None]] = {
    "embedding-monitor": (60.0, None), "embedding-monitor 900s": (900.0, None),
    "embedding-monitor every test": (60.0, 1.0),
}
CENTROID_ONLY = "embedding-monitor centroid only"
EVIDENCE = "embedding-monitor evidence"
EVIDENCE_EQUAL = "embedding-monitor evidence equal weights"
ONLINE = ("embedding-monitor online", "river ADWIN", "river Page-Hinkley")


def main() -> None:
    plan, out, methods = protocol.main_args()
    methods = methods or [*BATCH, CENTROID_ONLY, EVIDENCE, EVIDENCE_EQUAL, *ONLINE, "embedding-monitor explain"]
    results = []
    for name in methods:
        if name == "embedding-monitor explain":
            results.append(explain_at_defaults(plan))
        elif name in (EVIDENCE, EVIDENCE_EQUAL):
            fit, decide, before = evidence_method(plan, 1.0 if name == EVIDENCE_EQUAL else "auto")
            results.append(protocol.run_batch(plan, name, fit, decide, lambda s, d: all(d.values()),
                                              protocol.cost_rows(plan), before=before,
                                              progress=lambda partial: protocol.write(out, [*results, partial])))
        elif name in BATCH or name == CENTROID_ONLY:
            fit, decide = (suite_method(plan, 60.0, tests=("centroid",)) if name == CENTROID_ONLY
                           else suite_method(plan, *BATCH[name]))
            results.append(protocol.run_batch(plan, name, fit, decide, lambda s, d: all(d.values()),
                                              protocol.cost_rows(plan), explain=name == "embedding-monitor",
                                              progress=lambda partial: protocol.write(out, [*results, partial])))
        else:
            make, step = online_method(name)
            results.append(protocol.run_online(plan, name, make, step,
                                               progress=lambda partial: protocol.write(out, [*results, partial])))
        protocol.write(out, results)


if __name__ == "__main__":
    main()
