"""Unsigned partials are said out loud: a warning at start-up and ``embmon_partials_signing_enabled`` 0,
on replicas and reducers alike; with ``scale_out.partials_key_file`` set, no warning and 1."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.config import load_settings
from monitor.daemon.service import Daemon
from monitor.scaleout.reducer import Reducer
from monitor.scaleout.replica import Replica
from tests.support import daemons
from tests.support.broker import free_port

WARNING = "scale_out.partials_key_file is unset"


def signing_gauge(daemon: Daemon) -> float:
    families = text_string_to_metric_families(generate_latest(daemon.metrics_registry).decode())  # type: ignore[attr-defined]
    (value,) = [s.value for f in families for s in f.samples if s.name == "embmon_partials_signing_enabled"]
    return float(value)


def build(role: str, tmp_path: Path, scale_out: dict[str, Any]) -> Daemon:
    settings = load_settings(overrides={
        "source": "kafka", "kafka": {"bootstrap_servers": [f"127.0.0.1:{free_port()}"]},  # never started here
        "state_dir": str(tmp_path / role), "http": {"host": "127.0.0.1", "port": 0},
        "checkpoint": {"enabled": True}, "drift": {"enabled": False},
        "scale_out": {"role": role, "replica_id": "replica-0", **scale_out},
    })
    return Replica(settings) if role == "replica" else Reducer(settings)


@pytest.mark.parametrize("role", ["replica", "reducer"])
def test_unsigned_partials_are_warned_about_and_exported(role: str, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="monitor.scaleout.signing"):
        daemon = build(role, tmp_path, {})
    with daemons.stopped_after(daemon):
        (line,) = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
        assert "scale_out.replicas is empty too" in line
        assert signing_gauge(daemon) == 0


@pytest.mark.parametrize("role", ["replica", "reducer"])
def test_signed_partials_are_not_warned_about(role: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    key = tmp_path / "partials.key"
    key.write_text("k" * 40 + "\n")
    with caplog.at_level(logging.WARNING, logger="monitor.scaleout.signing"):
        daemon = build(role, tmp_path, {"partials_key_file": str(key), "replicas": ["replica-0"]})
    with daemons.stopped_after(daemon):
        assert not [r for r in caplog.records if WARNING in r.getMessage()]
        assert signing_gauge(daemon) == 1
