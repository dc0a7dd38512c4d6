"""deploy/kubernetes/scaled.yaml: N replicas plus a group of reducers that fit together and with the monitors.

Schema validation (kubernetes-validate, strict) and the pod hardening checks run on these
manifests in tests/deploy/test_deploy.py like on every other; here: what makes the scaled deployment work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.artifacts.thresholds import Thresholds
from monitor.config import load_settings
from monitor.scaleout.reducer import reducer_settings
from monitor.scaleout.replica import check_replica_settings
from tests.support.paths import K8S

SCALED = K8S / "scaled.yaml"
JOB = Thresholds().job


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(SCALED.read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def workload(role: str) -> dict[str, Any]:
    return objects()[("StatefulSet", f"embedding-monitor-{role}")]


def monitor_container(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "embedding-monitor"]
    return container


@pytest.mark.parametrize("role", ["replica", "reducer"])
def test_each_workload_runs_its_role_from_the_shared_config(role: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sts = workload(role)
    env = {e["name"]: e["value"] for e in monitor_container(sts)["env"]}
    assert env["EMBMON_SCALE_OUT__ROLE"] == role
    (volume,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    config = objects()[("ConfigMap", volume["configMap"]["name"])]  # one config: one window for all
    text = config["data"]["config.yaml"]
    # the partials key: the Secret, mounted read-only where the config points (a key of our own here)
    key_file = Path(yaml.safe_load(text)["scale_out"]["partials_key_file"])
    (key,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "partials-key"]
    assert key["secret"]["secretName"] == "embedding-monitor-partials-key" and key["secret"]["defaultMode"] == 0o440
    (mount,) = [m for m in monitor_container(sts)["volumeMounts"] if m["name"] == "partials-key"]
    assert mount["readOnly"] and key_file.parent == Path(mount["mountPath"])
    local_key = tmp_path / key_file.name
    local_key.write_text("k" * 40 + "\n")
    path = tmp_path / "config.yaml"
    path.write_text(text.replace(str(key_file), str(local_key)))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EMBMON_HTTP__PORT", "9464")
    # the replica id defaults to the pod name, one of the trusted replicas
    monkeypatch.setenv("EMBMON_SCALE_OUT__REPLICA_ID", f"embedding-monitor-{role}-0")
    settings = load_settings(path)
    assert settings.scale_out.role == role and settings.kafka.interactions_topic
    assert settings.scale_out.partials_keys() == (b"k" * 40,)
    replicas = workload("replica")["spec"]["replicas"]
    assert settings.scale_out.replicas == [f"embedding-monitor-replica-{i}" for i in range(replicas)]
    if role == "replica":
        check_replica_settings(settings)  # kafka, checkpoints on
        assert sts["spec"]["replicas"] > 1 and sts["spec"]["volumeClaimTemplates"]  # a PVC each: checkpoints
        assert "EMBMON_SCALE_OUT__REPLICA_ID" not in env  # the pod name: stable across restarts, unique
    else:
        reducer_settings(settings)
        # a group of reducers: each exports its streams, the others take them over when it dies
        assert sts["spec"]["replicas"] >= 2 and settings.scale_out.reducer_group
        assert settings.scale_out.reducer_group != settings.kafka.group_id
        assert sts["spec"]["volumeClaimTemplates"]  # a checkpoint each


def test_the_service_monitor_scrapes_replicas_and_reducer_under_the_alerts_job() -> None:
    service = objects()[("Service", "embedding-monitor-scaled")]
    monitor = yaml.safe_load((K8S / "servicemonitor.yaml").read_text())
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == JOB
    port = service["spec"]["ports"][0]["targetPort"]
    for role in ("replica", "reducer"):
        template = workload(role)["spec"]["template"]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        assert port in {p["name"] for p in monitor_container(workload(role))["ports"]}
    # the central deployment's Service does not pick these pods up (deploy one or the other)
    central = [d for d in yaml.safe_load_all((K8S / "central.yaml").read_text()) if d and d["kind"] == "Service"][0]
    assert (
        not central["spec"]["selector"].items() <= workload("replica")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_two_workloads_do_not_select_each_others_pods() -> None:
    replica, reducer = workload("replica"), workload("reducer")
    assert (
        not replica["spec"]["selector"]["matchLabels"].items()
        <= reducer["spec"]["template"]["metadata"]["labels"].items()
    )
    assert (
        not reducer["spec"]["selector"]["matchLabels"].items()
        <= replica["spec"]["template"]["metadata"]["labels"].items()
    )
    for role in ("replica", "reducer"):  # one pod of each at a time: the others take its partitions over
        pdb = objects()[("PodDisruptionBudget", f"embedding-monitor-{role}")]
        assert pdb["spec"]["selector"]["matchLabels"] == workload(role)["spec"]["selector"]["matchLabels"]
        assert pdb["spec"]["maxUnavailable"] == 1
