"""The drift component's metric families, built at scrape time from published values only.

Definitions, healthy and unhealthy values: docs/metrics.md, "Drift". Per (model, stream):

* ``embmon_reference_records`` / ``embmon_reference_timestamp_seconds``: the reference in use;
* from the last test cycle (:class:`CycleResult`): ``embmon_drift_mmd2``,
  ``embmon_drift_p_value{test}``, ``embmon_drift_threshold{test}``, ``embmon_drift_detected{test}``
  (``test`` in mmd, ks, centroid, classifier; ``suite`` is the cycle's multiplicity-corrected
  verdict; ``sustained`` is ``drift.sustained``'s N-of-M rule over the last cycles, detected
  only), ``embmon_drift_drifted_components_ratio``, ``embmon_drift_centroid_cosine_distance``,
  ``embmon_drift_classifier_auc``;
* the cycle's budget: ``embmon_drift_p_value_floor{test}`` (the smallest p-value the test could
  give: ``1 / (1 + permutations)`` for a permutation test, 0 for the others) and
  ``embmon_drift_tests_cut_total{test}`` (tests the deadline cut short, every planned test from 0),
  ``embmon_drift_tests_screened_total{test}`` (costly tests the staged cycle's screen left out, every
  planned test from 0) and ``embmon_drift_screen_p_value`` (the smallest cheap p-value the screen read);
* where it moved, when the reference has regions: ``embmon_drift_region_reference_ratio{region}``,
  ``embmon_drift_region_window_ratio{region}``, ``embmon_drift_region_p_value{region}`` (BH-adjusted),
  ``embmon_drift_regions_shifted`` and ``embmon_drift_novel_ratio``;
* from the online detectors: ``embmon_drift_change_points_total{signal,detector}`` and
  ``embmon_drift_last_change_timestamp_seconds{signal,detector}`` (only once a change happened);
* from the accumulating detector (:mod:`monitor.drift.online.evidence_feed`), once it has bet:
  ``embmon_drift_log_evidence`` (``log R_t`` at the last cycle), ``embmon_drift_log_evidence_threshold``
  (``log A``), ``embmon_drift_detected{test="evidence"}`` and ``embmon_drift_evidence_alarms_total``.

And for the component itself, ``embmon_drift_errors_total{stage}`` (every stage of
:data:`ERROR_STAGES`, from 0): failures it caught and lived with, which the verdicts above
cannot show.

The suite's p-value is the Bonferroni-adjusted minimum ``min(1, k · min p)`` over the k planned
tests (a test without a result counts as ``p = 1``), and its threshold the suite's per-cycle α:
``detected{test="suite"}`` is 1 exactly when that p-value is at most that threshold (Holm and
Bonferroni reject the global null in the same cycles). The stream's verdict is the suite's OR the
accumulating detector's (``detected{test="evidence"}``); the drift alert pages on either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from monitor import catalog
from monitor.decoding.records import StreamKey
from monitor.drift.attribution.region_shares import RegionReport
from monitor.drift.online.evidence_feed import EvidenceResult
from monitor.drift.settings import MAX_WEIGHT, MIN_WEIGHT, TEST_NAMES
from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.suite import DriftReport
from monitor.state import checks

ChangeKey = tuple[str, str, str, str]  # (model, stream, signal, detector)
TestKey = tuple[str, str, str]  # (model, stream, test)
MS = ["model", "stream"]
# store: a reference could not be written to the state directory (kept in memory; a restart
# would capture it again); cycle: one stream's test cycle raised (that stream got no verdict);
# test: one drift test raised inside a cycle (left out of the verdict; the others still decide).
ERROR_STAGES = ("store", "cycle", "test")


@dataclass(frozen=True)
class CycleResult:
    """One (model, stream)'s last test cycle, as published by the drift job."""

    report: DriftReport
    sustained: bool
    computed_at: float
    reference_captured_at: float
    evidence: EvidenceResult | None = None  # the accumulating detector's bet, when it ran this cycle

    @property
    def detected(self) -> bool:
        """The stream's verdict: the suite's, or the accumulating detector's alarm."""
        return self.report.detected or (self.evidence is not None and self.evidence.alarmed)

    @property
    def flagged_by(self) -> str | None:
        """Which part flagged drift: ``suite``, ``evidence``, ``both``, or None."""
        parts = [name for name, flagged in (("suite", self.report.detected),
                                            ("evidence", self.evidence is not None and self.evidence.alarmed))
                 if flagged]
        return None if not parts else parts[0] if len(parts) == 1 else "both"

    def state_dict(self) -> dict[str, Any]:
        """Plain values for a checkpoint: what the exported series and the explanation need
        (per-test diagnostics beyond ``drifted_components_ratio`` and the p-value floor are dropped)."""
        report = self.report
        return {
            "tests": [
                [r.test, r.statistic, r.p_value, r.threshold, r.detected, r.extra.get("drifted_components_ratio"),
                 r.extra.get("p_value_floor")]
                for r in report.results
            ],
            "planned": list(report.planned),
            "cut": dict(report.cut),
            "screened": list(report.screened),
            "screen_p_value": report.screen_p_value,
            "weights": dict(report.weights),
            "regions": None if report.regions is None else report.regions.state_dict(),
            "detected": report.detected,
            "cycle_alpha": report.cycle_alpha,
            "multiplicity": report.multiplicity,
            "window_size": report.window_size,
            "reference_size": report.reference_size,
            "seconds": report.seconds,
            "errors": dict(report.errors),
            "sustained": self.sustained,
            "computed_at": self.computed_at,
            "reference_captured_at": self.reference_captured_at,
            "evidence": None if self.evidence is None else self.evidence.state(),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> CycleResult:
        """A checkpointed verdict; a value no cycle produces raises :class:`~monitor.state.checks.InvalidState`."""
        tests = tuple(_test_from_state(entry) for entry in state["tests"])
        planned = tuple(str(t) for t in state.get("planned") or ())
        detected = bool(state["detected"])
        if detected != any(t.detected for t in tests):
            raise checks.InvalidState(f"the verdict ({'detected' if detected else 'not detected'}) is not its tests' "
                                      f"({', '.join(t.test for t in tests if t.detected) or 'none detected'})")
        beyond = [t.test for t in tests if t.detected and not t.p_value <= t.threshold]
        if beyond:
            raise checks.InvalidState(f"tests detected above their thresholds: {', '.join(beyond)}")
        regions = state.get("regions")
        report = DriftReport(
            results=tests, detected=detected,
            cycle_alpha=checks.probability(state["cycle_alpha"], "cycle alpha"),
            multiplicity=str(state["multiplicity"]), window_size=checks.count(state["window_size"], "window size"),
            reference_size=checks.count(state["reference_size"], "reference size"),
            seconds=checks.finite(state["seconds"], "cycle seconds", low=0.0),
            errors={str(k): str(v) for k, v in dict(state["errors"]).items()},
            planned=planned,
            cut={str(k): str(v) for k, v in dict(state.get("cut") or {}).items()},
            regions=None if regions is None else RegionReport.from_state_dict(dict(regions)),
            screened=tuple(str(t) for t in state.get("screened") or ()),
            screen_p_value=None if state.get("screen_p_value") is None
            else checks.probability(state["screen_p_value"], "screen p-value"),
            weights=_weights_from_state(state.get("weights"), tests, planned),
        )
        evidence = state.get("evidence")
        return cls(report, bool(state["sustained"]), checks.finite(state["computed_at"], "cycle time"),
                   checks.finite(state["reference_captured_at"], "reference time"),
                   None if evidence is None else EvidenceResult.from_state(evidence))


def _weights_from_state(value: Any, tests: tuple[TestResult, ...], planned: tuple[str, ...]) -> dict[str, float]:
    """A checkpointed verdict's test weights: a mapping of known test names to weights a setting can
    hold (``MIN_WEIGHT`` to ``MAX_WEIGHT``) that names every test with a result, and exactly the
    planned tests when the verdict lists them (the weights are the family the cycle's p-value is
    over). None or empty: equal weights (a checkpoint written before the weights)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise checks.InvalidState(f"test weights must be a mapping, got {type(value).__name__}")
    weights: dict[str, float] = {}
    for name, weight in value.items():
        if name not in TEST_NAMES:
            raise checks.InvalidState(f"test weights name {name!r}, not one of {', '.join(TEST_NAMES)}")
        number = checks.finite(weight, f"test weight of {name}", low=MIN_WEIGHT)
        if number > MAX_WEIGHT:
            raise checks.InvalidState(f"test weight of {name} is {number}, above {MAX_WEIGHT:g}")
        weights[name] = number
    missing = [t.test for t in tests if t.test not in weights]
    if weights and missing:
        raise checks.InvalidState(f"test weights miss the tests with a result: {', '.join(missing)}")
    if weights and planned and set(weights) != set(planned):
        raise checks.InvalidState(f"test weights name {', '.join(sorted(weights))}, not the planned tests "
                                  f"{', '.join(sorted(planned))}")
    return weights


def _test_from_state(entry: list[Any]) -> TestResult:
    """One checkpointed test result (checkpoints written before the p-value floor have 6 fields)."""
    test, statistic, p_value, threshold, detected, ratio = entry[:6]
    floor = entry[6] if len(entry) > 6 else None
    name = str(test)
    extra = {} if ratio is None else {"drifted_components_ratio": checks.probability(ratio, f"{name} drifted ratio")}
    if floor is not None:
        extra["p_value_floor"] = checks.probability(floor, f"{name} p-value floor")
    return TestResult(
        name, checks.finite(statistic, f"{name} statistic"), checks.probability(p_value, f"{name} p-value"),
        checks.probability(threshold, f"{name} threshold"), bool(detected), extra,
    )



@dataclass(frozen=True)
class ReferenceInfo:
    """The reference a (model, stream) is compared with (``origin`` adds ``lagged`` to the stored origins)."""

    records: int
    captured_at: float
    origin: str
    source: str
    dim: int


@dataclass(frozen=True)
class ChangeTotals:
    changes: int
    last_timestamp: float | None


@dataclass(frozen=True)
class DriftSnapshot:
    """Everything one scrape exports; built from copies, never mutated."""

    results: Mapping[StreamKey, CycleResult] = field(default_factory=dict)
    references: Mapping[StreamKey, ReferenceInfo] = field(default_factory=dict)
    changes: Mapping[ChangeKey, ChangeTotals] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)  # stage -> failures since start
    cuts: Mapping[TestKey, int] = field(default_factory=dict)  # tests the deadline cut, since start
    screens: Mapping[TestKey, int] = field(default_factory=dict)  # costly tests the screen left out, since start
    evidence_alarms: Mapping[StreamKey, int] = field(default_factory=dict)  # accumulating detector's, since start


def suite_p_value(report: DriftReport) -> float | None:
    """``min(1, min_i p_i · W / w_i)`` over the planned tests (their weights ``w_i``, total ``W``;
    ``k · min p`` with equal weights), a test without a result counting as ``p = 1`` (so 1 when
    the deadline cut every test: the cycle's verdict is still "not detected", and
    ``embmon_drift_tests_cut_total`` says why); None when no test was planned."""
    return report.adjusted_p_value


def families(snapshot: DriftSnapshot) -> Iterable[Metric]:
    ref_records = catalog.gauge("embmon_reference_records")
    ref_time = catalog.gauge("embmon_reference_timestamp_seconds")
    for (model, stream), ref in sorted(snapshot.references.items()):
        ref_records.add_metric([model, stream], float(ref.records))
        ref_time.add_metric([model, stream], ref.captured_at)
    yield ref_records
    yield ref_time

    mmd2 = catalog.gauge("embmon_drift_mmd2")
    p_value = catalog.gauge("embmon_drift_p_value")
    threshold = catalog.gauge("embmon_drift_threshold")
    detected = catalog.gauge("embmon_drift_detected")
    ratio = catalog.gauge("embmon_drift_drifted_components_ratio")
    cosine = catalog.gauge("embmon_drift_centroid_cosine_distance")
    auc = catalog.gauge("embmon_drift_classifier_auc")
    for (model, stream), cycle in sorted(snapshot.results.items()):
        labels = [model, stream]
        report = cycle.report
        for result in report.results:
            p_value.add_metric([*labels, result.test], result.p_value)
            threshold.add_metric([*labels, result.test], result.threshold)
            detected.add_metric([*labels, result.test], 1.0 if result.detected else 0.0)
            if result.test == "mmd":
                mmd2.add_metric(labels, result.statistic)
            elif result.test == "ks" and "drifted_components_ratio" in result.extra:
                ratio.add_metric(labels, float(result.extra["drifted_components_ratio"]))
            elif result.test == "centroid":
                cosine.add_metric(labels, result.statistic)
            elif result.test == "classifier":
                auc.add_metric(labels, result.statistic)
        suite = suite_p_value(report)
        if suite is not None:
            p_value.add_metric([*labels, "suite"], suite)
            threshold.add_metric([*labels, "suite"], report.cycle_alpha)
            detected.add_metric([*labels, "suite"], 1.0 if report.detected else 0.0)
            detected.add_metric([*labels, "sustained"], 1.0 if cycle.sustained else 0.0)
        if cycle.evidence is not None:
            detected.add_metric([*labels, "evidence"], 1.0 if cycle.evidence.alarmed else 0.0)
    yield from (mmd2, p_value, threshold, detected, ratio, cosine, auc)
    yield from _evidence_families(snapshot)
    yield from _budget_families(snapshot)
    yield from _region_families(snapshot)

    changes = catalog.counter("embmon_drift_change_points_total")
    last = catalog.gauge("embmon_drift_last_change_timestamp_seconds")
    for key, totals in sorted(snapshot.changes.items()):
        changes.add_metric(list(key), float(totals.changes))
        if totals.last_timestamp is not None:
            last.add_metric(list(key), totals.last_timestamp)
    yield changes
    yield last

    errors = catalog.counter("embmon_drift_errors_total")
    for stage in ERROR_STAGES:
        errors.add_metric([stage], float(snapshot.errors.get(stage, 0)))
    yield errors


def _evidence_families(snapshot: DriftSnapshot) -> Iterable[Metric]:
    log_evidence = catalog.gauge("embmon_drift_log_evidence")
    log_threshold = catalog.gauge("embmon_drift_log_evidence_threshold")
    for (model, stream), cycle in sorted(snapshot.results.items()):
        if cycle.evidence is not None:
            log_evidence.add_metric([model, stream], cycle.evidence.log_evidence)
            log_threshold.add_metric([model, stream], cycle.evidence.log_threshold)
    alarms = catalog.counter("embmon_drift_evidence_alarms_total")
    for (model, stream), count in sorted(snapshot.evidence_alarms.items()):
        alarms.add_metric([model, stream], float(count))
    yield from (log_evidence, log_threshold, alarms)


def _budget_families(snapshot: DriftSnapshot) -> Iterable[Metric]:
    floor = catalog.gauge("embmon_drift_p_value_floor")
    for (model, stream), cycle in sorted(snapshot.results.items()):
        for result in cycle.report.results:
            if "p_value_floor" in result.extra:
                floor.add_metric([model, stream, result.test], float(result.extra["p_value_floor"]))
    yield floor
    cuts = catalog.counter("embmon_drift_tests_cut_total")
    for key, count in sorted(snapshot.cuts.items()):
        cuts.add_metric(list(key), float(count))
    yield cuts
    screens = catalog.counter("embmon_drift_tests_screened_total")
    for key, count in sorted(snapshot.screens.items()):
        screens.add_metric(list(key), float(count))
    yield screens
    screen = catalog.gauge("embmon_drift_screen_p_value")
    for (model, stream), cycle in sorted(snapshot.results.items()):
        if cycle.report.screen_p_value is not None:
            screen.add_metric([model, stream], cycle.report.screen_p_value)
    yield screen


def _region_families(snapshot: DriftSnapshot) -> Iterable[Metric]:
    reference_share = catalog.gauge("embmon_drift_region_reference_ratio")
    window_share = catalog.gauge("embmon_drift_region_window_ratio")
    p_value = catalog.gauge("embmon_drift_region_p_value")
    shifted = catalog.gauge("embmon_drift_regions_shifted")
    novel = catalog.gauge("embmon_drift_novel_ratio")
    for (model, stream), cycle in sorted(snapshot.results.items()):
        regions = cycle.report.regions
        if regions is None:
            continue
        for region in regions.regions:
            labels = [model, stream, str(region.region)]
            reference_share.add_metric(labels, region.reference_share)
            window_share.add_metric(labels, region.window_share)
            p_value.add_metric(labels, region.p_adjusted)
        shifted.add_metric([model, stream], float(len(regions.shifted)))
        novel.add_metric([model, stream], regions.novel_share)
    yield from (reference_share, window_share, p_value, shifted, novel)
