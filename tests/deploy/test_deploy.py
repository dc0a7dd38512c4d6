"""Deployment artifacts: Kubernetes manifests validated offline, the Dockerfile linted and its
project install step run in a clean virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from monitor.artifacts import generate
from monitor.artifacts.thresholds import Thresholds
from monitor.config import load_settings
from tests.support.manifests import SIDECAR_FILES, all_containers, documents, monitor_container, workloads
from tests.support.paths import REPO

K8S_VERSION = kubernetes_validate.latest_version()
CRD_KINDS = {"PrometheusRule", "PodMonitor", "ServiceMonitor"}
JOB = Thresholds().job


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def test_the_expected_manifests_exist() -> None:
    kinds = sorted(d["kind"] for _, d in documents())
    assert kinds == sorted(["ConfigMap", "Deployment", "ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget",
                            # sidecar-native.yaml: the sidecar's ConfigMap and Deployment, native form
                            "ConfigMap", "Deployment",
                            "PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap",
                            # scaled.yaml: replicas + reducers (tests/deploy/test_scaled.py)
                            "ConfigMap", "Service", "StatefulSet", "StatefulSet", "PodDisruptionBudget",
                            "PodDisruptionBudget"])


@pytest.mark.parametrize(("path", "doc"), [(p, d) for p, d in documents() if d["kind"] not in CRD_KINDS],
                         ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_core_manifests_validate_against_the_kubernetes_schemas(path: str, doc: dict[str, Any]) -> None:
    # strict: unknown fields are errors too (a typo'd securityContext key would otherwise pass)
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest() -> None:
    (deployment, *_) = by_kind("Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    monitor_container(broken["spec"]["template"]["spec"])["securityContext"]["readOnlyRootFs"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)
    # CRDs are not in its bundled schemas: they are checked structurally below
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(by_kind("PodMonitor")[0], K8S_VERSION, strict=True)


# Structural schemas for the prometheus-operator CRDs, limited to the fields these manifests use
# (field names and types from monitoring.coreos.com/v1).
_STR, _DUR = str, re.compile(r"^\d+[smhdw]$")
CRD_SPEC_FIELDS = {
    "PodMonitor": {"jobLabel", "selector", "podMetricsEndpoints"},
    "ServiceMonitor": {"jobLabel", "selector", "endpoints"},
    "PrometheusRule": {"groups"},
}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout"}


def test_crds_are_structurally_valid() -> None:
    for _, doc in documents():
        kind = doc["kind"]
        if kind not in CRD_KINDS:
            continue
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
        spec = doc["spec"]
        assert set(spec) <= CRD_SPEC_FIELDS[kind] and spec, kind
        if kind == "PrometheusRule":
            for group in spec["groups"]:
                assert set(group) <= {"name", "interval", "rules"} and isinstance(group["name"], _STR)
                for rule in group["rules"]:
                    assert set(rule) <= {"record", "alert", "expr", "for", "labels", "annotations"}
                    assert ("record" in rule) != ("alert" in rule) and isinstance(rule["expr"], _STR)
                    assert "for" not in rule or _DUR.match(rule["for"])
                    for key in ("labels", "annotations"):
                        assert all(isinstance(v, _STR) for v in rule.get(key, {}).values())
            continue
        assert isinstance(spec["jobLabel"], _STR)
        assert set(spec["selector"]) == {"matchLabels"}
        endpoints = spec["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
        for endpoint in endpoints:
            assert set(endpoint) <= ENDPOINT_FIELDS and endpoint["path"] == "/metrics"
            assert _DUR.match(endpoint["interval"]) and _DUR.match(endpoint["scrapeTimeout"])


def test_monitors_select_the_pods_and_yield_the_job_label_the_alerts_use() -> None:
    (pod_monitor,) = by_kind("PodMonitor")
    (service_monitor,) = by_kind("ServiceMonitor")
    sidecars = [t for path, _, t in workloads() if path in SIDECAR_FILES]
    assert len(sidecars) == len(SIDECAR_FILES)
    for sidecar in sidecars:
        labels = sidecar["metadata"]["labels"]
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert labels[pod_monitor["spec"]["jobLabel"]] == JOB
        # Prometheus' pod discovery lists init containers' ports too (__meta_kubernetes_pod_container_init)
        ports = {p["name"] for p in monitor_container(sidecar["spec"]).get("ports", [])}
        assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    (service,) = [s for s in by_kind("Service") if s["metadata"]["name"] == "embedding-monitor"]
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["labels"][service_monitor["spec"]["jobLabel"]] == JOB
    assert service_monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize(("path", "name", "template"), workloads(), ids=[f"{p}:{n}" for p, n, _ in workloads()])
def test_pods_are_restricted_and_the_monitor_is_probed(path: str, name: str, template: dict[str, Any]) -> None:
    spec = template["spec"]
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    monitor = monitor_container(spec)
    for container in all_containers(spec):
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert monitor["livenessProbe"]["httpGet"]["path"] == "/healthz"
    if path in SIDECAR_FILES:  # its readiness would be the application's (tests/deploy/test_sidecar.py)
        assert "readinessProbe" not in monitor
    else:
        assert monitor["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["mountPath"]: m["name"] for m in monitor["volumeMounts"]}
    state = mounts["/var/lib/embedding-monitor"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    assert "emptyDir" in volumes.get(state, {}) or state in _claim_names(name)
    assert "/tmp" in mounts  # the only other writable path under a read-only root
    env = {e["name"]: e["value"] for e in monitor["env"]}
    assert env["EMBMON_STATE_DIR"] == "/var/lib/embedding-monitor"


def _claim_names(workload: str) -> set[str]:
    return {c["metadata"]["name"] for d in by_kind("StatefulSet") if d["metadata"]["name"] == workload
            for c in d["spec"].get("volumeClaimTemplates", [])}


@pytest.mark.parametrize("name", ["embedding-service-monitor-config", "embedding-monitor-config"])
def test_the_monitor_configs_are_valid_daemon_settings(name: str, tmp_path: Path) -> None:
    configs = {d["data"]["config.yaml"] for d in by_kind("ConfigMap") if d["metadata"]["name"] == name}
    (config,) = configs  # both sidecar forms ship the same configuration
    path = tmp_path / "config.yaml"
    path.write_text(config)
    settings = load_settings(path)
    assert settings.source == "kafka" and settings.http.port == 9464
    if name == "embedding-monitor-config":
        (sts,) = [s for s in by_kind("StatefulSet") if s["metadata"]["name"] == "embedding-monitor"]
        assert sts["spec"]["replicas"] > 1  # replicas share one consumer group
        assert settings.kafka.group_id == "embedding-monitor-central"


def test_generated_kubernetes_objects_are_in_sync() -> None:
    files = generate.render()
    for rel in (generate.PROMETHEUS_RULE_CR, generate.DASHBOARDS_CONFIGMAP):
        assert (REPO / rel).read_text(encoding="utf-8") == files[rel], rel


# ------------------------------------------------------------------------- Dockerfile


DOCKERFILE = REPO / "Dockerfile"


def test_hadolint_passes() -> None:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # and it does flag a bad Dockerfile (the binary works, the test can fail)
    bad = subprocess.run([exe, "--no-color", "-"], input="FROM python\nRUN pip install torch\n",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "DL3006" in bad.stdout


def test_dockerfile_structure() -> None:
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    text = "\n".join(lines)
    final = text.rsplit("\nFROM ", 1)[1]
    assert "USER 10001:10001" in final and "HEALTHCHECK" in final and "/healthz" in final
    assert 'VOLUME ["/var/lib/embedding-monitor"]' in final and "EXPOSE 9464" in final
    assert 'ENTRYPOINT ["embedding-monitor"]' in final
    # torch (only from an index asked for) -> dependencies (pyproject only) -> the project, in that order
    torch = text.index(
        'if [ -n "$TORCH_INDEX" ]; then pip install --no-cache-dir torch==2.13.0 --index-url "$TORCH_INDEX"; fi'
    )
    deps = text.index("COPY pyproject.toml ./")
    source = text.index("COPY monitor ./monitor")
    assert torch < deps < text.index("pip install --no-cache-dir -r /tmp/requirements.txt") < source
    # the default image asks for no extra and no torch index; no other line installs torch
    assert 'ARG EXTRAS=""' in text and 'ARG TORCH_INDEX=""' in text
    assert [ln for ln in lines if "torch" in ln and "TORCH_INDEX" not in ln] == []
    assert "--no-deps ." in text[source:]
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1 :][:3] == ["!pyproject.toml", "!README.md", "!monitor/"]


def dockerfile_requirements(extras: str | None) -> list[str]:
    """What the Dockerfile's step 2 extracts from pyproject.toml, run exactly as written, with the
    build argument ``EXTRAS`` (None: not given)."""
    extract = re.search(r'python -c "(import os, tomllib;.+?)"', DOCKERFILE.read_text())
    assert extract
    env = {k: v for k, v in os.environ.items() if k != "EXTRAS"} | ({} if extras is None else {"EXTRAS": extras})
    out = subprocess.run([sys.executable, "-c", extract.group(1)], cwd=REPO, capture_output=True, text=True,
                         check=True, env=env).stdout
    return [line for line in out.split("\n") if line]


def installed_closure(requirements: list[str]) -> set[str]:
    """Every distribution ``requirements`` pull in, transitively (extras and markers evaluated),
    read from the metadata of what this environment has installed (a superset of the image's)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: set[tuple[str, str]] = set()  # (distribution, extra)
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *req.extras):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            todo += [(Requirement(r), wanted) for r in metadata.distribution(name).requires or []]
    return {name for name, _ in seen}


def test_the_default_image_installs_neither_torch_nor_sentence_transformers() -> None:
    """Step 2 without build arguments: no torch, directly or through any dependency; EXTRAS=gpu
    adds torch, EXTRAS=gpu,encoder sentence-transformers too."""
    default = dockerfile_requirements(None)
    assert "numpy>=1.26" in default and "prometheus-client>=0.20" in default
    assert not any(r.startswith(("torch", "sentence-transformers", "pytest")) for r in default)
    assert dockerfile_requirements("") == default
    closure = installed_closure(default)
    assert {"numpy", "scipy", "kafka-python", "river"} <= closure
    assert not closure & {"torch", "sentence-transformers", "transformers", "scikit-learn"}  # scikit-learn: tests only
    assert not any(name.startswith("nvidia-") for name in closure)
    assert dockerfile_requirements("gpu") == [*default, "torch>=2.2"]
    both = dockerfile_requirements("gpu, encoder")
    assert both[len(default):] == ["torch>=2.2", "sentence-transformers>=3.0"]
    assert "torch" in installed_closure(["sentence-transformers>=3.0"])  # why encoder needs no gpu


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_dockerfile_install_steps_succeed_in_a_clean_virtualenv(tmp_path: Path) -> None:
    """The image's steps 2 and 3 offline: the requirements extraction, and the project install.

    Step 2's command extracts the requirements from pyproject.toml exactly as the Dockerfile
    does; step 3 builds the wheel and installs it with --no-deps into a fresh venv, then checks
    the console script and the packaged modules. Downloading the dependencies needs the network
    and is not done here (docs/deployment.md says so); what they pull in is checked from the
    installed metadata (above).
    """
    reqs = dockerfile_requirements(None)
    assert "numpy>=1.26" in reqs and "prometheus-client>=0.20" in reqs and not any("pytest" in r for r in reqs)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(REPO)], check=True, capture_output=True, timeout=120)
    (wheel,) = wheels.glob("embedding_monitor-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # a clean virtualenv: a PYTHONPATH pointing at the checkout would make pip see the project
    # (its egg-info) as installed already and skip the wheel
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=120, env=clean)
    assert (venv / "bin" / "embedding-monitor").is_file()
    listing = subprocess.run(
        [str(py), "-c", "import importlib.util as u; print(u.find_spec('monitor.artifacts').origin)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean,
    ).stdout
    assert str(venv) in listing
    # sub-packages too (monitor.artifacts.rules is a package of its own)
    assert (Path(listing.strip()).parent / "rules" / "model.py").is_file()
