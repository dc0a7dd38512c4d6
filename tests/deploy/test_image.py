"""The image, built and run as its users run it.

``scripts/build-image`` builds the Dockerfile with podman (on a Debian base made by debootstrap when no
registry answers; it installs podman, runc and debootstrap when missing). The container then runs with a
read-only root filesystem, as the image's non-root user, its state on a named volume, against the real test
broker: it consumes what a producer wrote, its ``/metrics`` is scraped, its ``HEALTHCHECK`` passes, and
SIGTERM stops it cleanly with a checkpoint on the volume. Image size, start-up and build times are printed
(docs/deployment.md, The image).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.artifacts._io import to_yaml
from tests.support.broker import FAST_GROUP_OPTIONS, Broker, free_port, running_broker
from tests.support.manifests import documents, monitor_container
from tests.support.paths import REPO
from tests.support.producers import produce_rows
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.broker]

TAG = "localhost/embedding-monitor:test"
CACHE = REPO / ".cache" / "image"
UID = 10001  # the Dockerfile's USER
STATE = "/var/lib/embedding-monitor"
ROWS = 300
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
    done = subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: rc {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


@dataclass
class Built:
    tag: str
    seconds: float
    size_bytes: int


@pytest.fixture(scope="module")
def image() -> Built:
    start = time.monotonic()
    done = subprocess.run([str(REPO / "scripts" / "build-image"), TAG], capture_output=True, text=True,
                          timeout=1800, check=False)
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-4000:]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", TAG).stdout)
    print(f"\nimage {TAG}: built in {seconds:.0f} s, {size / 1e6:.0f} MB")
    return Built(TAG, seconds, size)


@dataclass
class Container:
    name: str
    volume: str
    port: int
    started: float

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def inspect(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(podman("inspect", self.name).stdout)[0]
        return out


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with running_broker() as running:
        yield running


@pytest.fixture
def container(image: Built, broker: Broker) -> Iterator[Container]:
    topic, suffix = "embeddings", uuid.uuid4().hex[:8]
    broker.create_topics(topic)
    produce_rows(broker, topic, ROWS, seed=39)
    name, volume, port = f"embmon-test-{suffix}", f"embmon-test-state-{suffix}", free_port()
    podman("volume", "create", volume)
    started = time.monotonic()
    podman("run", "--detach", "--name", name, "--read-only", "--tmpfs", "/tmp", "--network", "host",
           "--volume", f"{volume}:{STATE}",
           "--env", f"EMBMON_HTTP__PORT={port}", "--env", "EMBMON_KAFKA__AUTO_OFFSET_RESET=earliest",
           "--env", "EMBMON_CHECKPOINT__INTERVAL_SECONDS=1",
           image.tag, "run", "--bootstrap-servers", broker.bootstrap, "--embeddings-topic", topic,
           "--group-id", f"image-{suffix}", "--refresh-seconds", "1")
    running = Container(name, volume, port, started)
    try:
        yield running
    finally:
        print(running.logs()[-3000:])
        podman("rm", "--force", "--time", "5", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


def answers(port: int) -> bool:
    try:
        return http_status(port, "/healthz") == 200
    except OSError:
        return False


def test_the_image_is_small_runs_as_its_user_and_keeps_the_healthcheck(image: Built) -> None:
    inspected = json.loads(podman("image", "inspect", image.tag).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["ExposedPorts"] == {"9464/tcp": {}}
    assert STATE in config["Volumes"]
    assert config["Entrypoint"] == ["embedding-monitor"] and config["Cmd"] == ["run"]
    health = inspected["Healthcheck"]  # kept by the docker format (the OCI image config has no field for it)
    assert health["Test"][0] == "CMD" and "/healthz" in health["Test"][-1] and "EMBMON_HTTP__PORT" in health["Test"][-1]
    assert inspected["ManifestType"].startswith("application/vnd.docker")
    # the CPU daemon: no torch, no CUDA (docs/deployment.md: the default build)
    listing = podman("run", "--rm", "--read-only", "--network", "none", "--entrypoint", "python", image.tag,
                     "-c", "import importlib.util as u; print([m for m in ('torch', 'sentence_transformers') "
                           "if u.find_spec(m)])").stdout
    assert listing.strip() == "[]"
    assert image.size_bytes < 700e6, image.size_bytes


def test_the_container_consumes_exports_passes_its_healthcheck_and_stops_on_sigterm(container: Container) -> None:
    wait_until(lambda: answers(container.port), timeout=90, message="/healthz of the container",
               on_timeout=container.logs)
    startup = time.monotonic() - container.started
    print(f"\nstart-up (podman run to /healthz 200): {startup:.1f} s")

    # as its users run it: not root, read-only root filesystem, state on the volume
    state = container.inspect()
    assert state["Config"]["User"] == f"{UID}:{UID}" and state["HostConfig"]["ReadonlyRootfs"] is True
    ident = podman("exec", container.name, "id", "-u").stdout.strip()
    assert ident == str(UID)
    refused = podman("exec", container.name, "touch", "/opt/venv/written", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr

    def consumed() -> bool:
        return value(scrape(container.port), "embmon_records_total", model="m", stream="default") == ROWS

    wait_until(consumed, timeout=90, message=f"{ROWS} records counted in the container's /metrics",
               on_timeout=container.logs)
    samples = scrape(container.port)
    assert value(samples, "embmon_source_up") == 1.0
    assert any(name == "embmon_build_info" for name, _ in samples)
    with urllib.request.urlopen(f"http://127.0.0.1:{container.port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")

    # the image's own HEALTHCHECK, run by podman in the container
    health = podman("healthcheck", "run", container.name, check=False)
    assert health.returncode == 0, health.stdout + health.stderr

    # SIGTERM (podman stop's signal): a clean exit well before the 30 s after which podman kills
    stopping = time.monotonic()
    podman("stop", "--time", "30", container.name, timeout=60)
    took = time.monotonic() - stopping
    print(f"stopped by SIGTERM in {took:.1f} s")
    final = container.inspect()["State"]
    assert final["ExitCode"] == 0 and took < 25, (final, container.logs()[-2000:])
    # its checkpoint is on the volume, written by the image's user
    mount = json.loads(podman("volume", "inspect", container.volume).stdout)[0]["Mountpoint"]
    files = [p for p in Path(mount).rglob("*") if p.is_file()]
    assert files, f"nothing written to the state volume {mount}"
    assert {p.stat().st_uid for p in files} == {UID}


# --- the pod: the shipped sidecar manifests, played by podman beside a producing application ---

PRODUCER = """\
import os, signal, sys, time
import numpy as np
from kafka import KafkaProducer
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
producer = KafkaProducer(bootstrap_servers=os.environ["BOOTSTRAP"])
rows = np.random.default_rng(7).standard_normal((int(os.environ["ROWS"]), 4)).astype(np.float32)
for row in rows:
    producer.send(os.environ["TOPIC"], row.tobytes(), headers=[("model", b"app"), ("dim", b"4")])
producer.flush()
print("produced", len(rows), flush=True)
while True:
    time.sleep(3600)
"""


def played(form: str, tag: str, broker: Broker, topic: str, port: int) -> list[dict[str, Any]]:
    """``form`` (deploy/kubernetes/) as podman can play it here: the image and the test broker in place of the
    example ones, the host's network (the broker listens on its loopback), one replica, and the application
    replaced by a producer of ``topic`` in the same image. Probes, security contexts, volumes, the grace period
    and the monitor's place (container or restartable init container) are the manifest's own."""
    docs = copy.deepcopy([doc for path, doc in documents() if path == form])
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    config["kafka"].update(bootstrap_servers=[broker.bootstrap], embeddings_topic=topic, auto_offset_reset="earliest")
    config["kafka"]["options"].update(FAST_GROUP_OPTIONS)
    config["http"]["port"] = port
    cm["data"]["config.yaml"] = yaml.safe_dump(config)
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    monitor = monitor_container(pod)
    monitor["image"] = tag
    monitor["env"] = [*monitor.get("env", []), {"name": "EMBMON_HTTP__PORT", "value": str(port)}]
    # podman refuses port mappings on the host's network: the probes name the port by number instead
    del monitor["ports"]
    for probe in PROBES:
        if probe in monitor:
            monitor[probe]["httpGet"]["port"] = port
    (app,) = [c for c in pod["containers"] if c["name"] == "app"]
    app.update(image=tag, command=["python", "-c", PRODUCER], ports=[],
               env=[{"name": "BOOTSTRAP", "value": broker.bootstrap}, {"name": "TOPIC", "value": topic},
                    {"name": "ROWS", "value": str(ROWS)}])
    return [cm, deployment]


def play(manifest: list[dict[str, Any]], path: Path) -> subprocess.CompletedProcess[str]:
    path.write_text("---\n".join(to_yaml(doc, header=None) for doc in manifest), encoding="utf-8")
    return podman("kube", "play", str(path), check=False, timeout=120)


PODS_LOCK = Path(tempfile.gettempdir()) / "embmon-podman-pods.lock"


@contextlib.contextmanager
def pod_down(path: Path, name: str) -> Iterator[None]:
    """Whatever the test did: the pod and the volumes podman made for it (its emptyDirs and ConfigMap) removed.

    The pod, its containers and its volumes have fixed names in podman's machine-wide state, and the
    test workers share one podman: a pod test holds ``PODS_LOCK`` from its play to its clean-up, so
    two workers never play the same pod at once (one's play found the other's pod, one's clean-up
    took the other's volumes)."""
    with open(PODS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            _remove_pod(path, name)


POD_VOLUMES = ("embmon-state", "embmon-tmp", "embedding-service-monitor-config")


def _remove_pod(path: Path, name: str) -> None:
    podman("kube", "down", str(path), check=False, timeout=90)
    podman("pod", "rm", "--force", name, check=False)
    # only volumes of exactly these names: podman looks a volume up by a unique *prefix* of its name
    # too, so `volume rm --force embmon-state` with the pod's own volume gone took another test's
    # `embmon-state-<id>`, and --force the container using it (a container test's vanished mid-test)
    existing = set(podman("volume", "ls", "--format", "{{.Name}}", check=False).stdout.split())
    doomed = [v for v in POD_VOLUMES if v in existing]
    if doomed:
        podman("volume", "rm", "--force", *doomed, check=False)


POD = "embedding-service-pod-0"  # podman names the pod of a Deployment <name>-pod-0, its containers <pod>-<name>


def test_the_classic_sidecar_pod_consumes_exports_and_never_takes_its_host_down(image: Built,
                                                                                tmp_path: Path) -> None:
    """sidecar.yaml played by podman: the monitor consumes what the application beside it produces, exports it,
    answers its probe's endpoint, keeps answering with the broker gone while the application runs on, and
    stops cleanly when the pod is taken down."""
    port, path = free_port(), tmp_path / "sidecar.yaml"
    monitor, app = f"{POD}-embedding-monitor", f"{POD}-app"
    with running_broker() as broker, pod_down(path, POD):
        broker.create_topics("embeddings")
        done = play(played("sidecar.yaml", image.tag, broker, "embeddings", port), path)
        assert done.returncode == 0, done.stderr

        def logs() -> str:
            return podman("logs", monitor, check=False).stderr[-3000:]

        wait_until(lambda: answers(port), timeout=90, message="the sidecar's /healthz", on_timeout=logs)
        wait_until(lambda: value(scrape(port), "embmon_records_total", model="app", stream="default") == ROWS,
                   timeout=90, message=f"the {ROWS} records the application produced", on_timeout=logs)
        state = json.loads(podman("inspect", monitor).stdout)[0]
        assert state["HostConfig"]["ReadonlyRootfs"] is True
        assert podman("exec", monitor, "id", "-u").stdout.strip() == str(UID)
        # the liveness probe: podman runs it as `curl` in the container, which the image does not carry
        # (docs/deployment.md, Podman); its endpoint answers as the kubelet asks it
        assert "curl" in state["Config"]["Healthcheck"]["Test"]
        assert http_status(port, monitor_container(pod_spec("sidecar.yaml"))["livenessProbe"]["httpGet"]["path"]) \
            == 200

        broker.stop()  # Kafka gone: the application runs on, the monitor says so and stays live
        wait_until(lambda: value(scrape(port), "embmon_source_up") == 0.0, timeout=90,
                   message="embmon_source_up 0 with the broker gone", on_timeout=logs)
        assert answers(port)
        for name in (monitor, app):
            container = json.loads(podman("inspect", name).stdout)[0]
            assert container["State"]["Status"] == "running" and container["RestartCount"] == 0, name
        assert json.loads(podman("pod", "inspect", POD).stdout)["State"] == "Running"

        stopping = time.monotonic()
        podman("pod", "stop", "--time", "45", POD, timeout=90)  # SIGTERM to both, the manifest's grace period
        took = time.monotonic() - stopping
        final = json.loads(podman("inspect", monitor).stdout)[0]["State"]
        assert final["ExitCode"] == 0 and took < 40, (final, took, logs())


def test_podman_refuses_the_native_sidecar(image: Built, tmp_path: Path) -> None:
    """sidecar-native.yaml: podman 4.3 refuses an init container with probes, and (the probes taken out) runs
    its init containers to completion before the application, so a restartable init container would hold
    the application back for ever. The native form is for Kubernetes >= 1.29 only."""
    path = tmp_path / "sidecar-native.yaml"
    with running_broker() as broker, pod_down(path, POD):
        done = play(played("sidecar-native.yaml", image.tag, broker, "embeddings", free_port()), path)
    assert done.returncode != 0
    assert "cannot create an init container that has either of lifecycle, livenessProbe" in done.stderr


def pod_spec(form: str) -> dict[str, Any]:
    (deployment,) = [doc for path, doc in documents() if path == form and doc["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec
