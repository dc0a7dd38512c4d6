"""Probe settings (the documented YAML loads; mistakes stop start-up naming the field), and the
exported names agree with the alert/dashboard catalogue and with docs/metrics.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from monitor.artifacts.catalog import METRICS
from monitor.config import ConfigError, load_settings
from monitor.retrieval.probes.base import Estimate, ProbeResult, sample
from monitor.retrieval.probes.export import ESTIMATE_HELP, SAMPLE_SCHEMA, ProbeSnapshot, families
from tests.support.paths import REPO

DOCS = REPO / "docs"


def documented_yaml() -> dict:  # type: ignore[type-arg]
    text = (DOCS / "retrieval.md").read_text()
    section = text[text.index("## Retrieval probes"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "docs/retrieval.md lost its probes YAML example"
    return yaml.safe_load(block.group(1))


def test_the_documented_example_loads(tmp_path: Path) -> None:
    config = documented_yaml()
    golden = tmp_path / "golden.jsonl"
    golden.write_text(json.dumps({"query_id": "q", "vector": [1.0, 0.0], "qrels": {"d": 1}}) + "\n")
    for probe in config["probes"]["golden"]:
        probe["file"] = str(golden)
        if "encoder" in probe:
            probe["encoder"]["path"] = str(tmp_path)
    path = tmp_path / "embmon.yaml"
    path.write_text(yaml.safe_dump(config))
    settings = load_settings(path)
    probes = settings.probes
    assert [(p.kind, p.name) for p in probes.all_probes()] == [
        ("golden", "golden-search"), ("golden", "golden-sample"), ("ann_recall", "ann"), ("clicks", "clicks"),
        ("agreement", "shadow-vs-ada")]
    assert probes.golden[0].retriever.kind == "http" and probes.golden[1].retriever.kind == "knn"
    assert probes.clicks[0].k == [5, 10] and probes.agreement[0].model == "minilm-v2"
    assert probes.statistics.resamples == 1000 and probes.device is None


def test_probes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBMON_PROBES__CLICKS", '[{"name": "env-clicks", "model": "m", "k": [3]}]')
    monkeypatch.setenv("EMBMON_PROBES__STATISTICS__RESAMPLES", "250")
    probes = load_settings().probes
    assert [p.name for p in probes.clicks] == ["env-clicks"] and probes.clicks[0].k == [3]
    assert probes.statistics.resamples == 250 and probes.enabled


def test_no_probe_is_configured_by_default() -> None:
    from monitor.daemon.features import default_component_factories
    from monitor.retrieval.probes.component import ProbeComponent

    settings = load_settings()
    assert not settings.probes.enabled
    assert ProbeComponent not in default_component_factories(settings)


@pytest.mark.parametrize(
    ("probes", "message"),
    [
        ({"clicks": [{"name": "x"}], "ann_recall": [{"name": "x", "model": "m"}]}, "unique across all probes"),
        ({"clicks": [{"name": "all"}]}, "'all' is reserved"),
        ({"clicks": [{"name": "has space"}]}, "not a valid label value"),
        ({"clicks": [{"name": "c", "k": []}]}, "give 1 to 5 cutoffs"),
        ({"clicks": [{"name": "c", "k": [0]}]}, "between 1 and 1000"),
        ({"clicks": [{"name": "c", "metrics": ["r_precision"]}]}, "unknown metric families"),
        ({"clicks": [{"name": "c", "window": 5}]}, "Extra inputs are not permitted"),
        ({"agreement": [{"name": "a", "reference": {"model": "m"}, "candidate": {"model": "m"}}]}, "must differ"),
        ({"golden": [{"name": "g", "file": "/nonexistent.jsonl", "model": "m", "retriever": {"kind": "knn"}}]},
         "does not exist"),
        ({"golden": [{"name": "g", "file": __file__, "model": "m",
                      "retriever": {"kind": "http", "url": "ftp://x/y", "request_template": "{}", "ids_path": "a"}}]},
         "not an http"),
        ({"golden": [{"name": "g", "file": __file__, "model": "m",
                      "retriever": {"kind": "http", "url": "http://h/s", "request_template": '{"q": {{query}}}',
                                    "ids_path": "a"}}]}, "unknown placeholders"),
        ({"golden": [{"name": "g", "file": __file__, "model": "m",
                      "retriever": {"kind": "http", "url": "http://h/s", "request_template": "{}",
                                    "ids_path": "hits[x]"}}]}, "cannot parse"),
        ({"golden": [{"name": "g", "file": __file__, "model": "m", "retriever": {"kind": "knn"},
                      "encoder": {"path": "/nonexistent-model"}}]}, "sentence-transformers model"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_mistakes_stop_start_up_naming_the_field(probes: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=rf"probes[.:].*{re.escape(message)}"):
        load_settings(overrides={"probes": probes})


def every_exported_family() -> dict[str, list[str]]:
    """Run the export layer on a snapshot holding every kind of value; name -> label names."""
    result = ProbeResult(
        estimates=tuple(Estimate(f, "m", "all", 10, 0.5, 0.4, 0.6) for f in ESTIMATE_HELP),
        queries=(("m", "all", 3),),
        samples=tuple(
            sample(name, 1.0, **{label: "x" for label in labels}) for name, (_, labels) in SAMPLE_SCHEMA.items()
        ),
    )
    snapshot = ProbeSnapshot(results={"p": result}, runs={("p", "success"): 1}, durations={"p": 0.1},
                             last_success={"p": 1.0})
    out = {}
    for family in families(snapshot, ["p"], {"p": 0}, {"p": {"timeout": 1}}):
        for s in family.samples:
            name = s.name if family.type != "counter" else family.name + "_total"
            out[name] = sorted(s.labels)
    return out


def test_every_exported_name_is_catalogued_with_its_labels() -> None:
    exported = every_exported_family()
    assert len(exported) == 8 * 3 + 1 + len(SAMPLE_SCHEMA) + 5
    for name, labels in exported.items():
        assert name in METRICS, f"{name} is exported but not in monitor/catalog/"
        assert sorted(METRICS[name].labels) == labels, name
        assert METRICS[name].area == "retrieval"
    catalogued = {n for n, spec in METRICS.items() if spec.area == "retrieval"}
    assert catalogued == set(exported), "catalogued retrieval names the probes never export"


def test_every_exported_name_is_documented() -> None:
    text = (DOCS / "metrics.md").read_text()
    section = text[text.index("## Retrieval quality"):]
    headings = set(re.findall(r"^### (embmon_\w+)$", section, re.M))
    companions = re.compile(r"_ci_(lower|upper)$")
    for name in every_exported_family():
        if companions.search(name):
            assert re.sub(r"_ci_(lower|upper)$", "", name).removeprefix("embmon_retrieval_") in section
            assert "`embmon_retrieval_<metric>_ci_lower` and `embmon_retrieval_<metric>_ci_upper`" in section
        else:
            assert name in headings, f"docs/metrics.md has no '### {name}'"
