"""Kafka in one place: the scale-out roles reach Kafka only through ``monitor/sources/kafka/``.

Read from source, every import counted (module level, inside a function, under ``if TYPE_CHECKING:``),
so a replica or reducer module that imports kafka-python or confluent_kafka itself fails here: its
clients would be built outside the one factory, from options the factory never sees
(``kafka.client``, ``kafka.librdkafka``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.support.imports import PACKAGE

CLIENT_LIBRARIES = ("kafka", "confluent_kafka")


def client_imports(source: str) -> Iterator[str]:
    """Each import of a Kafka client library in ``source`` (absolute imports only: a relative one is the package's)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.partition(".")[0] in CLIENT_LIBRARIES:
                yield name


def test_the_check_finds_every_form_of_a_client_import() -> None:
    source = """
import kafka
from kafka.errors import KafkaError
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from kafka import KafkaConsumer
def f():
    import confluent_kafka.admin
from monitor.sources.kafka.clients import TopicPartition
"""
    assert list(client_imports(source)) == ["kafka", "kafka.errors", "kafka", "confluent_kafka.admin"]


def test_scaleout_imports_no_kafka_client_library() -> None:
    found = {f"{path.relative_to(PACKAGE.parent)}: {name}"
             for path in sorted((PACKAGE / "scaleout").rglob("*.py")) for name in client_imports(path.read_text())}
    assert found == set(), "import these through monitor.sources.kafka.clients"


def test_every_kafka_module_is_in_the_kafka_package() -> None:
    """Outside ``monitor/sources/kafka/``, no module of ``monitor/`` imports a Kafka client library."""
    outside = {str(path.relative_to(PACKAGE.parent)) for path in sorted(PACKAGE.rglob("*.py"))
               if "sources/kafka/" not in path.as_posix() and any(client_imports(path.read_text()))}
    assert outside == set()


def test_librdkafka_clients_are_built_in_two_modules() -> None:
    """The librdkafka source, and the scale-out roles' clients on librdkafka (``kafka.client: confluent``)."""
    importers = {path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
                 if any(name.partition(".")[0] == "confluent_kafka" for name in client_imports(path.read_text()))}
    assert importers == {"sources/kafka/confluent.py", "sources/kafka/rdkafka.py"}
