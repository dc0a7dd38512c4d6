"""Secured endpoints: basic auth, bearer-token admin routes, TLS (and client certificates), secrets
kept out of logs and /metrics, Kafka SSL/SASL validation, and the container's non-root set-up."""

from __future__ import annotations

import base64
import logging
import re
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from monitor.config import ConfigError, load_settings
from monitor.daemon.service import Monitor
from monitor.server.security import hash_password, verify_password
from monitor.server.settings import http_security
from tests.support import daemons
from tests.support.paths import K8S, REPO
from tests.support.tls import self_signed
from tests.support.waiting import wait_until

TOKEN = "admin-token-0123456789-abcdef"
PASSWORD = "s3cret-scrape-password"
HASHED = hash_password(PASSWORD, iterations=100_000)


def synthetic_monitor(tmp_path: Path, **http: object) -> Monitor:
    settings = load_settings(
        overrides={
            "source": "synthetic",
            "synthetic": {"rate": 200, "models": [{"name": "m", "dim": 8}]},
            "http": {"host": "127.0.0.1", "port": 0, **http},
            "refresh_seconds": 0.2,
            "state_dir": str(tmp_path / "state"),
        }
    )
    monitor = Monitor(settings)
    monitor.http.add_route("/admin/ping", lambda env: (200, "text/plain", b"pong\n"), methods=("GET", "POST"))
    return monitor


def request(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=5, context=context
        ) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_password_hashes_verify_and_reject() -> None:
    assert verify_password(PASSWORD, HASHED)
    assert not verify_password(PASSWORD + "x", HASHED)
    assert not verify_password(PASSWORD, "sha256$abc")
    with pytest.raises(ValueError):
        hash_password("x", iterations=1000)


def test_basic_auth_protects_metrics_but_not_probes(tmp_path: Path) -> None:
    with daemons.running(synthetic_monitor(tmp_path, basic_auth_users={"prometheus": HASHED})) as monitor:
        base = f"http://127.0.0.1:{monitor.http.port}"
        assert request(base + "/metrics") == 401
        assert request(base + "/metrics", basic("prometheus", "wrong")) == 401
        assert request(base + "/metrics", basic("nobody", PASSWORD)) == 401
        assert request(base + "/metrics", {"Authorization": "Basic !!!notbase64"}) == 401
        assert request(base + "/metrics", basic("prometheus", PASSWORD)) == 200
        assert request(base + "/healthz") == 200
        with urllib.request.urlopen(
            urllib.request.Request(base + "/metrics", headers=basic("prometheus", PASSWORD))
        ) as r:
            text = r.read().decode()
        assert 'embmon_http_auth_failures_total{endpoint="metrics"} 4.0' in text


def test_admin_routes_need_the_bearer_token(tmp_path: Path) -> None:
    with daemons.running(synthetic_monitor(tmp_path, admin_token=TOKEN)) as monitor:
        url = f"http://127.0.0.1:{monitor.http.port}/admin/ping"
        assert request(url) == 401  # no token
        assert request(url, {"Authorization": "Bearer wrong-token"}) == 401
        assert request(url, {"Authorization": f"Bearer {TOKEN}x"}) == 401
        assert request(url, {"Authorization": f"Basic {TOKEN}"}) == 401
        assert request(url, {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert monitor.http.auth_failure_counts() == {"admin": 4}


def test_admin_routes_are_closed_without_a_configured_token(tmp_path: Path) -> None:
    with daemons.running(synthetic_monitor(tmp_path)) as monitor:
        url = f"http://127.0.0.1:{monitor.http.port}/admin/ping"
        assert request(url, {"Authorization": f"Bearer {TOKEN}"}) == 403
        assert request(f"http://127.0.0.1:{monitor.http.port}/metrics") == 200


def test_admin_token_from_a_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with daemons.running(synthetic_monitor(tmp_path, admin_token_file=str(token_file))) as monitor:
        url = f"http://127.0.0.1:{monitor.http.port}/admin/ping"
        assert request(url, {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert request(url, {"Authorization": "Bearer nope"}) == 401


def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with daemons.running(synthetic_monitor(tmp_path, tls_certfile=str(cert), tls_keyfile=str(key),
                                basic_auth_users={"prometheus": HASHED})) as monitor:
        port = monitor.http.port
        trusted = ssl.create_default_context(cafile=str(cert))
        assert request(f"https://127.0.0.1:{port}/metrics", basic("prometheus", PASSWORD), trusted) == 200
        assert request(f"https://127.0.0.1:{port}/metrics", None, trusted) == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            request(f"https://127.0.0.1:{port}/healthz", context=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            request(f"http://127.0.0.1:{port}/healthz")  # plaintext to a TLS port
        assert request(f"https://127.0.0.1:{port}/healthz", context=trusted) == 200  # still serving


def test_tls_client_certificates_when_a_client_ca_is_set(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")
    with daemons.running(synthetic_monitor(tmp_path, tls_certfile=str(cert), tls_keyfile=str(key),
                                tls_client_cafile=str(client_cert))) as monitor:
        url = f"https://127.0.0.1:{monitor.http.port}/healthz"
        anonymous = ssl.create_default_context(cafile=str(cert))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            request(url, context=anonymous)
        identified = ssl.create_default_context(cafile=str(cert))
        identified.load_cert_chain(str(client_cert), str(client_key))
        assert request(url, context=identified) == 200


def test_secrets_never_reach_logs_or_metrics(tmp_path: Path) -> None:
    kafka_password = "kafka-ssl-password-4242"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"http": {"basic_auth_users": {"prometheus": HASHED}}}))
    env = {"EMBMON_HTTP__ADMIN_TOKEN": TOKEN, "EMBMON_SOURCE": "synthetic",
           "EMBMON_SYNTHETIC__MODELS": '[{"name": "m", "dim": 8}]'}
    with daemons.process(
        "--config", str(config), "--state-dir", str(tmp_path / "state"), "--refresh-seconds", "0.3",
        "--log-level", "DEBUG", f"--kafka-option=ssl_password={kafka_password}",
        "--kafka-option=sasl_plain_password=sasl-pw-777", env=env, log=tmp_path / "daemon.log",
    ) as daemon:
        url = f"http://127.0.0.1:{daemon.port}"
        auth = basic("prometheus", PASSWORD)
        wait_until(lambda: request(f"{url}/metrics", auth) == 200, timeout=30, message="serving")
        wait_until(lambda: request(f"{url}/readyz") == 200, timeout=30, message="ready")
        request(f"{url}/admin/anything", {"Authorization": "Bearer " + TOKEN[:-1]})
        request(f"{url}/metrics", basic("prometheus", "wrong-" + PASSWORD))
        with urllib.request.urlopen(urllib.request.Request(f"{url}/metrics", headers=auth)) as r:
            scraped = r.read().decode()
    output = daemon.output()
    assert "settings:" in output and "embmon_records_total" in scraped  # we did capture both
    secret_hash = HASHED.split("$")[-1]
    for secret in (TOKEN, TOKEN[:-1], PASSWORD, kafka_password, "sasl-pw-777", secret_hash):
        assert secret not in output, secret
        assert secret not in scraped, secret
    assert re.search(r"'admin_token': '\*+'", output)


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ({"tls_certfile": "/nonexistent.crt"}, "tls_certfile and tls_keyfile must be set together"),
        ({"tls_certfile": "/nonexistent.crt", "tls_keyfile": "/nonexistent.key"}, "does not exist"),
        ({"basic_auth_users": {"u": "plaintext"}}, "basic_auth_users.u: must be pbkdf2_sha256"),
        ({"basic_auth_users": {"u": "pbkdf2_sha256$1000$salt$" + "A" * 44}}, "iterations must be"),
        ({"admin_token": "short"}, "at least 16 characters"),
    ],
)
def test_http_security_settings_are_validated(http: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_settings(overrides={"http": http})
    assert "plaintext" not in str(info.value)  # a mistyped password is not echoed


def test_kafka_ssl_and_sasl_settings_pass_through_and_are_validated(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    good = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "u",
            "sasl_plain_password": "p", "ssl_cafile": str(ca), "ssl_check_hostname": True}
    settings = load_settings(overrides={"kafka": {"options": good}})
    from monitor.sources.kafka.source import KafkaSource

    config = KafkaSource(settings.kafka).consumer_config()
    assert {k: config[k] for k in good} == good and config["enable_auto_commit"] is False
    assert settings.redacted()["kafka"]["options"]["sasl_plain_password"] == "***"
    bad = [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"}, "needs security_protocol SASL"),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_plain_username": "u"},
            "needs sasl_plain_username and sasl_plain_password",
        ),
        ({"security_protocol": "SSL", "ssl_cafile": str(tmp_path / "missing.pem")}, "does not exist"),
        ({"security_protocol": "TLS"}, "must be PLAINTEXT, SSL"),
        ({"enable_auto_commit": True}, "set by embedding-monitor itself"),
    ]
    for options, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_settings(overrides={"kafka": {"options": options}})


def test_container_runs_as_non_root_with_a_read_only_root_filesystem() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "EMBMON_STATE_DIR=/var/lib/embedding-monitor" in dockerfile
    checked = 0
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("Deployment", "StatefulSet"):
                continue
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            # a native sidecar is an init container
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                if "embedding-monitor" not in container.get("image", ""):
                    continue
                sc = container["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True and sc.get("allowPrivilegeEscalation") is False
                mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
                state = mounts.get("/var/lib/embedding-monitor")
                assert state is not None and not state.get("readOnly", False), path.name
                checked += 1
    assert checked >= 3  # the sidecar in both forms, the central deployment


def test_tls_files_openssl_cannot_load_are_named_with_their_setting(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "server")
    other_cert, other_key = self_signed(tmp_path, "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM at all\n")
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:pw", "-out", str(encrypted)],
                   check=True, capture_output=True)
    cases = [
        ({"tls_certfile": junk, "tls_keyfile": key}, f"http.tls_certfile: {junk} is not a PEM certificate"),
        ({"tls_certfile": key, "tls_keyfile": cert}, f"http.tls_certfile: {key} is not a PEM certificate"),
        ({"tls_certfile": cert, "tls_keyfile": junk}, f"http.tls_keyfile: {junk} is not a PEM private key"),
        (
            {"tls_certfile": cert, "tls_keyfile": other_key},
            f"http.tls_certfile {cert} and http.tls_keyfile {other_key}: cannot be loaded together",
        ),
        (
            {"tls_certfile": cert, "tls_keyfile": encrypted},
            f"http.tls_keyfile: {encrypted}: the private key is encrypted",
        ),
        (
            {"tls_certfile": cert, "tls_keyfile": key, "tls_client_cafile": junk},
            f"http.tls_client_cafile: {junk}: cannot load the CA certificates",
        ),
    ]
    for http, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_settings(overrides={"http": {k: str(v) for k, v in http.items()}})
    assert load_settings(overrides={"http": {"tls_certfile": str(other_cert), "tls_keyfile": str(other_key)}})


def test_admin_token_from_the_environment_with_a_trailing_newline_still_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMBMON_HTTP__ADMIN_TOKEN", TOKEN + " \n")  # as `export T=$(cat file)` or a YAML `|` leaves it
    with daemons.running(synthetic_monitor(tmp_path)) as monitor:
        url = f"http://127.0.0.1:{monitor.http.port}/admin/ping"
        assert request(url, {"Authorization": f"Bearer {TOKEN}"}) == 200


def test_credentials_on_plain_http_beyond_loopback_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="monitor.daemon.service"):
        with daemons.running(synthetic_monitor(tmp_path, host="0.0.0.0", admin_token=TOKEN)):  # noqa: S104 - the point
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("the admin token will cross the network in clear text: http.host is '0.0.0.0'" in w for w in warnings)
    assert all(TOKEN not in w for w in warnings)
    caplog.clear()
    cert, key = self_signed(tmp_path)
    for quiet in ({"host": "127.0.0.1", "admin_token": TOKEN}, {"admin_token": TOKEN, "tls_certfile": str(cert),
                                           "tls_keyfile": str(key)}):
        with caplog.at_level(logging.WARNING, logger="monitor.server.settings"):
            http_security(load_settings(overrides={"http": quiet}).http)  # what both daemons call at start
    assert "clear text" not in caplog.text


def test_a_token_in_the_query_string_is_masked_in_the_request_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="monitor.server.exporter"):
        with daemons.running(synthetic_monitor(tmp_path, admin_token=TOKEN)) as monitor:
            url = f"http://127.0.0.1:{monitor.http.port}/admin/ping?model=m&token={TOKEN}&api_key=k-{PASSWORD}"
            assert request(url) == 401
            wait_until(lambda: "/admin/ping?" in caplog.text, timeout=10, message="the request line is logged")
    line = next(r.getMessage() for r in caplog.records if "/admin/ping?" in r.getMessage())
    assert "/admin/ping?model=m&token=***&api_key=*** HTTP/1.1" in line and " 401 " in line
    assert TOKEN not in caplog.text and PASSWORD not in caplog.text
