"""One Kafka seam: client-neutral policy in one module, one typed factory for kafka-python's clients,
and the shapes the Kafka code passes around (partitions, offsets, stream keys) defined once.

Read from source (every module of ``monitor/``), so a new consumer built elsewhere, a client held as
``Any`` or a second ``Partition = tuple[str, int]`` fails here, and from a fresh interpreter (the
librdkafka source loads no kafka-python).
"""

from __future__ import annotations

import ast
from pathlib import Path

from monitor.sources.kafka import policy as kafka_policy
from tests.support.imports import PACKAGE, loaded_after, module_name

FACTORY = "monitor.sources.kafka.clients"


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in PACKAGE.rglob("*.py")}


def test_every_kafka_python_client_is_built_by_the_one_factory() -> None:
    built = {}
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name == "_built" and node.args and isinstance(node.args[0], ast.Name):  # the factory's helper
                    name = node.args[0].id
                if name in ("KafkaConsumer", "KafkaProducer"):
                    built.setdefault(module, set()).add(name)
    assert built == {FACTORY: {"KafkaConsumer", "KafkaProducer"}}


def test_no_kafka_client_is_held_as_any() -> None:
    """A parameter or attribute that holds a consumer or a producer is typed as one."""
    loose = []
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.annotation is not None:
                name, annotation = node.arg, ast.unparse(node.annotation)
            elif isinstance(node, ast.AnnAssign):
                name, annotation = ast.unparse(node.target), ast.unparse(node.annotation)
            else:
                continue
            holds_client = any(word in name for word in ("consumer", "producer", "_side"))
            if holds_client and "Any" in annotation:
                loose.append(f"{module}: {name}: {annotation}")
    assert loose == []


def test_partition_offsets_and_stream_key_are_defined_once() -> None:
    defined: dict[str, list[str]] = {}
    for module, tree in modules().items():
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in ("Partition", "Offsets", "StreamKey"):
                        defined.setdefault(target.id, []).append(module)
    assert defined == {"Partition": ["monitor.sources.base"], "Offsets": ["monitor.sources.base"],
                       "StreamKey": ["monitor.decoding.records"]}


def test_the_client_neutral_policy_imports_no_client_and_both_sources_use_it() -> None:
    assert loaded_after("import monitor.sources.kafka.policy", ("kafka", "confluent_kafka")) == []
    # the librdkafka source takes its policy from there, not from kafka-python's source
    assert loaded_after("import monitor.sources.kafka.confluent", ("kafka",)) == []
    for source in ("source", "confluent"):
        tree = ast.parse(Path(PACKAGE / "sources" / "kafka" / f"{source}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "monitor.sources.kafka.policy" for alias in node.names}
        assert {"seek_position", "records_behind", "RESET_REASONS", "ERROR_REASONS"} <= imported, source
    assert kafka_policy.seek_position(99, 250) == 250 and kafka_policy.records_behind(13, 13, (0, 11), 11) == 0
