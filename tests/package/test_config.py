"""Settings: YAML < environment < CLI flags; bad values name their field."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from kafka import KafkaConsumer
from pydantic import BaseModel

from monitor.config import ConfigError, Settings, deep_merge, load_settings, nested_override, parse_kafka_option
from monitor.settings_base import MAX_DURATION_SECONDS
from monitor.sources.kafka.options import CONSUMER_OPTIONS, RESERVED_OPTIONS


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
    from monitor.sources.kafka.source import KafkaSource

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


# --- Non-finite and absurd numbers, unreadable files, secrets in errors ---------------


def _sections(model: type[BaseModel] = Settings) -> Iterator[type[BaseModel]]:
    """Every settings class reachable from ``Settings``: nested, optional, in lists and in mappings."""
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        yield cls
        for field in cls.model_fields.values():
            todo.extend(_models_in(field.annotation))


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _has_float(annotation: Any) -> bool:
    return annotation is float or any(_has_float(arg) for arg in get_args(annotation))


def _float_leaves(value: Any, path: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _float_leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, float):
        yield path


def test_every_settings_section_refuses_non_finite_numbers() -> None:
    sections = list(_sections())
    assert len(sections) > 30  # the walk reaches the feature modules' sections
    lax = [cls.__qualname__ for cls in sections if cls.model_config.get("allow_inf_nan") is not False]
    assert lax == [], "use monitor.settings_base.Section (or allow_inf_nan=False) for these"


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_every_float_setting_with_a_value_refuses_inf_and_nan(bad: float) -> None:
    base = {"synthetic": {"interactions": {}}, "drift": {"online": {"detectors": {"adwin": {"delta": 1e-4}}}}}
    dumped = load_settings(overrides=base).model_dump(mode="python")
    paths = list(_float_leaves(dumped))
    assert {"window.seconds", "refresh_seconds", "drift.online.detectors.adwin.delta",
            "synthetic.interactions.rate", "quality.collapse_mean_cosine"} <= set(paths)
    for path in paths:
        with pytest.raises(ConfigError) as err:
            load_settings(overrides=deep_merge(base, nested_override([(path, bad)])))
        assert path in str(err.value).replace(": ", "."), (path, str(err.value))


def test_infinity_is_refused_from_yaml_environment_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for text in ("window:\n  seconds: .inf\n", "window:\n  seconds: .nan\n"):
        with pytest.raises(ConfigError, match=r"window\.seconds: Input should be a finite number"):
            load_settings(write(tmp_path, text))
    monkeypatch.setenv("EMBMON_DRIFT__INTERVAL_SECONDS", "Infinity")
    with pytest.raises(ConfigError, match=r"drift\.interval_seconds"):
        load_settings()
    monkeypatch.delenv("EMBMON_DRIFT__INTERVAL_SECONDS")
    with pytest.raises(ConfigError, match=r"drift\.false_alarm_every: .* is not a finite duration"):
        load_settings(overrides={"drift": {"false_alarm_every": "9" * 400 + "d"}})


def test_every_duration_has_an_upper_bound() -> None:
    unbounded = []
    for cls in _sections():
        for name, field in cls.model_fields.items():
            if not (name.endswith("seconds") and _has_float(field.annotation)):
                continue
            limits = [getattr(m, "le", None) or getattr(m, "lt", None) for m in field.metadata]
            if not any(limit is not None and limit <= MAX_DURATION_SECONDS for limit in limits):
                unbounded.append(f"{cls.__qualname__}.{name}")
    assert unbounded == []
    with pytest.raises(ConfigError, match=r"window\.seconds: Input should be less than or equal to 2592000"):
        load_settings(overrides={"window": {"seconds": 1e300}})
    assert load_settings(overrides={"window": {"seconds": MAX_DURATION_SECONDS}}).window.seconds == MAX_DURATION_SECONDS


def test_a_config_file_that_is_not_utf8_or_nested_too_deeply_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("kafka:\n  group_id: caf\xe9\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=rf"config file {re.escape(str(path))}: not UTF-8 text \(byte 0xe9 at offset 22\)"
    ):
        load_settings(path)
    for opener in ("[", "{a: "):
        path = write(tmp_path, opener * 10_000)
        with pytest.raises(ConfigError, match=rf"config file {re.escape(str(path))}: nested too deeply"):
            load_settings(path)
    path.write_bytes(b"\xef\xbb\xbfrefresh_seconds: 7\n")  # a UTF-8 byte-order mark is fine
    assert load_settings(path).refresh_seconds == 7


def test_a_yaml_error_gives_line_and_column_but_never_the_lines_text(tmp_path: Path) -> None:
    path = write(tmp_path, "kafka:\n  options:\n    sasl_plain_password: hunter2: x\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    message = str(err.value)
    assert message == f"config file {path}: not valid YAML: line 3, column 33: mapping values are not allowed here"
    assert "hunter2" not in message and "\n" not in message
    path = write(tmp_path, 'kafka:\n  options:\n    sasl_plain_password: "hunter2\n')
    with pytest.raises(ConfigError, match="line 4, column 1: while scanning a quoted scalar") as err:
        load_settings(path)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("value", ["{not json", "not json", "[" * 10_000])
def test_environment_json_that_does_not_parse_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("EMBMON_KAFKA__OPTIONS", value)
    monkeypatch.setenv("EMBMON_KAFKA__GROUP_ID", "plain text is fine here")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == ("environment: EMBMON_KAFKA__OPTIONS: not valid JSON (a section, list or mapping "
                              "is given as JSON in the environment)")


def test_a_malformed_kafka_option_never_echoes_a_secret() -> None:
    for text in ("sasl_plain_password:hunter2", "ssl_password hunter2", "=hunter2"):
        with pytest.raises(ConfigError, match="is not KEY=VALUE") as err:
            parse_kafka_option(text)
        assert "hunter2" not in str(err.value), text
    with pytest.raises(ConfigError, match="'security_protocol:SSL' is not KEY=VALUE"):
        parse_kafka_option("security_protocol:SSL")  # nothing secret: shown whole, to help
    assert parse_kafka_option("sasl_plain_password=12345") == ("sasl_plain_password", "12345")  # stays a string
    assert parse_kafka_option("fetch_max_bytes=" + "[" * 10_000)[1] == "[" * 10_000


def test_kafka_secrets_from_the_environment_merge_with_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented alternative to ``--kafka-option sasl_plain_password=...`` (visible in ``ps``)."""
    monkeypatch.setenv("EMBMON_KAFKA__OPTIONS__SASL_PLAIN_USERNAME", "monitor")
    monkeypatch.setenv("EMBMON_KAFKA__OPTIONS__SASL_PLAIN_PASSWORD", "12345")
    flags = dict(parse_kafka_option(t) for t in ("security_protocol=SASL_SSL", "sasl_mechanism=PLAIN"))
    s = load_settings(overrides={"kafka": {"options": flags}})
    assert s.kafka.options == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                               "sasl_plain_username": "monitor", "sasl_plain_password": "12345"}
    assert s.redacted()["kafka"]["options"]["sasl_plain_password"] == "***"


def test_redacted_settings_hide_secret_headers_and_query_parameters(tmp_path: Path) -> None:
    (tmp_path / "golden.jsonl").write_text("")
    golden = {"name": "g", "file": str(tmp_path / "golden.jsonl"), "model": "m", "retriever": {
        "kind": "http", "url": "https://search.example/q?api_key=abc123&k=10", "method": "GET",
        "headers": {"Authorization": "Bearer xyz789", "X-Request-Source": "monitor"}, "ids_path": "ids"}}
    redacted = str(load_settings(overrides={"probes": {"golden": [golden]}}).redacted())
    assert "abc123" not in redacted and "xyz789" not in redacted
    assert "k=10" in redacted and "'X-Request-Source': 'monitor'" in redacted


def test_the_admin_token_is_stripped_and_then_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "admin-token-0123456789-abcdef"
    monkeypatch.setenv("EMBMON_HTTP__ADMIN_TOKEN", f" {token}\n")
    assert load_settings().http.admin_token.get_secret_value() == token  # type: ignore[union-attr]
    monkeypatch.setenv("EMBMON_HTTP__ADMIN_TOKEN", "short-token" + " " * 10 + "\n")
    with pytest.raises(ConfigError, match=r"http: admin_token must be at least 16 characters"):
        load_settings()
