"""A sidecar never takes its host out of service: no probe of the monitor depends on the broker.

A pod is Ready only when every container is (a native sidecar's readiness counts too), and a native
sidecar's startup probe gates the application's start. So in both sidecar forms
(``deploy/kubernetes/sidecar*.yaml``) the monitor's probes may ask ``/healthz`` only, and it has no
readiness probe; Kafka's health is ``embmon_source_up`` and ``EmbeddingMonitorSourceDown``. Checked
here: the manifests say so, the native form is what Kubernetes 1.29 accepts, the two forms run the
same monitor, and a daemon with the shipped sidecar settings and an unreachable broker answers
``/healthz`` 200 (before its first connection attempt has even given up), stops on SIGTERM well
within the pod's grace period, and fires ``EmbeddingMonitorSourceDown`` in a real Prometheus
while ``Down`` and ``Absent`` stay quiet.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from monitor.artifacts import prometheus
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds
from monitor.config import Settings, load_settings
from tests.support import daemons
from tests.support.broker import free_port
from tests.support.manifests import SIDECAR_FILES, all_containers, documents, monitor_container
from tests.support.paths import K8S
from tests.support.prometheus import PrometheusServer
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

# the sidecar that never connects: the daemon abandons kafka-python's bootstrap (it must not hold a stop
# request), and the client's I/O thread ends at the bootstrap's own timeout, after this module
ABANDONED_THREADS = ("kafka-io-",)

PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HANDLERS = {"httpGet", "tcpSocket", "exec", "grpc"}
# what answers without a broker: the ingest threads are alive (monitor/daemon/service.py, Daemon.health)
BROKER_FREE_PATHS = {"/healthz"}
NATIVE_MIN_VERSION = "1.29.0"  # SidecarContainers on by default (beta); 1.28 had it behind a gate
DEFAULT_GRACE_SECONDS = 30  # terminationGracePeriodSeconds when a pod does not set it
CANNOT_REACH = "cannot reach Kafka at"  # logged when a connection attempt gives up


def sidecar_docs(name: str) -> list[dict[str, Any]]:
    return [doc for path, doc in documents() if path == name]


def sidecar_pod(name: str) -> dict[str, Any]:
    (deployment,) = [d for d in sidecar_docs(name) if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def sidecar_config() -> dict[str, Any]:
    """The monitor configuration both sidecar forms ship (tests/deploy/test_deploy.py: one and the same)."""
    (cm,) = [d for d in sidecar_docs("sidecar.yaml") if d["kind"] == "ConfigMap"]
    return yaml.safe_load(cm["data"]["config.yaml"])


def test_every_sidecar_manifest_is_checked() -> None:
    assert tuple(sorted(p.name for p in K8S.glob("sidecar*.yaml"))) == SIDECAR_FILES


def broker_dependent_probes(pod: dict[str, Any]) -> list[str]:
    """Every probe in the pod that asks the monitor anything but a broker-free path, as container.kind."""
    monitor = monitor_container(pod)
    ports = {p["name"]: p["containerPort"] for p in monitor["ports"]}
    found = []
    for container in all_containers(pod):
        for kind in PROBES:
            probe = container.get(kind)
            if probe is None:
                continue
            get = probe.get("httpGet")
            ours = container is monitor or (get is not None and (get["port"] in ports or get["port"] in ports.values()))
            if ours and (set(probe) & HANDLERS != {"httpGet"} or get["path"] not in BROKER_FREE_PATHS
                         or get["port"] not in {*ports, *ports.values()}):
                found.append(f"{container['name']}.{kind}")
    return found


@pytest.mark.parametrize("name", SIDECAR_FILES)
def test_no_probe_of_the_sidecar_monitor_depends_on_the_broker(name: str) -> None:
    pod = sidecar_pod(name)
    assert broker_dependent_probes(pod) == []
    monitor = monitor_container(pod)
    # no readiness probe at all: it would be the pod's, and even on /healthz a dead ingest thread
    # would take the application out of its Service until the liveness probe restarted the monitor
    assert {kind for kind in PROBES if kind in monitor} == {"livenessProbe", "startupProbe"}


@pytest.mark.parametrize("kind", PROBES)
def test_a_probe_on_readyz_or_not_over_http_fails_the_check(kind: str) -> None:
    pod = yaml.safe_load(yaml.safe_dump(sidecar_pod("sidecar.yaml")))
    monitor = monitor_container(pod)
    monitor[kind] = {"httpGet": {"path": "/readyz", "port": "embmon-metrics"}}
    assert broker_dependent_probes(pod) == [f"embedding-monitor.{kind}"]
    monitor[kind] = {"exec": {"command": ["embedding-monitor", "--version"]}}
    assert broker_dependent_probes(pod) == [f"embedding-monitor.{kind}"]
    del monitor[kind]
    (app,) = pod["containers"][:1]
    app["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": 9464}}  # the app asking the monitor
    assert broker_dependent_probes(pod) == ["app.readinessProbe"]


def test_the_native_form_is_a_restartable_init_container_kubernetes_1_29_accepts() -> None:
    pod = sidecar_pod("sidecar-native.yaml")
    assert [c["name"] for c in pod["containers"]] == ["app"]
    (monitor,) = pod["initContainers"]
    assert monitor["name"] == "embedding-monitor" and monitor["restartPolicy"] == "Always"
    for doc in sidecar_docs("sidecar-native.yaml"):
        for version in (NATIVE_MIN_VERSION, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
    # the version requirement is real: before 1.28 an init container has no restartPolicy
    (deployment,) = [d for d in sidecar_docs("sidecar-native.yaml") if d["kind"] == "Deployment"]
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(deployment, "1.27.0", strict=True)
    # it gets SIGTERM once the application has exited, from what is left of the grace period: the
    # application's own default drain plus the monitor's shutdown bound
    settings = load_settings(overrides=sidecar_config())
    assert pod["terminationGracePeriodSeconds"] >= DEFAULT_GRACE_SECONDS + settings.shutdown_timeout_seconds


def test_both_forms_run_the_same_monitor_and_application() -> None:
    classic, native = sidecar_pod("sidecar.yaml"), sidecar_pod("sidecar-native.yaml")
    native_monitor = dict(monitor_container(native))
    assert native_monitor.pop("restartPolicy") == "Always"
    assert native_monitor == monitor_container(classic)  # resources, probes, mounts: change both
    assert [c for c in classic["containers"] if c["name"] != "embedding-monitor"] == native["containers"]
    assert classic["volumes"] == native["volumes"]


# ------------------------------------------------------------------ the daemon behind the probes


@contextlib.contextmanager
def unreachable(kind: str) -> Iterator[str]:
    """A bootstrap address no broker answers at: refused, or a listener that accepts and never replies."""
    if kind == "refused":
        yield "127.0.0.1:1"
        return
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshakes; nothing ever reads or answers
        yield f"127.0.0.1:{silent.getsockname()[1]}"


def sidecar_settings_file(tmp_path: Path, bootstrap: str, port: int) -> Path:
    """The shipped sidecar configuration with the broker address replaced, served on loopback."""
    config = sidecar_config()
    config["kafka"]["bootstrap_servers"] = [bootstrap]
    config["http"] = {"host": "127.0.0.1", "port": port}
    config["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_the_probes_answer_with_the_broker_unreachable_and_sigterm_stops_well_within_the_grace_period(
    kind: str, tmp_path: Path
) -> None:
    with unreachable(kind) as bootstrap:
        path = sidecar_settings_file(tmp_path, bootstrap, free_port())
        with daemons.process("--config", str(path), log=tmp_path / "daemon.log") as daemon:
            assert load_settings(path).kafka.bootstrap_servers == [bootstrap]

            def answered() -> bool:
                assert daemon.returncode is None, daemon.output()[-3000:]
                return http_status(daemon.port, "/healthz") == 200

            wait_until(answered, timeout=60, message="/healthz 200", on_timeout=daemon.output)
            # the port is up before the first connection attempt has given up (kafka-python blocks it
            # for kafka.options.bootstrap_timeout_ms): the startup probe never waits for a broker
            assert CANNOT_REACH not in daemon.output()
            assert http_status(daemon.port, "/readyz") == 503  # why the sidecars do not ask it
            wait_until(lambda: value(scrape(daemon.port), "embmon_source_up") == 0, timeout=30,
                       message="embmon_source_up 0", on_timeout=daemon.output)
            # SIGTERM while that first attempt is still under way: it waits at most for the attempt
            # (bootstrap_timeout_ms, 5 s in the shipped settings; kafka-python's default of 30 s
            # would hold the pod's termination for its whole default grace period)
            began = time.monotonic()
            assert daemon.stop(timeout=DEFAULT_GRACE_SECONDS) == 0
            stopped = time.monotonic() - began
    assert stopped < DEFAULT_GRACE_SECONDS / 2, stopped  # measured 5 s here
    # and by the ordinary path (the daemon's stop ran to its end; no shutdown bound cut a start-up
    # still blocked in kafka-python short)
    assert "embedding-monitor stopped" in daemon.output() and "Traceback" not in daemon.output()


@pytest.mark.slow
@pytest.mark.prometheus
def test_a_sidecar_that_never_connects_raises_source_down_not_down_or_absent(tmp_path: Path) -> None:
    job = Thresholds().job
    th = Thresholds.model_validate({"job": job, "alerts": {"EmbeddingMonitorSourceDown": {"for": "2s"}}})
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(prometheus.rule_file(build_rules(th)), sort_keys=False))
    port = free_port()
    settings: Settings = load_settings(sidecar_settings_file(tmp_path, "127.0.0.1:1", port))
    try:
        with (
            PrometheusServer.start(tmp_path, scrape={job: [f"127.0.0.1:{port}"]}, rule_files=[rules]) as prom,
            daemons.monitor(settings),
        ):
            def states() -> dict[str, str]:
                return {a["labels"]["alertname"]: a["state"] for a in prom.alerts()}

            firing = prom.wait_until(lambda: states().get("EmbeddingMonitorSourceDown") == "firing" and states(),
                                     timeout=60, message="EmbeddingMonitorSourceDown firing")
            # all along the ingest thread retries (its first attempt gave up before start() returned)
            assert http_status(port, "/healthz") == 200 and http_status(port, "/readyz") == 503
            (alert,) = [a for a in prom.alerts() if a["labels"]["alertname"] == "EmbeddingMonitorSourceDown"]
            assert alert["labels"]["instance"] == f"127.0.0.1:{port}" and alert["labels"]["severity"] == "warning"
            # it is scraped and known: the alerts for a missing or unscraped monitor stay quiet
            assert prom.query(f'up{{job="{job}"}} == 1')
            assert "EmbeddingMonitorDown" not in firing and "EmbeddingMonitorAbsent" not in firing
    finally:
        gc.collect()  # a socket leaked by a failed connection attempt would warn (= fail) here
