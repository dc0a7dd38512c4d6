"""The detection benchmark's harness, small (bench/detection; docs/benchmarks.md, "Detection quality").

Real text and a real model: WordNet glosses (Debian's wordnet-base, from scripts/setup test) embedded by
the packaged all-MiniLM-L6-v2; three methods through the benchmark's own runner on its own streams:
the suite's false alarms on null replicates (at its budget and at a countable alpha), and one shift,
a pooling change, detected by the suite by the second cycle after it; the online detectors on the same streams.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bench.detection import corpus, protocol, report, streams, suite_worker
from monitor.drift.online.evidence import threshold_for
from monitor.drift.settings import DriftSettings

N = 200
NULLS = 30


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> protocol.Plan:
    texts = corpus.load(per_class=25, unseen_per_class=5)
    rows = corpus.embeddings(texts, ("mean", "cls"))
    path = Path(tmp_path_factory.mktemp("detection")) / "plan.npz"
    streams.build(texts, rows, path, n=N, replicates=2, null_replicates=NULLS, horizon=2, grid=(), cost_n=N,
                  only=("null", "pooling"))
    return protocol.Plan.load(path)


def test_the_corpus_is_labelled_text_that_is_not_the_projects_fixture() -> None:
    texts = corpus.load(per_class=25, unseen_per_class=5)
    assert len(texts.texts) == 16 * 25 + 4 * 5 and len(set(texts.texts)) == len(texts.texts)
    assert texts.texts[texts.members("noun.animal")[0]].count(":") >= 1
    assert set(np.unique(texts.labels)) == set(range(20))


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_the_suites_null_false_alarms_are_within_budget_and_it_detects_a_pooling_change(
    plan: protocol.Plan,
) -> None:
    # the suite at a 900 s cycle (permutation nulls: seconds; the full bench also runs the 5 s and 60 s
    # cycles' held-out null)
    fit, decide = suite_worker.suite_method(plan, 900.0)
    result = protocol.run_batch(plan, "embedding-monitor 900s", fit, decide, lambda s, d: all(d.values()), log=print)
    alarms, count = report.null_rate(result, "null", "900s")
    assert count == NULLS and alarms == 0  # alpha 1.5e-3 per cycle (a false alarm a week at 900 s)
    # at a countable alpha the same scores alarm as often as alpha says (99.9% binomial range)
    countable = DriftSettings(interval_seconds=60, false_alarm_every="20m").cycle_alpha  # 0.05
    scores = np.array([r[0]["score"] for r in result["cases"]["null"]])
    fired = int((scores >= -np.log10(countable)).sum())
    assert fired <= stats.binom.ppf(0.999, NULLS, countable)
    # the matched threshold is the null scores' 99% quantile: at most 1% of them above it
    assert (scores > result["thresholds"]["null"]).mean() <= 0.01
    # a quarter, then half, of the window through CLS pooling: flagged by the second cycle after the change
    assert max(report.delays(result, "pooling", "900s")) <= 2.0
    assert max(report.delays(result, "pooling", report.MATCHED)) <= 2.0


@pytest.mark.parametrize("method", ["embedding-monitor online", "river ADWIN"])
def test_online_methods_run_on_the_same_streams(plan: protocol.Plan, method: str) -> None:
    make, step = suite_worker.online_method(method)
    result = protocol.run_online(plan, method, make, step, log=print)
    records = result["cases"]["pooling"]
    assert len(records) == 2 and all(r["records"] == 2 * N // protocol.FILL for r in records)
    assert result["cost"]["seconds_per_record"]["pooling"] > 0


def test_the_cost_phase_times_each_decision_and_fit_and_runs_no_case(
    plan: protocol.Plan, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EMBMON_DETECTION_PHASE", "cost")  # the bench's second phase: one method at a time
    fit, decide = suite_worker.suite_method(plan, 900.0)
    result = protocol.run_batch(plan, "embedding-monitor 900s", fit, decide, lambda s, d: True,
                                protocol.cost_rows(plan), log=print)
    assert result["cases"] == {} and set(result["cost"]) == {"d384", "d768"}
    assert all(entry["seconds"] > 0 and entry["fit_seconds"] >= 0 for entry in result["cost"].values())
    make, step = suite_worker.online_method("river ADWIN")
    online = protocol.run_online(plan, "river ADWIN", make, step, log=print)
    assert online["cases"] == {} and online["cost"]["online"]["seconds_per_record"] > 0
    monkeypatch.setenv("EMBMON_DETECTION_PHASE", "both")
    with pytest.raises(ValueError, match="EMBMON_DETECTION_PHASE"):
        protocol.phase()


def test_point_fives_rule_names_a_class_by_a_pure_region_or_by_the_novel_share() -> None:
    assert report.names_injected({"named_purity": [0.2, 0.7], "first_purity": 0.1}, 0.10) == (True, False)
    assert report.names_injected({"first_purity": 0.6}, 0.10) == (True, False)
    novel = {"first_purity": 0.59, "novel_shifted": True, "novel_share": 0.07, "novel_reference_share": 0.01}
    assert report.names_injected(novel, 0.10) == (False, True)  # up by 6 points: more than half of δ
    assert report.names_injected(dict(novel, novel_share=0.05), 0.10) == (False, False)
    assert report.names_injected(dict(novel, novel_shifted=False), 0.10) == (False, False)  # not named by its test


def test_the_explanation_scores_the_first_regions_window_exemplars_by_the_injected_class() -> None:
    """What the on-call reads beside the first region, its window exemplars, scored by the rows' labels:
    four pure blobs, the window's share of one raised from a quarter to a half, through the real cycle."""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(4, 8)) * 6
    reference = np.concatenate([rng.normal(c, 0.3, size=(250, 8)) for c in centres]).astype(np.float32)
    labels = np.repeat(np.arange(4), [500, 166, 167, 167])
    window = np.concatenate([rng.normal(centres[k], 0.3, size=(n, 8)) for k, n in
                             zip(range(4), [500, 166, 167, 167], strict=True)]).astype(np.float32)
    regions = suite_worker.fit_regions(reference, max_regions=4, seed=0)
    settings = DriftSettings(interval_seconds=60, false_alarm_every="7d", threads=1)  # no permutations
    cycle = suite_worker.run_drift_suite(window, reference, settings, seed=0, regions=regions,
                                         window_ids=tuple(map(str, range(len(window)))))
    assert cycle.detected
    explained = suite_worker.explanation(cycle, regions, window, labels, [0])
    assert explained["first_exemplars"] > 0 and explained["first_exemplars_injected"] == explained["first_exemplars"]
    assert report.exemplars_show_injected(explained)
    assert not report.exemplars_show_injected({**explained, "first_exemplars_injected": 1, "first_exemplars": 3})
    assert not report.exemplars_show_injected({"first_exemplars": 0})  # no verdict: no first region shown


@pytest.mark.slow  # the suite at a 60 s cycle on 30 nulls and the pooling replicates: over 5 s
def test_the_suite_with_the_accumulating_detector_keeps_its_budget_and_is_reported_at_a_week(
    plan: protocol.Plan,
) -> None:
    fit, decide, before = suite_worker.evidence_method(plan)
    result = protocol.run_batch(plan, "embedding-monitor evidence", fit, decide, lambda s, d: all(d.values()),
                                before=before, log=print)
    alarms, count = report.null_rate(result, "null", "60s")
    assert count == NULLS and alarms == 0  # a false alarm a week: nothing in 30 decisions
    # the detector bet on every cycle before the change, 40 of them per replicate, and never alarmed
    evidence_alarms, cycles = report.evidence_null(result)
    assert cycles == (NULLS + 2) * protocol.WARM + NULLS and evidence_alarms == 0
    assert max(report.delays(result, "pooling", "60s")) <= 2.0
    meta = {**plan.meta, "replicates": 2, "horizon": 2}
    table = report.tables([result], meta)
    assert "its accumulating detector alone" in table and "| embedding-monitor evidence (60s) |" in table
    week = table.split("**At a false alarm a week**")[1].split("\n\n")[1]
    assert "| embedding-monitor evidence (60s) |" in week and "(2/2)" in week


def test_timing_the_cost_again_needs_a_finished_run_to_keep_the_cases_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.detection.__main__ import main

    monkeypatch.setenv("EMBMON_BENCH_CACHE", str(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        main(["--cost-only", "--size", "quick"])
    assert stopped.value.code == 2
    assert "--cost-only needs a finished run of this size" in capsys.readouterr().err
    assert not list((tmp_path / "quick").iterdir())  # nothing written, no stale file removed


def test_the_spread_case_keeps_the_base_mean_and_widens_its_top_axes() -> None:
    texts = corpus.load(per_class=25, unseen_per_class=5)
    rows = corpus.embeddings(texts, ("mean",))
    traffic = streams.Traffic(texts)
    spread = streams.spread_rows(rows["mean"], traffic.seen)
    base, moved = rows["mean"][traffic.seen].astype(np.float64), spread[traffic.seen].astype(np.float64)
    # a difference of means has nothing to see: the base traffic's mean is where it was
    assert np.linalg.norm(moved.mean(axis=0) - base.mean(axis=0)) < 1e-6
    _, values, vt = np.linalg.svd(base - base.mean(axis=0), full_matrices=False)
    spread_values = np.linalg.norm((moved - moved.mean(axis=0)) @ vt[: streams.SPREAD_AXES + 1].T, axis=0)
    ratios = spread_values / values[: streams.SPREAD_AXES + 1]
    assert np.allclose(ratios[:-1], 1 + streams.SPREAD) and np.isclose(ratios[-1], 1.0)


def test_each_method_of_the_suite_decides_at_the_weeks_whole_budget() -> None:
    week = 60 / (7 * 86400)
    # the suite alone: the whole week (the daemon with evidence_share: 0)
    assert suite_worker.settings_for(60.0, 500).cycle_alpha == pytest.approx(week)
    # the suite beside the accumulating detector: half each, a false alarm a week together
    assert suite_worker.settings_for(60.0, 500, evidence_share=0.5).cycle_alpha == pytest.approx(week / 2)
    assert threshold_for(suite_worker.settings_for(60.0, 500).cycle_alpha, suite_worker.EVIDENCE_SHARE) == 20_160
    # the centroid alone: the whole budget on one test, its analytic null
    only = {name: {"enabled": name == "centroid"} for name in ("mmd", "ks", "classifier")}
    settings = suite_worker.settings_for(60.0, 500, centroid={"null": "analytic"}, **only)
    assert settings.enabled_tests == ("centroid",) and settings.test_alpha == pytest.approx(week)
