"""Real Prometheus and Alertmanager servers for tests, on free loopback ports.

    with PrometheusServer.start(tmp_path, scrape={"embedding-monitor": [f"127.0.0.1:{port}"]},
                                rule_files=[rules], alertmanager=am.address) as prom:
        prom.wait_until(lambda: prom.query("up"), message="first scrape")
        series = prom.query('embmon_records_total')

Both run the Debian binaries (``prometheus``, ``prometheus-alertmanager``; ``scripts/setup test``
installs them) with a generated config, a temporary storage directory and their log in a file
whose tail is attached to any failure. ``stop()`` sends SIGTERM and waits; the context managers
always stop. :class:`WebhookReceiver` is the HTTP endpoint Alertmanager notifies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support.broker import free_port
from tests.support.waiting import wait_until

PROMETHEUS_BIN = "prometheus"
ALERTMANAGER_BIN = "prometheus-alertmanager"
LOOPBACK = "127.0.0.1"


class PromQLError(AssertionError):
    """The HTTP API answered ``status: error`` (a parse or evaluation error)."""


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `scripts/setup test` (Debian package)")
    return path


def _http(url: str, data: Mapping[str, str] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


@dataclass
class _Process:
    name: str
    argv: list[str]
    log_path: Path
    ready_url: str
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._ready, timeout=timeout, message=f"{self.name} readiness", on_timeout=self.log_tail)

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}\n{self.log_tail()}")
        return _http(self.ready_url, timeout=2)[0] == 200

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- {self.name} log ---\n" + "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.terminate()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=5)


def _retry_on_port_clash(start: Callable[[], _Process], attempts: int = 3) -> _Process:
    """Start; if the chosen port was taken between probing and binding, try a new one."""
    for attempt in range(attempts):
        proc = start()
        try:
            proc.start(timeout=30)
            return proc
        except RuntimeError as exc:
            proc.stop()
            if "address already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@dataclass
class _Server:
    """A binary running on a loopback port: the plumbing Prometheus and Alertmanager share."""

    port: int
    workdir: Path
    config: dict[str, Any]
    proc: _Process

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def stop(self) -> int | None:
        return self.proc.stop()

    def log_tail(self) -> str:
        return self.proc.log_tail()

    @classmethod
    @contextmanager
    def _serving(cls, launch: Callable[[int], tuple[dict[str, Any], _Process]], workdir: Path) -> Iterator[Any]:
        """Start via ``launch(port) -> (config, process)`` on a free port (retried on a clash), yield, stop."""
        servers: list[_Server] = []

        def attempt() -> _Process:
            port = free_port()
            config, proc = launch(port)
            servers[:] = [cls(port, workdir, config, proc)]
            return proc

        _retry_on_port_clash(attempt)
        server = servers[0]
        try:
            yield server
        finally:
            server.stop()


@dataclass
class PrometheusServer(_Server):
    """A running Prometheus; use :meth:`start` (a context manager)."""

    @staticmethod
    def config_for(
        port: int,
        scrape: Mapping[str, Sequence[str]] = (),  # type: ignore[assignment]
        rule_files: Sequence[str | Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        alertmanager: str | None = None,
        self_scrape: bool = False,
    ) -> dict[str, Any]:
        jobs = dict(scrape)
        if self_scrape:
            jobs["prometheus"] = [f"{LOOPBACK}:{port}"]
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                       "scrape_timeout": scrape_interval},
            "rule_files": [str(Path(p).resolve()) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": list(targets)}]} for job, targets in jobs.items()
            ],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        return config

    @classmethod
    @contextmanager
    def start(cls, workdir: Path, **config_kwargs: Any) -> Iterator[PrometheusServer]:
        workdir = Path(workdir) / "prometheus"
        workdir.mkdir(parents=True, exist_ok=True)

        def launch(port: int) -> tuple[dict[str, Any], _Process]:
            config = cls.config_for(port, **config_kwargs)
            config_path = workdir / "prometheus.yml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            argv = [
                binary(PROMETHEUS_BIN),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{port}",
                # firing alerts are re-sent every minute by default; the Alertmanager is discovered
                # a few seconds after start-up, so a first send can find no one to send to
                "--rules.alert.resend-delay=1s",
                "--log.level=info",
            ]
            return config, _Process("prometheus", argv, workdir / "prometheus.log", f"http://{LOOPBACK}:{port}/-/ready")

        with cls._serving(launch, workdir) as server:
            yield server

    # --- HTTP API

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """POST ``params`` to ``/api/v1/<path>``; return ``data``; raise :class:`PromQLError` on error."""
        status, body = _http(f"{self.url}/api/v1/{path}", dict(params) if params else None)
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            raise PromQLError(f"{path}: HTTP {status}: {body[:500]!r}") from None
        if payload.get("status") != "success":
            raise PromQLError(f"{path} {dict(params or {})}: {payload.get('errorType')}: {payload.get('error')}")
        return payload["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = str(at)
        data = self.api("query", params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self.api("alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self.api("rules")["groups"])

    def wait_until(self, predicate: Callable[[], Any], timeout: float = 30.0, message: str = "") -> Any:
        """:func:`~tests.support.waiting.wait_until` on this server: a PromQL error means "not yet", and
        a failure shows the server's log."""
        return wait_until(predicate, timeout=timeout, message=message, retry=(OSError, PromQLError),
                          on_timeout=self.log_tail)


@dataclass
class WebhookReceiver:
    """An HTTP server that records Alertmanager webhook notifications (JSON bodies)."""

    server: ThreadingHTTPServer
    notifications: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server.server_address[1]}/alerts"

    @classmethod
    @contextmanager
    def start(cls) -> Iterator[WebhookReceiver]:
        holder: list[WebhookReceiver] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with holder[0]._lock:
                    holder[0].notifications.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        receiver = cls(server)
        holder.append(receiver)
        thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
        thread.start()
        try:
            yield receiver
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification so far, in arrival order."""
        with self._lock:
            return [alert for n in self.notifications for alert in n.get("alerts", [])]


@dataclass
class AlertmanagerServer(_Server):
    """A running Alertmanager; use :meth:`start` (a context manager)."""

    @staticmethod
    def config_for(webhook_url: str) -> dict[str, Any]:
        return {
            "route": {
                "receiver": "test-webhook",
                "group_by": ["alertname", "model", "stream"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "test-webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": False}]}
            ],
        }

    @classmethod
    @contextmanager
    def start(cls, workdir: Path, webhook_url: str) -> Iterator[AlertmanagerServer]:
        workdir = Path(workdir) / "alertmanager"
        workdir.mkdir(parents=True, exist_ok=True)

        def launch(port: int) -> tuple[dict[str, Any], _Process]:
            config = cls.config_for(webhook_url)
            config_path = workdir / "alertmanager.yml"
            config_path.write_text(yaml.safe_dump(config, sort_keys=False))
            argv = [
                binary(ALERTMANAGER_BIN),
                f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{port}",
                "--cluster.listen-address=",  # no gossip port: a single, private instance
                "--log.level=info",
            ]
            return config, _Process(
                "alertmanager", argv, workdir / "alertmanager.log", f"http://{LOOPBACK}:{port}/-/ready"
            )

        with cls._serving(launch, workdir) as server:
            yield server

    def alerts(self) -> list[dict[str, Any]]:
        status, body = _http(f"{self.url}/api/v2/alerts")
        if status != 200:
            raise AssertionError(f"alertmanager /api/v2/alerts: HTTP {status}: {body[:300]!r}")
        return list(json.loads(body))
