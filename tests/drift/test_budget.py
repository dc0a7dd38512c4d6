"""A cycle never runs longer than its interval: the deadline, on an injected clock.

Wall time on a loaded two-core machine is noise, so every test here moves a fake clock: fake
drift tests "take" a fixed number of seconds of it, and the permutation loop sees chunks that
do. What is checked is the schedule (which tests start, which are cut, when the cycle ends)
and that what is published stays honest: a cut test counts as ``p = 1`` in a correction over
the planned family, a truncated permutation test reports its valid p-value and raised floor.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.deadline import Deadline
from monitor.drift.export import CycleResult, DriftSnapshot, families, suite_p_value
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.permutation import sequential_permutation_test
from monitor.drift.twosample.suite import RUN_ORDER, run_drift_suite
from tests.support.drift import Harness, axis, settings_for, unit_rows


class FakeClock:
    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_deadline_ends_the_permutations_with_a_valid_p_value_and_a_higher_floor() -> None:
    clock = FakeClock()
    labels = np.r_[np.ones(10), np.zeros(10)]

    def four_seconds_a_chunk(drawn: np.ndarray) -> np.ndarray:
        clock.now += 4.0
        return np.zeros(len(drawn))  # no relabelling reaches the observed statistic

    outcome = sequential_permutation_test(
        1.0, four_seconds_a_chunk, labels, np.random.default_rng(0), permutations=1000, stop_after=10,
        chunk_sizes=itertools.repeat(100), deadline=Deadline(10.0, clock),
    )
    # chunks start at 0, 4 and 8 s; at 12 s the deadline has passed: 300 drawn of 1,000
    assert (outcome.truncated, outcome.drawn, outcome.used) == (True, 300, 300)
    assert outcome.p_value == pytest.approx(1 / 301)  # the fixed-budget p-value of 300 relabellings
    assert outcome.floor(1000) == pytest.approx(1 / 301)
    assert outcome.diagnostics(1000)["p_value_floor"] == pytest.approx(1 / 301)
    untimed = sequential_permutation_test(
        1.0, lambda drawn: np.zeros(len(drawn)), labels, np.random.default_rng(0), permutations=1000,
        stop_after=10, chunk_sizes=itertools.repeat(100),
    )
    assert not untimed.truncated and untimed.floor(1000) == pytest.approx(1 / 1001)


def test_an_expired_deadline_still_draws_one_chunk() -> None:
    clock = FakeClock(100.0)
    outcome = sequential_permutation_test(
        1.0, lambda drawn: np.zeros(len(drawn)), np.r_[np.ones(5), np.zeros(5)], np.random.default_rng(0),
        permutations=500, stop_after=None, chunk_sizes=itertools.repeat(50), deadline=Deadline(10.0, clock),
    )
    assert outcome.truncated and outcome.drawn == 50 and outcome.p_value == pytest.approx(1 / 51)


def fake_tests(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, seconds: float, p_value: float = 0.5) -> list[str]:
    """Replace the four drift tests by ones that take ``seconds`` of ``clock`` and give ``p_value``;
    returns the list the tests append their names to when they start."""
    started: list[str] = []

    def fake(name: str) -> Any:
        def run(x: np.ndarray, y: np.ndarray, *, alpha: float, **kwargs: Any) -> TestResult:
            started.append(name)
            clock.now += seconds
            return TestResult.at_level(name, 0.0, p_value, alpha, {"p_value_floor": 0.0})

        return run

    for name in RUN_ORDER:
        monkeypatch.setattr(f"monitor.drift.twosample.suite.{name}_test", fake(name))
    return started


def test_no_test_starts_after_the_deadline_and_the_correction_keeps_the_planned_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock()
    started = fake_tests(monkeypatch, clock, seconds=3.0, p_value=0.001)
    settings = DriftSettings(interval_seconds=60, false_alarm_every="1h", multiplicity="bonferroni")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 4)), rng.normal(size=(50, 4))
    report = run_drift_suite(x, y, settings, deadline=Deadline(5.0, clock))
    assert started == ["ks", "centroid"]  # cheapest first; the classifier would start at 6 s > 5 s
    assert report.cut == {"classifier": "skipped", "mmd": "skipped"}
    assert report.planned == ("mmd", "ks", "centroid", "classifier") and report.family_size == 4
    assert [r.test for r in report.results] == ["ks", "centroid"]
    # thresholds of the whole family, not of the two tests that ran
    assert all(r.threshold == pytest.approx(settings.cycle_alpha / 4) for r in report.results)
    assert suite_p_value(report) == pytest.approx(4 * 0.001)


def test_a_cycle_whose_every_test_the_deadline_cut_still_exports_its_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded machine can cut every test of a cycle: the suite's series stay (p = 1, not detected),
    so a dashboard or an alert on them does not go blank; the cut counter says why."""
    clock = FakeClock()
    started = fake_tests(monkeypatch, clock, seconds=3.0, p_value=0.001)
    rng = np.random.default_rng(0)
    report = run_drift_suite(rng.normal(size=(50, 4)), rng.normal(size=(50, 4)), DriftSettings(),
                             deadline=Deadline(0.0, clock))
    assert started == [] and report.results == () and report.family_size == 4 and not report.detected
    assert suite_p_value(report) == 1.0
    snapshot = DriftSnapshot(results={("m", "s"): CycleResult(report, False, 0.0, 0.0)})
    exported = {(family.name, sample.labels.get("test")): sample.value
                for family in families(snapshot) for sample in family.samples if sample.labels.get("model") == "m"}
    assert exported[("embmon_drift_detected", "suite")] == 0.0
    assert exported[("embmon_drift_p_value", "suite")] == 1.0
    assert exported[("embmon_drift_detected", "sustained")] == 0.0


def test_without_a_deadline_every_test_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, cheapest first, when the staged cycle's screen is off (``screen_level: 1``) or passes."""
    started = fake_tests(monkeypatch, FakeClock(), seconds=1000.0)
    rng = np.random.default_rng(0)
    report = run_drift_suite(rng.normal(size=(50, 4)), rng.normal(size=(50, 4)), DriftSettings(screen_level=1))
    assert started == list(RUN_ORDER) and report.cut == {} and report.screened == ()
    started.clear()
    fake_tests(monkeypatch, FakeClock(), seconds=1000.0, p_value=0.001)  # a cheap p-value under the level
    report = run_drift_suite(rng.normal(size=(50, 4)), rng.normal(size=(50, 4)), DriftSettings())
    assert report.screened == () and [r.test for r in report.results] == ["mmd", "ks", "centroid", "classifier"]


def test_a_cycle_ends_within_its_interval_and_says_what_it_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two streams, each test 3 s of the clock, a 10 s interval: the budget (8 s) is shared."""
    rng = np.random.default_rng(1)
    h = Harness(settings_for(tmp_path / "state"))  # interval 10 s, cycle_budget 0.8
    for stream in ("a", "b"):
        h.feed("m", stream, unit_rows(rng, 600, axis(0)))
    h.publish()
    clock = FakeClock(h.now)
    h.context.clock = clock
    started = fake_tests(monkeypatch, clock, seconds=3.0)
    begin = clock.now
    results = h.component.run_cycle()
    # stream a: half of 8 s; ks (0-3 s) and centroid (3-6 s) start before 4 s. Stream b: the rest,
    # 6-8 s: ks (6-9 s) only. The last test ends at 9 s, within the 10 s interval.
    assert started == ["ks", "centroid", "ks"]
    assert clock.now - begin == pytest.approx(9.0) and clock.now - begin <= h.settings.drift.interval_seconds
    assert results[("m", "a")].report.cut == {"classifier": "skipped", "mmd": "skipped"}
    assert results[("m", "b")].report.cut == {"classifier": "skipped", "centroid": "skipped", "mmd": "skipped"}
    h.context.clock = lambda: h.now
    cut = {(s, t): h.value("embmon_drift_tests_cut_total", model="m", stream=s, test=t)
           for s in ("a", "b") for t in RUN_ORDER}
    assert cut == {("a", "ks"): 0, ("a", "classifier"): 1, ("a", "centroid"): 0, ("a", "mmd"): 1,
                   ("b", "ks"): 0, ("b", "classifier"): 1, ("b", "centroid"): 1, ("b", "mmd"): 1}
    assert h.value("embmon_drift_p_value_floor", model="m", stream="a", test="centroid") == 0.0
    assert h.value("embmon_drift_p_value", model="m", stream="b", test="classifier") is None
    h.close()
