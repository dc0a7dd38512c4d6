"""``scale_out`` settings and roles: single stays the default; misconfigured roles fail at start (exit 2)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import get_args

import pytest

from monitor.cli.main import ROLES, main, role_class
from monitor.config import ConfigError, load_settings
from monitor.daemon.service import Monitor
from monitor.scaleout.reducer import Reducer
from monitor.scaleout.replica import Replica
from monitor.scaleout.settings import Role, default_replica_id


def test_single_is_the_default_and_a_replica_id_defaults_to_the_host_name() -> None:
    scale = load_settings().scale_out
    assert scale.role == "single"
    assert scale.replica_id == default_replica_id() == socket.gethostname().split(".")[0][:64]


def test_the_role_and_the_replica_id_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")
    monkeypatch.setenv("EMBMON_SCALE_OUT__REPLICA_ID", "embedding-monitor-replica-2")
    scale = load_settings().scale_out
    assert (scale.role, scale.replica_id) == ("replica", "embedding-monitor-replica-2")


def test_a_replica_id_must_be_a_label_value() -> None:
    with pytest.raises(ConfigError, match="scale_out.replica_id"):
        load_settings(overrides={"scale_out": {"replica_id": "has spaces"}})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "synthetic"}, "needs source kafka"),
        ({"checkpoint": {"enabled": False}}, "needs checkpoint.enabled"),
    ],
)
def test_a_replica_needs_kafka_and_checkpoints(overrides: dict, message: str, tmp_path: Path) -> None:  # type: ignore[type-arg]
    settings = load_settings(overrides={"scale_out": {"role": "replica"}, "state_dir": str(tmp_path), **overrides})
    with pytest.raises(ConfigError, match=message):
        Replica(settings)


def test_each_role_is_built_by_the_class_the_cli_names_for_it(tmp_path: Path) -> None:
    assert {role: role_class(role) for role in ROLES} == {"single": Monitor, "replica": Replica, "reducer": Reducer}
    assert set(ROLES) == set(get_args(Role))
    replica = load_settings(overrides={"scale_out": {"role": "replica"}, "state_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="scale_out.role replica is not built by Monitor"):
        Monitor(replica)  # the single daemon never turns into a replica by itself


def test_a_reducer_reads_kafka_and_a_topic_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="partials_topic must differ"):
        Reducer(load_settings(overrides={"scale_out": {"role": "reducer", "partials_topic": "embeddings"},
                                         "state_dir": str(tmp_path)}))
    with pytest.raises(ConfigError, match="reads Kafka"):
        Reducer(load_settings(overrides={"scale_out": {"role": "reducer"}, "source": "synthetic",
                                         "state_dir": str(tmp_path)}))


def test_the_cli_refuses_a_replica_without_kafka(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--role", "replica", "--source", "synthetic", "--state-dir", str(tmp_path)])
    assert code == 2
    assert "scale_out.role replica needs source kafka" in capsys.readouterr().err
