"""One metric catalog: what a scrape shows is exactly what monitor/catalog/ declares and docs show."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor import catalog
from monitor.artifacts import metric_docs
from tests.support import golden
from tests.support.paths import REPO

DOCS = REPO / "docs" / "metrics.md"
# Declared, but the fixed scenario cannot show them (it has no live Kafka consumer); the tests
# named after each scrape them.
NOT_IN_SCENARIO = {
    "embmon_consumer_lag_records": "a Kafka consumer's lag (tests/daemon/test_load.py)",
    "embmon_consumer_lag_timestamp_seconds": "a Kafka consumer's lag (tests/daemon/test_load.py)",
    "embmon_source_errors_total": "a Kafka consumer's read errors (tests/sources/test_codecs.py)",
    "embmon_source_last_progress_timestamp_seconds":
        "a Kafka consumer's progress (tests/daemon/test_source_progress.py)",
    "embmon_source_offset_resets_total": "a Kafka consumer's offset resets (tests/daemon/test_offset_resets.py)",
    "embmon_probe_request_errors_total": "a golden probe with an HTTP retriever (tests/outbound/test_fuzz.py)",
    # the fixed scenario configures no embedding endpoint: tests/serving/ scrape these from a real server
    **{name: "the serving probe (tests/serving/test_probe.py)" for name, spec in catalog.CATALOG.items()
       if spec.area == "serving"},
    # single-process mode exports none of these: a replica or the reducer does
    **{name: "scale_out roles (tests/scaleout/test_reducer_kafka.py)" for name, spec in catalog.CATALOG.items()
       if spec.area == "scale_out"},
    # the scenario configures no index probe (it needs a vector store): tests/index/test_daemon.py scrapes them
    **{name: "index probes (tests/index/test_daemon.py)" for name, spec in catalog.CATALOG.items()
       if spec.area == "index"},
}


def exported() -> dict[str, tuple[str, str, set[str]]]:
    """Family name as the catalog spells it -> (type, HELP, label names seen)."""
    out = {}
    for family in text_string_to_metric_families(golden.exposition()):
        if family.name.startswith(("process_", "python_")) or family.name.endswith("_created"):
            continue
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        out[name] = (family.type, family.documentation, labels)
    return out


def test_every_exported_family_is_declared_with_its_type_help_and_labels() -> None:
    for name, (kind, help_text, labels) in exported().items():
        spec = catalog.spec(name)
        assert kind == ("gauge" if spec.kind == "info" else spec.kind), name
        assert help_text == spec.help, name
        assert labels <= set(spec.labels), (name, labels)


def test_every_declared_metric_is_exported_by_the_scenario_or_explained() -> None:
    missing = set(catalog.CATALOG) - set(exported())
    assert missing == set(NOT_IN_SCENARIO)


def test_the_daemon_also_exports_the_standard_process_metrics() -> None:
    names = {family.name for family in text_string_to_metric_families(golden.exposition())}
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "python_info"} <= names


@pytest.mark.parametrize("name", sorted(catalog.CATALOG))
def test_every_declared_metric_has_a_section_in_the_metric_docs(name: str) -> None:
    heading = re.sub(r"^embmon_retrieval_\w+_ci_(lower|upper)$",  # one section covers every interval bound
                     "embmon_retrieval_<metric>_ci_lower, embmon_retrieval_<metric>_ci_upper", name)
    assert f"### {heading}\n" in DOCS.read_text(), name


def test_every_metric_section_states_the_catalogs_type_labels_and_help() -> None:
    """The line under each heading is the catalog's; regenerate with ``python -m monitor.artifacts.metric_docs``."""
    text = DOCS.read_text()
    assert metric_docs.sync(text) == text
    for name, spec in catalog.CATALOG.items():
        if "_ci_" not in name:
            assert f"### {name}\n\n{metric_docs.declaration(spec)}\n" in text, name


def test_a_section_whose_help_differs_from_the_catalog_is_caught_and_rewritten(tmp_path: Path) -> None:
    spec = catalog.spec("embmon_stable_rank")
    text = DOCS.read_text()
    edited = text.replace(f'HELP "{spec.help}"', 'HELP "Sum of singular values squared, over the largest."')
    assert edited != text
    assert metric_docs.sync(edited) == text
    stale = tmp_path / "metrics.md"
    stale.write_text(edited)
    assert metric_docs.main(["--check", "--docs", str(stale)]) == 1
    assert stale.read_text() == edited  # --check writes nothing


def test_a_documented_name_the_catalog_does_not_declare_is_refused() -> None:
    with pytest.raises(KeyError, match="embmon_no_such_metric"):
        metric_docs.sync("### embmon_no_such_metric\n\ntext\n")


def test_a_misdeclared_metric_is_refused() -> None:
    with pytest.raises(KeyError, match="not declared"):
        catalog.gauge("embmon_no_such_metric")
    with pytest.raises(TypeError, match="declared as a counter"):
        catalog.gauge("embmon_records_total")


def _computing_code(target: str) -> object:
    """What ``module:qualname`` names: the module imported, then each attribute of the qualname."""
    module_name, _, qualname = target.partition(":")
    found: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


@pytest.mark.parametrize("name", sorted(catalog.CATALOG))
def test_every_metric_names_the_code_that_computes_it_and_that_code_exists(name: str) -> None:
    """One hop from a number to its code: the target imports, is a function (or a property), and is
    defined where it says, not re-exported there."""
    spec = catalog.spec(name)
    module_name = spec.code.partition(":")[0]
    target = _computing_code(spec.code)
    function = target.fget if isinstance(target, property) else getattr(target, "__func__", target)  # classmethod
    assert inspect.isfunction(function), (name, spec.code, target)
    assert function.__module__ == module_name, (name, spec.code, function.__module__)


def test_every_metric_section_of_the_docs_names_its_computing_code() -> None:
    text = DOCS.read_text()
    sections = re.split(r"\n### ", text)[1:]
    named = [s for s in sections if re.search(r"^\*Declared:\*.* · computed by `monitor(\.\w+)+:[\w.]+`$", s, re.M)]
    assert len(sections) == len(named) > 100, (len(sections), len(named))


def test_a_target_that_does_not_exist_is_caught() -> None:
    with pytest.raises(AttributeError):
        _computing_code("monitor.quality.intrinsic:no_such_function")
    with pytest.raises(ValueError, match="module:qualname"):
        catalog.MetricSpec("embmon_x", "gauge", "x", code="monitor/quality/intrinsic.py")
