"""The optional extras a configuration needs, checked before the daemon starts.

The default install carries neither torch nor sentence-transformers: every CPU path is numpy, and
only three features need them (docs/deployment.md, "Installing"):

* ``gpu`` (torch): a device setting that says ``cuda`` (``device``, ``drift.device`` when drift is
  on, ``probes.device`` when a probe is configured). ``auto`` never needs it: without torch it is
  the CPU, quietly (monitor/devices.py).
* ``encoder`` (sentence-transformers, which pulls torch): a golden probe whose queries are texts
  (``probes.golden[i].encoder``).
* ``confluent`` (confluent-kafka, librdkafka's binding): ``kafka.client: confluent`` with the Kafka
  source (docs/operations.md, "Which Kafka client").
* ``index`` (psycopg for pgvector, lancedb for LanceDB): an index probe on that engine
  (``index.probes[i].engine``, docs/index.md). The Qdrant-shaped template needs nothing.

A configuration that asks for one without it installed is a configuration error (exit 2), said in
one line naming the field and the command that installs the extra, rather than a warning and a
silent CPU fallback or an ImportError at the first probe run. Whether a package is installed is a
``find_spec`` lookup: nothing is imported.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from monitor.errors import ConfigError

if TYPE_CHECKING:
    from monitor.config import Settings

# extra -> the module it provides
EXTRAS = {"gpu": "torch", "encoder": "sentence_transformers", "confluent": "confluent_kafka", "index": "psycopg"}
# an index probe's engine -> the module of the ``index`` extra it needs
INDEX_ENGINE_MODULES = {"pgvector": "psycopg", "lancedb": "lancedb"}


def installed(module: str) -> bool:
    """``module`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it; a half-imported module
        return False


def install_hint(extra: str) -> str:
    return f"pip install 'embedding-monitor[{extra}]'"


def wanted(settings: Settings) -> list[tuple[str, str]]:
    """(field, extra) for each setting of ``settings`` that needs an extra."""
    return [(field, extra) for field, extra, _ in wanted_modules(settings)]


def wanted_modules(settings: Settings) -> list[tuple[str, str, str]]:
    """(field, extra, module) for each setting of ``settings`` that needs an extra."""
    found = [(field, extra, EXTRAS[extra]) for field, extra in _wanted(settings)]
    for i, probe in enumerate(settings.index.probes):
        module = INDEX_ENGINE_MODULES.get(probe.engine)
        if module is not None:
            found.append((f"index.probes[{i}].engine: {probe.engine} (probe {probe.name!r})", "index", module))
        if probe.census.enabled and probe.census.encoder is not None:
            found.append((f"index.probes[{i}].census.encoder (probe {probe.name!r})", "encoder",
                          EXTRAS["encoder"]))
    return found


def _wanted(settings: Settings) -> list[tuple[str, str]]:
    found = []
    if settings.source == "kafka" and settings.kafka.client == "confluent":
        found.append(("kafka.client: confluent", "confluent"))
    if settings.device == "cuda":
        found.append(("device: cuda", "gpu"))
    if settings.drift.enabled and settings.drift.device == "cuda":
        found.append(("drift.device: cuda", "gpu"))
    if settings.probes.enabled:
        if settings.probes.device == "cuda":
            found.append(("probes.device: cuda", "gpu"))
        for i, probe in enumerate(settings.probes.golden):
            if probe.encoder is not None:
                found.append((f"probes.golden[{i}].encoder (probe {probe.name!r}: text queries)", "encoder"))
    for i, endpoint in enumerate(settings.serving.endpoints):
        if endpoint.kind == "encoder":
            found.append((f"serving.endpoints[{i}].kind: encoder (model {endpoint.model!r})", "encoder"))
    return found


def require_extras(settings: Settings) -> None:
    """ConfigError naming the first setting whose extra is not installed (one line)."""
    for field, extra, module in wanted_modules(settings):
        if not installed(module):
            package = module.replace("_", "-")  # confluent_kafka: confluent-kafka
            raise ConfigError(f"{field} needs {package}, which is not installed: {install_hint(extra)}")
