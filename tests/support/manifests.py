"""The Kubernetes manifests under deploy/kubernetes/, parsed: documents, workloads and the monitor's
container in them (a native sidecar is a restartable init container, so containers and init
containers are searched alike)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.paths import K8S

MONITOR = "embedding-monitor"  # the monitor's container name in every workload
# the monitor in the application's pod (classic and native sidecar): its readiness is the pod's
SIDECAR_FILES = ("sidecar-native.yaml", "sidecar.yaml")


def documents() -> list[tuple[str, dict[str, Any]]]:
    """(path relative to deploy/kubernetes/, document) of every manifest, in path order."""
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                out.append((path.relative_to(K8S).as_posix(), doc))
    return out


def workloads() -> list[tuple[str, str, dict[str, Any]]]:
    """(file, workload name, pod template) of every Deployment and StatefulSet."""
    return [(path, d["metadata"]["name"], d["spec"]["template"]) for path, d in documents()
            if d["kind"] in {"Deployment", "StatefulSet"}]


def all_containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's init containers and containers."""
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def monitor_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The one monitor container of a pod, wherever it is declared."""
    (monitor,) = [c for c in all_containers(pod_spec) if c["name"] == MONITOR]
    return monitor
