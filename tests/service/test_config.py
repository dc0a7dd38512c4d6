"""Settings: YAML < environment < CLI flags; bad values name their field."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaConsumer

from monitor.config import ConfigError, load_settings, nested_override, parse_kafka_option
from monitor.kafka_options import CONSUMER_OPTIONS, RESERVED_OPTIONS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_defaults_are_valid() -> None:
    s = load_settings()
    assert s.source == "kafka"
    assert s.window.seconds == 900 and s.window.reservoir_size == 10_000
    assert s.refresh_seconds == 15 and s.limits.max_models == 20
    assert s.http.port == 9464


def test_precedence_yaml_then_env_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "kafka:\n  group_id: from-yaml\n  embeddings_topic: yaml-topic\nrefresh_seconds: 5\n")
    assert load_settings(path).kafka.group_id == "from-yaml"
    monkeypatch.setenv("EMBMON_KAFKA__GROUP_ID", "from-env")
    s = load_settings(path)
    assert s.kafka.group_id == "from-env"
    assert s.kafka.embeddings_topic == "yaml-topic"  # nested merge keeps the YAML sibling
    s = load_settings(path, {"kafka": {"group_id": "from-flag"}})
    assert s.kafka.group_id == "from-flag"
    assert s.kafka.embeddings_topic == "yaml-topic"
    assert s.refresh_seconds == 5


def test_bootstrap_servers_from_comma_list() -> None:
    s = load_settings(overrides={"kafka": {"bootstrap_servers": "a:9092, b:9093"}})
    assert s.kafka.bootstrap_servers == ["a:9092", "b:9093"]


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("window:\n  seconds: -1\n", "window.seconds"),
        ("refresh_seconds: soon\n", "refresh_seconds"),
        ("kafka:\n  bootstrap_servers: nohostport\n", "kafka.bootstrap_servers"),
        ("source: carrier-pigeon\n", "source"),
        ("limits:\n  max_models: 0\n", "limits.max_models"),
        ("windw:\n  seconds: 10\n", "windw"),
        ("quality:\n  dead_dimension_ratio: -0.5\n", "quality.dead_dimension_ratio"),
        ("kafka:\n  options:\n    not_a_setting: 1\n", "kafka.options"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, yaml_text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, yaml_text))
    assert field in str(err.value)


def test_file_source_requires_path() -> None:
    with pytest.raises(ConfigError, match="file.path"):
        load_settings(overrides={"source": "file"})


def test_not_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "kafka: [unclosed\n"))
    with pytest.raises(ConfigError, match="does-not-exist"):
        load_settings(tmp_path / "does-not-exist.yaml")


def test_kafka_security_settings_pass_through_and_are_validated(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    options = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "monitor",
        "sasl_plain_password": "hunter2",
        "ssl_cafile": str(ca),
    }
    s = load_settings(overrides={"kafka": {"options": options}})
    from monitor.sources.kafka import KafkaSource

    config = KafkaSource(s.kafka).consumer_config()
    assert config["security_protocol"] == "SASL_SSL" and config["sasl_plain_password"] == "hunter2"
    assert config["enable_auto_commit"] is False
    assert "hunter2" not in str(s.redacted())
    with pytest.raises(ConfigError, match="sasl_plain_username and sasl_plain_password"):
        load_settings(overrides={"kafka": {"options": {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}}})
    with pytest.raises(ConfigError, match="ssl_cafile"):
        load_settings(overrides={"kafka": {"options": {"security_protocol": "SSL", "ssl_cafile": "/nope.pem"}}})
    with pytest.raises(ConfigError, match="enable_auto_commit"):
        load_settings(overrides={"kafka": {"options": {"enable_auto_commit": True}}})


def test_kafka_option_names_match_the_installed_kafka_python() -> None:
    """Settings check options against a static copy (no kafka import when they load); keep it current."""
    assert CONSUMER_OPTIONS == set(KafkaConsumer.DEFAULT_CONFIG)
    assert RESERVED_OPTIONS <= CONSUMER_OPTIONS


def test_parse_kafka_option() -> None:
    assert parse_kafka_option("fetch_max_bytes=1048576") == ("fetch_max_bytes", 1048576)
    assert parse_kafka_option("security.protocol=SSL") == ("security_protocol", "SSL")
    assert parse_kafka_option("check_crcs=false") == ("check_crcs", False)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_kafka_option("novalue")


def test_nested_override_drops_unset_flags() -> None:
    assert nested_override([("kafka.group_id", "g"), ("http.port", None), ("source", "file")]) == {
        "kafka": {"group_id": "g"},
        "source": "file",
    }
