"""Alert rules: the real promtool checks and unit tests, sync with the generator, the two forms agree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.artifacts import generate
from monitor.artifacts.catalog import METRICS, m, referenced_metrics
from monitor.artifacts.command import add_artifacts_parser
from monitor.artifacts.grafana_alerts import VALUE_REF, rule_uid
from monitor.artifacts.rules import build_rules
from monitor.artifacts.rules.model import PREFIX
from monitor.artifacts.rules.scaleout import REFUSED_REASONS
from monitor.artifacts.rules.values import format_number, format_value, humanize
from monitor.artifacts.thresholds import Thresholds, load_thresholds
from tests.support.paths import REPO

RULES = REPO / generate.PROMETHEUS_RULES
GRAFANA = REPO / generate.GRAFANA_ALERTS
RUNBOOK = REPO / "docs" / "runbook.md"
TESTS_DIR = REPO / "alerts" / "tests"

pytestmark = pytest.mark.prometheus


def promtool(*args: str | Path, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool is missing: run `scripts/setup test`"
    return subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=600)  # promtool over every alert: 31 s idle, minutes at load 30 on 2 cores


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def prometheus_alerts(path: Path = RULES) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in load(path)["groups"] for r in g["rules"] if "alert" in r}


def grafana_rules(path: Path = GRAFANA) -> dict[str, dict[str, Any]]:
    return {r["title"]: r for g in load(path)["groups"] for r in g["rules"]}


# ------------------------------------------------------------------------- promtool


def test_promtool_check_rules_accepts_the_committed_rule_file() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    n_rules = sum(len(g["rules"]) for g in load(RULES)["groups"])
    assert f"SUCCESS: {n_rules} rules found" in result.stdout


@pytest.mark.slow
def test_promtool_unit_tests_pass_for_every_alert() -> None:
    files = sorted(TESTS_DIR.glob("*.yaml"))
    result = promtool("test", "rules", *files, cwd=TESTS_DIR)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.count("SUCCESS") == len(files)


def test_every_alert_has_its_unit_test_with_the_three_checkpoints() -> None:
    alerts = prometheus_alerts()
    assert {p.stem for p in TESTS_DIR.glob("*.yaml")} == {*alerts, "recording-rules"}
    for name, rule in alerts.items():
        suite = load(TESTS_DIR / f"{name}.yaml")
        step = suite["evaluation_interval"]
        fires, quiet, *scaled = suite["tests"]
        before, boundary, *resolved = fires["alert_rule_test"]
        assert before["exp_alerts"] == [] and boundary["exp_alerts"], name
        assert _minutes(boundary["eval_time"]) - _minutes(before["eval_time"]) == _minutes(step), name
        # where the history clears the condition, the alert resolves
        for after in resolved:
            assert after["exp_alerts"] == [] and _minutes(after["eval_time"]) > _minutes(boundary["eval_time"])
        assert boundary["exp_alerts"][0]["exp_labels"]["severity"] == rule["labels"]["severity"]
        assert set(boundary["exp_alerts"][0]["exp_annotations"]) == {"summary", "description", "runbook_url"}
        assert quiet["alert_rule_test"] == [{"eval_time": boundary["eval_time"], "alertname": name, "exp_alerts": []}]
        # the quiet history differs from the firing one
        assert quiet["input_series"] != fires["input_series"], name
        # scaled out (where given): several instances' series, the same single alert at the same times
        for case in scaled:
            assert len({re.search(r'instance="([^"]+)"', s["series"]).group(1)  # type: ignore[union-attr]
                        for s in case["input_series"]}) >= 2, name
            assert case["alert_rule_test"] == [before, boundary], name


def _minutes(text: str) -> float:
    units = {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def test_recording_rules_are_named_level_metric_operations_and_tested() -> None:
    groups = load(RULES)["groups"]
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    assert records
    for record in records:
        assert re.fullmatch(r"[a-z_]+:embmon_[a-z0-9_]+:[a-z0-9_]+", record), record
    tested = {case["expr"] for case in load(TESTS_DIR / "recording-rules.yaml")["tests"][0]["promql_expr_test"]}
    assert tested == set(records)


# ------------------------------------------------------------------------- sync


def test_committed_artifacts_are_in_sync_with_the_generator(tmp_path: Path) -> None:
    problems = generate.check(REPO, generate.render())
    assert not problems, "regenerate with `python -m monitor.artifacts --out .`:\n" + "\n".join(problems)[:6000]
    # and the check itself notices a hand edit and a stale file
    out = tmp_path / "tree"
    generate.write(out, generate.render())
    (out / generate.PROMETHEUS_RULES).write_text("groups: []\n")
    (out / "dashboards" / "old.json").write_text("{}")
    found = generate.check(out, generate.render())
    assert any("embedding-monitor.rules.yaml (committed)" in p for p in found)
    assert "dashboards/old.json: stale generated file" in found


def test_cli_check_and_write(tmp_path: Path) -> None:
    parser = __import__("argparse").ArgumentParser()
    sub = parser.add_subparsers()
    add_artifacts_parser(sub)
    args = parser.parse_args(["artifacts", "--out", str(tmp_path)])
    assert args.func(args) == 0
    assert (tmp_path / generate.PROMETHEUS_RULES).is_file()
    check = parser.parse_args(["artifacts", "--out", str(tmp_path), "--check"])
    assert check.func(check) == 0
    (tmp_path / generate.GRAFANA_ALERTS).write_text("apiVersion: 1\n")
    assert check.func(check) == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("alerts:\n  EmbeddingMonitorNoSuchAlert: {threshold: 1}\n")
    args = parser.parse_args(["artifacts", "--out", str(tmp_path), "--thresholds", str(bad)])
    assert args.func(args) == 2


def test_the_defaults_file_reproduces_the_committed_artifacts() -> None:
    th = load_thresholds(REPO / generate.THRESHOLDS_DEFAULTS)
    assert generate.render(th) == generate.render()


def test_prometheus_rule_resource_carries_exactly_the_rule_file() -> None:
    cr = load(REPO / generate.PROMETHEUS_RULE_CR)
    assert cr["spec"] == load(RULES)


# ------------------------------------------------------------------------- the two forms agree


def test_prometheus_and_grafana_forms_define_the_same_alerts() -> None:
    prom, graf = prometheus_alerts(), grafana_rules()
    assert list(prom) == list(graf)
    for name, p in prom.items():
        g = graf[name]
        assert g["for"] == p["for"] and g["labels"] == p["labels"], name
        assert g["uid"] == rule_uid(name) and g["condition"] == "C"
        assert g["noDataState"] == "OK" and g["execErrState"] == "Error"
        assert g["annotations"]["summary"] == p["annotations"]["summary"]
        assert g["annotations"]["runbook_url"] == p["annotations"]["runbook_url"]
        assert g["annotations"]["description"] == p["annotations"]["description"].replace("$value", VALUE_REF)
        data = {d["refId"]: d for d in g["data"]}
        assert data["A"]["datasourceUid"] == "${EMBMON_PROMETHEUS_DATASOURCE_UID}"
        assert {k: data["B"]["model"][k] for k in ("type", "expression", "reducer")} == {
            "type": "reduce",
            "expression": "A",
            "reducer": "last",
        }
        c = data["C"]["model"]
        # rebuild the Prometheus expression from the Grafana queries and thresholds
        if c["type"] == "threshold":
            (cond,) = c["conditions"]
            op = {"gt": ">", "lt": "<"}[cond["evaluator"]["type"]]
            rebuilt = f'{data["A"]["model"]["expr"]} {op} {format_number(cond["evaluator"]["params"][0])}'
        else:
            assert c["type"] == "math" and data["G"]["model"]["expression"] == "F"
            match = re.fullmatch(r"\$B ([<>]) (\S+) && \$G ([<>]) (\S+)", c["expression"])
            assert match, c["expression"]
            rebuilt = (f'{data["A"]["model"]["expr"]} {match[1]} {match[2]} and '
                       f'{data["F"]["model"]["expr"]} {match[3]} {match[4]}')
        assert rebuilt == p["expr"], name


def test_grafana_file_has_the_provisioning_shape() -> None:
    doc = load(GRAFANA)
    assert doc["apiVersion"] == 1
    uids = []
    for group in doc["groups"]:
        assert set(group) == {"orgId", "name", "folder", "interval", "rules"}
        for rule in group["rules"]:
            assert {"uid", "title", "condition", "data", "for", "labels", "annotations",
                    "noDataState", "execErrState"} <= set(rule)
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", rule["uid"])
            uids.append(rule["uid"])
    assert len(uids) == len(set(uids))


# ------------------------------------------------------------------------- conventions


def test_every_alert_follows_the_conventions() -> None:
    anchors = runbook_anchors()
    for name, rule in prometheus_alerts().items():
        assert re.fullmatch(rf"{PREFIX}([A-Z][a-z0-9]*)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        ann = rule["annotations"]
        assert "{{" not in ann["summary"] and ann["summary"].endswith("."), name
        assert "{{ $value |" in ann["description"], name
        assert "{{ $labels." in ann["description"], name
        anchor = ann["runbook_url"].split("#", 1)[1]
        assert ann["runbook_url"].startswith("https://") and "docs/runbook.md#" in ann["runbook_url"]
        assert anchor in anchors, f"{name}: runbook anchor #{anchor} missing from docs/runbook.md"
    # intrinsic-health alerts that label a model carry model and stream in the description
    for rule in prometheus_alerts().values():
        if rule["expr"].startswith("model_stream:"):
            assert "{{ $labels.model }}" in rule["annotations"]["description"]
            assert "{{ $labels.stream }}" in rule["annotations"]["description"]


def runbook_anchors() -> set[str]:
    anchors = set()
    for line in RUNBOOK.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", title)))
    return anchors


def test_runbook_has_a_section_for_every_alert_including_opt_in_ones() -> None:
    rules = build_rules()
    anchors = runbook_anchors()
    missing = sorted({a.anchor for a in rules.all_alerts} - anchors)
    assert not missing
    text = RUNBOOK.read_text(encoding="utf-8")
    for alert in rules.all_alerts:
        section = _section(text, alert.anchor)
        for needle in ("**Meaning.**", "**First three checks.**", "1. ", "2. ", "3. ",
                       "**Silence safely.**", "amtool silence add", "**Baseline.**"):
            assert needle in section, (alert.name, needle)
    # re-pinning is explained once, with both ways in
    assert "embedding-monitor baseline capture" in text and "POST /admin/baseline" in text


def _section(text: str, anchor: str) -> str:
    out, on = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            on = re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", line[3:].strip().lower())) == anchor
        elif on:
            out.append(line)
    return "\n".join(out)


def test_every_metric_used_by_alerts_and_dashboards_is_in_the_catalog() -> None:
    texts = [RULES.read_text(), GRAFANA.read_text(), *(p.read_text() for p in (REPO / "dashboards").glob("*.json"))]
    used = set().union(*(referenced_metrics(t) for t in texts))
    assert used, "no metric names found"
    unknown = {name for name in used if name not in METRICS and not _histogram_series(name)}
    assert not unknown
    # the catalogue guard itself rejects unknown names
    with pytest.raises(ValueError, match="unknown metric"):
        m("embmon_not_a_metric")


def _histogram_series(name: str) -> bool:
    try:
        m(name)
    except ValueError:
        return False
    return True


def test_intrinsic_alerts_compare_with_the_model_baseline_and_absolute_ones_are_opt_in() -> None:
    prom = prometheus_alerts()
    for name in ("EmbeddingMonitorIsotropyDegraded", "EmbeddingMonitorEffectiveDimensionDropped",
                 "EmbeddingMonitorMeanCosineRising", "EmbeddingMonitorCollapse"):
        assert "_median7d" in prom[name]["expr"], name
    absolute = [a for a in build_rules().all_alerts if a.name.endswith("Absolute")]
    assert len(absolute) == 3 and not any(a.enabled for a in absolute)
    assert not any(n.endswith("Absolute") for n in prom)
    # MiniLM-on-real-text values (eff. dim. ratio 0.29, mean cosine 0.15) are a healthy baseline:
    # at their own baseline the relative alerts are far from their thresholds
    rules = {a.name: a for a in build_rules().alerts}
    assert 0.29 / 0.29 > rules["EmbeddingMonitorEffectiveDimensionDropped"].condition.threshold
    assert 0.15 - 0.15 < rules["EmbeddingMonitorMeanCosineRising"].condition.threshold
    retrieval = prom["EmbeddingMonitorRetrievalNdcgBelowObjective"]["expr"]
    # fires on the CI, not the point estimate; once per probe series however many instances run the probe
    assert retrieval.startswith("max by (probe, model, slice, k) (embmon_retrieval_ndcg_ci_upper{")
    assert "offset 1w" in prom["EmbeddingMonitorRetrievalNdcgDroppedWeekOverWeek"]["expr"]


def test_a_changed_model_pages_per_model_and_resolves_after_a_repin() -> None:
    rule = prometheus_alerts()["EmbeddingMonitorModelChanged"]
    assert rule["labels"]["severity"] == "critical"
    # the daemon's mismatch counter decides; the lowest canary cosine is the value shown
    assert rule["expr"] == ("min by (model) (embmon_canary_cosine_min) < 1 and "
                            "sum by (model) (increase(embmon_canary_mismatches_total[10m])) > 0")
    fires, quiet, scaled = load(TESTS_DIR / "EmbeddingMonitorModelChanged.yaml")["tests"]
    before, boundary, resolved = fires["alert_rule_test"]
    assert boundary["exp_alerts"][0]["exp_labels"] == {"model": "minilm", "severity": "critical"}
    assert (
        "lowest canary cosine over the window is 0.250" in boundary["exp_alerts"][0]["exp_annotations"]["description"]
    )
    # the re-pin drops the window's cosines while the counter's increase is still positive
    cosine = next(s["values"] for s in fires["input_series"] if s["series"].startswith("embmon_canary_cosine_min"))
    assert "stale" in cosine and resolved["exp_alerts"] == []
    # float noise below 1 that the daemon did not count as a mismatch stays quiet
    assert all("1+" not in s["values"] for s in quiet["input_series"])
    # scaled out: two reducers export the model (a hand-over), each its own counter: one page per model
    assert {s["series"].split("instance=")[1].split('"')[1] for s in scaled["input_series"]} == {
        "reducer-0:9464", "reducer-1:9464"}
    assert scaled["alert_rule_test"][1]["exp_alerts"] == boundary["exp_alerts"]


def test_scale_out_alerts_read_only_what_replicas_and_the_reducer_export() -> None:
    from monitor.scaleout.table import IGNORED_REASONS

    prom = prometheus_alerts()
    scale_out = {"EmbeddingMonitorReplicaStale", "EmbeddingMonitorPartialsPublishFailing",
                 "EmbeddingMonitorReducerNotMerging", "EmbeddingMonitorPartialsRefused"}
    assert scale_out <= set(prom)
    for name in scale_out:
        used = referenced_metrics(prom[name]["expr"])
        # a single daemon exports none of these, so these alerts are silent there
        assert used and all(METRICS[n].area == "scale_out" for n in used), name
    assert prom["EmbeddingMonitorReducerNotMerging"]["labels"]["severity"] == "critical"
    # refusals are reducer reasons that do not repair themselves
    assert set(REFUSED_REASONS) <= set(IGNORED_REASONS)
    assert not {"duplicate", "superseded", "missing"} & set(REFUSED_REASONS)


def test_stream_ages_take_the_newest_record_over_instances() -> None:
    rule = prometheus_alerts()["EmbeddingMonitorNoRecentRecords"]
    assert rule["expr"] == "time() - max by (model, stream) (embmon_last_record_timestamp_seconds) > 3600"
    # the quiet history: one instance frozen (it lost the partitions), another still receiving
    quiet = load(TESTS_DIR / "EmbeddingMonitorNoRecentRecords.yaml")["tests"][1]["input_series"]
    assert {re.search(r'instance="([^"]+)"', s["series"]).group(1) for s in quiet} == {
        "monitor-0:9464",
        "monitor-1:9464",
    }


# alerts about a stream whose point is how many instances export it (two reducers outside one group)
COUNTS_INSTANCES = {"EmbeddingMonitorStreamMergedTwice"}


def _about_a_model_or_stream(suite: dict[str, Any]) -> dict[str, str]:
    """The labels of the alert the firing test expects, when they name a model or a stream."""
    (expected,) = suite["tests"][0]["alert_rule_test"][1]["exp_alerts"]
    labels = expected["exp_labels"]
    return labels if {"model", "stream"} & set(labels) else {}


@pytest.mark.slow
def test_an_alert_about_a_model_or_stream_fires_once_however_many_instances_export_its_series(
    tmp_path: Path,
) -> None:
    """Scaled out, Prometheus scrapes the replicas and the reducer under one job; in a central
    deployment a stream's old and new owner both export it for a window after a rebalance. Each
    alert about a model or a stream aggregates over instances, so its generated test passes
    unchanged (one alert, same labels, value and annotations; quiet where it was quiet) when a
    second instance exports every one of its input series too."""
    suites = {p.stem: load(p) for p in sorted(TESTS_DIR.glob(f"{PREFIX}*.yaml"))}
    about = {name: labels for name, suite in suites.items()
             if (labels := _about_a_model_or_stream(suite)) and name not in COUNTS_INSTANCES}
    # intrinsic, drift, canary, retrieval quality, ingest ages and the invalid-record ratio
    assert {"EmbeddingMonitorCollapse", "EmbeddingMonitorDriftDetected", "EmbeddingMonitorModelChanged",
            "EmbeddingMonitorMetricsStale", "EmbeddingMonitorNoRecentRecords", "EmbeddingMonitorInvalidRecordsHigh",
            "EmbeddingMonitorRetrievalNdcgBelowObjective", "EmbeddingMonitorAnnRecallBelowTarget"} <= set(about)
    with_instance = sorted(name for name, labels in about.items() if "instance" in labels)
    assert not with_instance, f"alerts about a model or stream that fire once per instance: {with_instance}"
    files = []
    for name in about:
        suite = suites[name]
        suite["rule_files"] = [str(RULES)]
        for case in suite["tests"]:
            twins = [{**s, "series": re.sub(r'instance="([^"]+)"', r'instance="\1-twin"', s["series"])}
                     for s in case["input_series"]]
            assert all(t["series"] != s["series"] for t, s in zip(twins, case["input_series"], strict=True)), name
            case["input_series"] = case["input_series"] + twins
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(suite, sort_keys=False))
        files.append(path)
    result = promtool("test", "rules", *files, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.count("SUCCESS") == len(files)


# ------------------------------------------------------------------------- overrides


OVERRIDES = """
job: embmon-prod
baseline_window: 3d
retrieval_objectives:
  mrr: {k: "5", min: 0.4}
alerts:
  EmbeddingMonitorMeanCosineRising: {threshold: 0.3, for: 45m}
  EmbeddingMonitorEffectiveDimensionDropped: {threshold: 0.6, severity: critical}
  EmbeddingMonitorConsumerLagGrowing: {threshold: 50000}
  EmbeddingMonitorProbeStale: {threshold: 600, for: 5m}
  EmbeddingMonitorMeanCosineAboveAbsolute: {enabled: true}
  EmbeddingMonitorEffectiveDimensionBelowAbsolute: {enabled: true, threshold: 0.25}
  EmbeddingMonitorTopVarianceAboveAbsolute: {enabled: true}
  EmbeddingMonitorDriftDetected: {enabled: false}
  EmbeddingMonitorModelChanged: {threshold: 0.99}
  EmbeddingMonitorReplicaStale: {for: 30m, severity: critical}
"""


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_thresholds_file_overrides_and_its_generated_tests_pass(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.yaml"
    path.write_text(OVERRIDES)
    out = tmp_path / "out"
    generate.write(out, generate.render(load_thresholds(path)))
    rules_file = out / generate.PROMETHEUS_RULES
    alerts = prometheus_alerts(rules_file)
    assert alerts["EmbeddingMonitorMeanCosineRising"]["expr"].endswith("delta_median3d > 0.3")
    assert alerts["EmbeddingMonitorMeanCosineRising"]["for"] == "45m"
    assert alerts["EmbeddingMonitorEffectiveDimensionDropped"]["labels"]["severity"] == "critical"
    assert alerts["EmbeddingMonitorDown"]["expr"] == 'up{job="embmon-prod"} < 1'
    assert "EmbeddingMonitorDriftDetected" not in alerts
    assert alerts["EmbeddingMonitorEffectiveDimensionBelowAbsolute"]["expr"].endswith(":avg < 0.25")
    assert alerts["EmbeddingMonitorRetrievalMrrBelowObjective"]["expr"] == (
        'max by (probe, model, slice, k) (embmon_retrieval_mrr_ci_upper{k="5"}) < 0.4')
    assert alerts["EmbeddingMonitorModelChanged"]["expr"].startswith(
        "min by (model) (embmon_canary_cosine_min) < 0.99 and"
    )
    assert grafana_rules(out / generate.GRAFANA_ALERTS).keys() == alerts.keys()
    result = promtool("check", "rules", rules_file)
    assert result.returncode == 0, result.stdout + result.stderr
    # the generated unit tests follow the new thresholds: run those that changed
    changed = ["EmbeddingMonitorMeanCosineRising", "EmbeddingMonitorEffectiveDimensionDropped",
               "EmbeddingMonitorConsumerLagGrowing", "EmbeddingMonitorProbeStale", "EmbeddingMonitorDown",
               "EmbeddingMonitorMeanCosineAboveAbsolute", "EmbeddingMonitorEffectiveDimensionBelowAbsolute",
               "EmbeddingMonitorTopVarianceAboveAbsolute", "EmbeddingMonitorRetrievalMrrBelowObjective",
               "EmbeddingMonitorModelChanged", "EmbeddingMonitorReplicaStale", "recording-rules"]
    tests = out / "alerts" / "tests"
    assert not (tests / "EmbeddingMonitorDriftDetected.yaml").exists()
    result = promtool("test", "rules", *(tests / f"{n}.yaml" for n in changed), cwd=tests)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.count("SUCCESS") == len(changed)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("alerts:\n  EmbeddingMonitorTypo: {threshold: 1}\n", "unknown alerts"),
        ("alerts:\n  EmbeddingMonitorDown: {for: 5 minutes}\n", "invalid duration"),
        ("alerts:\n  EmbeddingMonitorDown: {severity: page}\n", "severity"),
        ("retrieval_objectives:\n  bleu: {min: 0.3}\n", "unknown retrieval metrics"),
        ("jobb: x\n", "jobb"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_thresholds_are_refused_with_the_field_named(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        build_rules(load_thresholds(path))


def test_value_formatting_matches_prometheus_template_functions() -> None:
    # the expected annotations of the unit tests are rendered in Python; promtool checks them
    # against Go's humanize functions, and these pin the cases the scenarios use
    assert humanize(30000) == "30k" and humanize(0) == "0" and humanize(1) == "1"
    assert humanize(0.25) == "250m"
    assert format_value("percent", 0.35000000000000003) == "35%"
    assert format_value("duration", 7860) == "2h 11m 0s"
    assert format_value("number", 0.4000000000000001) == "0.400"
    assert format_number(10000.0) == "10000" and format_number(0.5) == "0.5"
    assert Thresholds().job == "embedding-monitor"


def test_an_alarm_of_the_accumulating_detector_pages_as_drift(tmp_path: Path) -> None:
    """The suite's verdict stays 0; the accumulating detector alarms once (its counter 0 -> 1, its
    verdict series at 1 for one cycle only): the drift alert fires `for` after the alarm, and stays
    quiet again once the alarm is an hour old."""
    rule = prometheus_alerts()["EmbeddingMonitorDriftDetected"]
    assert "embmon_drift_evidence_alarms_total" in rule["expr"] and 'test="suite"' in rule["expr"]
    series = 'embmon_drift_{}{{job="embedding-monitor", instance="monitor-0:9464", model="minilm", stream="queries"{}}}'
    fired = {"exp_labels": {"model": "minilm", "stream": "queries", "severity": "info"},
             "exp_annotations": {
                 "summary": rule["annotations"]["summary"],
                 "description": "The combined drift verdict for model minilm on stream queries is 1 (1 = drifted).",
                 "runbook_url": rule["annotations"]["runbook_url"]}}
    suite = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": series.format("detected", ', test="suite"'), "values": "0x120"},
                {"series": series.format("detected", ', test="evidence"'), "values": "0 1 0x118"},
                {"series": series.format("evidence_alarms_total", ""), "values": "0 1x119"},
            ],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "EmbeddingMonitorDriftDetected", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "EmbeddingMonitorDriftDetected", "exp_alerts": [fired]},
                {"eval_time": "50m", "alertname": "EmbeddingMonitorDriftDetected", "exp_alerts": [fired]},
                {"eval_time": "110m", "alertname": "EmbeddingMonitorDriftDetected", "exp_alerts": []},
            ],
        }],
    }
    path = tmp_path / "evidence.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    result = promtool("test", "rules", path, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
