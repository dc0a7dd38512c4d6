"""One metric catalog: what a scrape shows is exactly what monitor/catalog.py declares and docs show."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor import catalog
from tests.support import golden
from tests.support.paths import REPO

DOCS = REPO / "docs" / "metrics.md"
# Declared, but the fixed scenario cannot show them (it has no live Kafka consumer); the tests
# named after each scrape them.
NOT_IN_SCENARIO = {
    "embmon_consumer_lag_records": "a Kafka consumer's lag (tests/service/test_load.py)",
    "embmon_consumer_lag_timestamp_seconds": "a Kafka consumer's lag (tests/service/test_load.py)",
    # single-process mode exports none of these: a replica or the reducer does
    **{name: "scale_out roles (tests/scaleout/test_reducer_kafka.py)" for name, spec in catalog.CATALOG.items()
       if spec.area == "scale_out"},
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


def test_a_misdeclared_metric_is_refused() -> None:
    with pytest.raises(KeyError, match="not declared"):
        catalog.gauge("embmon_no_such_metric")
    with pytest.raises(TypeError, match="declared as a counter"):
        catalog.gauge("embmon_records_total")
