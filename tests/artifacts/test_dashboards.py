"""Dashboards: committed JSON equals the generator's output, and structural conventions hold."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from monitor.artifacts import dashboards as dash
from monitor.artifacts import generate
from monitor.artifacts.catalog import METRICS, referenced_metrics
from monitor.artifacts.panels import BEYOND_THE_SDK, decoded, panel_queries
from monitor.artifacts.rules import build_rules
from tests.support.paths import REPO

DIR = REPO / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
# uids are part of the public interface (links, bookmarks, provisioning): never change them
EXPECTED_UIDS = {
    "embedding-monitor-overview": "embmon-overview",
    "embedding-monitor-intrinsic": "embmon-intrinsic",
    "embedding-monitor-drift": "embmon-drift",
    "embedding-monitor-retrieval": "embmon-retrieval",
    "embedding-monitor-monitor-health": "embmon-self",
}


def committed() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DIR.glob("*.json"))}


@pytest.mark.slow  # 2.8 s of CPU, up to 6.6 s in all; `python -m monitor artifacts --check` is the quick check
def test_committed_dashboards_equal_the_generator_output() -> None:
    generated = dash.all_dashboards(build_rules())
    assert committed() == generated
    for stem in generated:
        assert (DIR / f"{stem}.json").read_text(encoding="utf-8") == generate.render()[f"dashboards/{stem}.json"]


def within_the_sdk(board: dict[str, Any]) -> dict[str, Any]:
    """``board`` less the few fields the SDK cannot express (panels.BEYOND_THE_SDK)."""
    out = copy.deepcopy(board)
    for annotation in out["annotations"]["list"]:
        for key in BEYOND_THE_SDK.get(annotation["name"], {}):
            del annotation[key]
    return out


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_every_dashboard_is_valid_against_the_grafana_sdks_schema(stem: str) -> None:
    """Decoded by the SDK's typed models (the dashboard, and each panel's own options and field config
    through the SDK's panel plugins), nothing is lost but the documented Prometheus annotation options."""
    board = committed()[stem]
    assert decoded(board) == within_the_sdk(board)
    (annotation,) = [a for a in board["annotations"]["list"] if a["name"] in BEYOND_THE_SDK]
    assert set(BEYOND_THE_SDK[annotation["name"]]) <= set(annotation)  # and the hand-written part is there


def test_a_field_or_a_panel_option_the_schema_does_not_know_is_caught() -> None:
    board = within_the_sdk(committed()["embedding-monitor-overview"])
    assert decoded(board) == board
    places = (lambda b: b["panels"][0], lambda b: b["panels"][-1]["options"], lambda b: b["templating"]["list"][1])
    for place in places:  # a panel, a time series panel's options, a variable
        edited = copy.deepcopy(board)
        place(edited)["showEverything"] = True
        assert decoded(edited) == board != edited  # the schema has no such field: decoding drops it


def test_uids_are_stable_unique_and_dashboards_tagged() -> None:
    boards = committed()
    assert {stem: b["uid"] for stem, b in boards.items()} == EXPECTED_UIDS
    for board in boards.values():
        assert "embedding-monitor" in board["tags"] and len(board["tags"]) >= 2
        assert board["title"].startswith("Embedding monitor / ")


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_panels_have_units_and_use_the_datasource_variable(stem: str) -> None:
    board = committed()[stem]
    assert board["panels"], stem
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        if panel["type"] == "row":  # a full-width header one unit high, above the panels it groups
            assert panel["title"] and panel["gridPos"] == {"h": 1, "w": 24, "x": 0, "y": panel["gridPos"]["y"]}
            own = {(x, panel["gridPos"]["y"]) for x in range(24)}
            assert not own & cells, f"row {panel['title']} overlaps a panel"
            cells |= own
            continue
        assert panel["fieldConfig"]["defaults"].get("unit"), (stem, panel["title"])
        assert panel["datasource"] == DS, panel["title"]
        assert panel["description"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS
            assert target["expr"].strip()
            # every selector of a metric labelled by model/stream honours the variables
            for name in referenced_metrics(target["expr"]):
                labels = METRICS[name].labels if name in METRICS else ()
                for label in ("model", "stream"):
                    if label in labels:
                        assert f'{label}=~"${label}"' in target["expr"], (panel["title"], target["expr"])
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24
        own = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not own & cells, f"{panel['title']} overlaps another panel"
        cells |= own


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_templating_has_datasource_model_and_stream(stem: str) -> None:
    variables = {v["name"]: v for v in committed()[stem]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("model", "stream"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"] == DS
        assert var["query"]["query"].startswith("label_values(") and var["query"]["query"].endswith(f", {name})")
        assert var["includeAll"] and var["allValue"] == ".+"
    if stem.endswith("retrieval"):
        assert {"probe", "slice", "k"} <= set(variables)


@pytest.mark.parametrize("stem", sorted(EXPECTED_UIDS))
def test_drift_change_points_are_annotations(stem: str) -> None:
    annotations = committed()[stem]["annotations"]["list"]
    (cp,) = [a for a in annotations if a.get("name") == "Drift change points"]
    assert cp["datasource"] == DS and cp["enable"]
    assert cp["expr"].startswith("increase(embmon_drift_change_points_total{") and cp["expr"].endswith("> 0")


def test_retrieval_panels_draw_confidence_bands() -> None:
    board = committed()["embedding-monitor-retrieval"]
    bands = [p for p in board["panels"] if any("_ci_upper" in t["expr"] for t in p.get("targets", []))]  # rows: none
    assert len(bands) == 8  # seven IR metrics and ANN recall
    for panel in bands:
        exprs = [t["expr"] for t in panel["targets"]]
        assert any("_ci_lower" in e for e in exprs) and len(exprs) == 3
        upper = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "upper"][0]
        assert {"id": "custom.fillBelowTo", "value": "lower"} in upper["properties"]


def test_overview_answers_is_anything_wrong_per_model() -> None:
    board = committed()["embedding-monitor-overview"]
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    for needle in ("ALERTS{", "embmon_collapse_detected", "embmon_drift_detected", "ratio_median7d", "by (model"):
        assert needle in exprs, needle


def test_intrinsic_panels_state_the_definitions_the_daemon_computes() -> None:
    # monitor/quality/intrinsic.py: d * lam_min / sum(lam), sum(lam) / lam_max, exp(entropy(sigma / sum(sigma)))
    described = {p["title"]: p["description"] for p in committed()["embedding-monitor-intrinsic"]["panels"]
                 if p["type"] != "row"}
    assert described["Partition isotropy"].startswith("d·λmin/Σλ of the covariance eigenvalues")
    assert described["Stable rank"].startswith("Σσ²/σmax² = Σλ/λmax")
    assert "Roy & Vetterli, 2007" in described["Effective rank"]


def test_dashboards_configmap_carries_the_committed_json() -> None:
    cm = yaml.safe_load((REPO / generate.DASHBOARDS_CONFIGMAP).read_text(encoding="utf-8"))
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert {k: json.loads(v) for k, v in cm["data"].items()} == {f"{s}.json": b for s, b in committed().items()}
    # kubectl apply keeps the object in an annotation limited to 256 KiB
    assert len(json.dumps(cm)) < 250_000


def rows(board: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Row title -> the panels under it, in order (panels before the first row are left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = out.setdefault(panel["title"], [])
        elif current is not None:
            current.append(panel)
    return out


def exprs(panels: list[dict[str, Any]]) -> str:
    return " ".join(t["expr"] for p in panels for t in p["targets"])


def test_monitor_health_has_a_scale_out_row_on_the_replica_and_reducer_metrics() -> None:
    (scale_out,) = [panels for title, panels in rows(committed()["embedding-monitor-monitor-health"]).items()
                    if title.startswith("Scale-out")]
    used = set().union(*(referenced_metrics(t["expr"]) for p in scale_out for t in p["targets"]))
    # publication age and bytes/records rates of the replicas, the reducer's merged replicas
    assert {"embmon_partials_last_publish_timestamp_seconds", "embmon_partials_published_bytes_total",
            "embmon_partials_published_total", "embmon_reducer_replicas", "embmon_reducer_partial_age_seconds",
            "embmon_reducer_replica_stale"} <= used
    assert all(METRICS[name].area == "scale_out" for name in used)


def test_canary_panels_show_the_lowest_cosine_and_the_mismatch_rate_per_model() -> None:
    (canaries,) = [panels for title, panels in rows(committed()["embedding-monitor-intrinsic"]).items()
                   if title.startswith("Canaries")]
    text = exprs(canaries)
    assert 'min by (model) (embmon_canary_cosine_min{model=~"$model"})' in text
    assert 'rate(embmon_canary_mismatches_total{model=~"$model"}[$__rate_interval])' in text
    overview = exprs(committed()["embedding-monitor-overview"]["panels"])
    assert "embmon_canary_mismatches_total" in overview  # the model-changed verdict next to collapse and drift


def test_drift_board_shows_what_moved_and_whether_the_tests_could_decide() -> None:
    board = rows(committed()["embedding-monitor-drift"])
    (moved,) = [panels for title, panels in board.items() if title.startswith("What moved")]
    (shares,) = [p for p in moved if p["title"] == "Region shares: window vs reference"]
    assert [referenced_metrics(t["expr"]) for t in shares["targets"]] == [
        {"embmon_drift_region_window_ratio"}, {"embmon_drift_region_reference_ratio"}]
    assert all("by (model, stream, region)" in t["expr"] for t in shares["targets"])
    assert {"embmon_drift_novel_ratio", "embmon_drift_regions_shifted", "embmon_drift_region_p_value"} <= \
        referenced_metrics(exprs(moved))
    (budget,) = [panels for title, panels in board.items() if title.startswith("Cycle budget")]
    assert {"embmon_drift_tests_cut_total", "embmon_drift_p_value_floor"} <= referenced_metrics(exprs(budget))


# labels Prometheus attaches to every scraped series: a metric's own label of that name is renamed
# `exported_<name>` by the scrape (honor_labels off: the default, and the shipped monitors')
TARGET_LABELS = {"job", "instance"}


def test_panels_read_the_daemons_own_job_label_as_prometheus_stores_it() -> None:
    clashing = {name for name, spec in METRICS.items() if set(spec.labels) & TARGET_LABELS}
    assert clashing == {"embmon_job_runs_total", "embmon_job_duration_seconds"}
    reading = [expr for board in committed().values() for _, expr in panel_queries(board)
               if {re.sub(r"_(bucket|sum|count)$", "", n) for n in referenced_metrics(expr)} & clashing]
    assert len(reading) >= 2  # job runs by outcome, job duration
    for expr in reading:
        grouped = {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr) for label in group.split(",")}
        matched = set(re.findall(r"[{,]\s*(\w+)\s*(?:=~|!=|!~|=)", expr))
        # `job` is the scrape job there: grouping by it would add every scheduled job together
        assert "job" not in grouped | matched and "exported_job" in grouped | matched, expr


def _source_metrics(expr: str, recorded: dict[str, str]) -> set[str]:
    """The declared metrics ``expr`` reads: directly, or through the recording rules it names (a histogram's
    ``_bucket``/``_sum``/``_count`` series count as the histogram)."""
    names = set(referenced_metrics(expr))
    for record, source in recorded.items():
        if re.search(rf"(?<![\w:]){re.escape(record)}(?![\w:])", expr):
            names |= _source_metrics(source, recorded)
    return {n if n in METRICS else re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def _on_a_board(boards: dict[str, dict[str, Any]], recorded: dict[str, str]) -> set[str]:
    return set().union(*(_source_metrics(expr, recorded) for b in boards.values() for _, expr in panel_queries(b)))


def test_every_metric_an_alert_reads_is_on_a_board() -> None:
    """Whoever is paged can look at what paged them: every metric of every alert (enabled or not, its condition
    and its gate, through the recording rules it reads) is drawn on at least one board."""
    rules = build_rules()
    recorded = {rule.record: rule.expr for rule in rules.recording}
    on_boards = _on_a_board(committed(), recorded)
    alerts = rules.all_alerts
    assert len(alerts) >= 35
    off = {alert.name: sorted(_source_metrics(alert.promql(), recorded) - on_boards) for alert in alerts}
    assert {name: metrics for name, metrics in off.items() if metrics} == {}
    # and the check sees through a recording rule: the invalid-records alert reads only a recorded ratio
    (invalid,) = [a for a in alerts if a.name == "EmbeddingMonitorInvalidRecordsHigh"]
    assert not referenced_metrics(invalid.promql()) & {"embmon_records_invalid_total"}
    assert "embmon_records_invalid_total" in _source_metrics(invalid.promql(), recorded)


def test_the_alert_board_check_fails_for_a_metric_on_no_board() -> None:
    rules = build_rules()
    recorded = {rule.record: rule.expr for rule in rules.recording}
    boards = copy.deepcopy(committed())
    for board in boards.values():  # take the serving probe's panels off every board
        board["panels"] = [p for p in board["panels"]
                           if not any("embmon_serving_" in t["expr"] for t in p.get("targets", ()))]
    (alert,) = [a for a in rules.all_alerts if a.name == "EmbeddingMonitorServingNonconformant"]
    assert _source_metrics(alert.promql(), recorded) - _on_a_board(boards, recorded) == {
        "embmon_serving_deviation", "embmon_serving_tolerance", "embmon_serving_violations_total"}


@pytest.mark.parametrize("area", ["serving", "index"])
def test_every_serving_and_index_metric_is_on_a_board(area: str) -> None:
    rules = build_rules()
    on_boards = _on_a_board(committed(), {rule.record: rule.expr for rule in rules.recording})
    declared = {name for name, spec in METRICS.items() if spec.area == area}
    assert len(declared) >= 12 and declared - on_boards == set()


def test_serving_row_shows_each_check_against_its_tolerance_as_the_alert_does() -> None:
    (serving,) = [panels for title, panels in rows(committed()["embedding-monitor-intrinsic"]).items()
                  if title.startswith("Serving probe")]
    (ratio,) = [p for p in serving if p["title"] == "Conformance: deviation over tolerance per check"]
    (alert,) = [a for a in build_rules().alerts if a.name == "EmbeddingMonitorServingNonconformant"]
    # the panel draws the alert's value (per model and check), with the selected models, and 1 as the red line
    expr = ratio["targets"][0]["expr"]
    assert expr.replace('{model=~"$model"}', "") == alert.condition.expr
    steps = ratio["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["value"], s["color"]) for s in steps] == [(None, "green"), (alert.condition.threshold, "red")]
