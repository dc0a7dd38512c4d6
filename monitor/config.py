"""One settings object for the daemon: YAML file < EMBMON_* environment < CLI flags.

Build it with :func:`load_settings` from ``main`` (never at import time) so tests build their own.
Any invalid value raises :class:`ConfigError`, whose message names the offending field; the CLI
turns it into exit status 2.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from monitor.canary.settings import CanarySettings
from monitor.daemon.settings import CheckpointSettings
from monitor.decoding.labels import check_label_value
from monitor.decoding.settings import DecodingSettings, LimitSettings
from monitor.drift.settings import DaemonDriftSettings
from monitor.errors import ConfigError  # re-exported: ``monitor.config.ConfigError``
from monitor.index.settings import IndexSettings
from monitor.quality.settings import IntrinsicSettings
from monitor.redaction import looks_secret, mask_query_secrets
from monitor.retrieval.settings import ProbeSettings
from monitor.scaleout.settings import ScaleOutSettings
from monitor.server.settings import HttpSettings
from monitor.serving.settings import ServingSettings
from monitor.settings_base import Section as _Section
from monitor.sources.settings import (
    FileSourceSettings,
    KafkaSettings,
    SyntheticSourceSettings,
)
from monitor.state.settings import WindowSettings

ENV_PREFIX = "EMBMON_"


class ModelSettings(_Section):
    """Optional per-model declarations; an undeclared model's dimension is fixed by its first record."""

    dim: int | None = Field(None, ge=2)


class Settings(BaseSettings):
    """Everything the daemon can be told. See docs/usage.md "Configuration" for the YAML layout."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True,
        allow_inf_nan=False,
    )

    source: Literal["kafka", "file", "synthetic"] = "kafka"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    file: FileSourceSettings = Field(default_factory=FileSourceSettings)
    synthetic: SyntheticSourceSettings = Field(default_factory=SyntheticSourceSettings)
    window: WindowSettings = Field(default_factory=WindowSettings)
    quality: IntrinsicSettings = Field(default_factory=IntrinsicSettings)
    probes: ProbeSettings = Field(default_factory=ProbeSettings)
    drift: DaemonDriftSettings = Field(default_factory=DaemonDriftSettings)  # docs/drift.md
    canaries: CanarySettings = Field(default_factory=CanarySettings)  # docs/canaries.md
    index: IndexSettings = Field(default_factory=IndexSettings)  # index probes: docs/index.md
    serving: ServingSettings = Field(default_factory=ServingSettings)  # the serving probe: docs/canaries.md
    limits: LimitSettings = Field(default_factory=LimitSettings)
    decoding: DecodingSettings = Field(default_factory=DecodingSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    scale_out: ScaleOutSettings = Field(default_factory=ScaleOutSettings)  # replicas + reducer: docs/deployment.md
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    refresh_seconds: float = Field(15.0, gt=0, le=3600)
    state_dir: Path = Field(default_factory=lambda: default_state_dir())
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="where statistics, intrinsic metrics and probes run (monitor/devices.py): cpu = numpy, "
        "torch never imported; auto = CUDA only if an NVIDIA driver is loaded (a file check, before any "
        "torch import) and torch sees a device, else cpu; cuda = ask torch, else cpu with one warning",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shutdown_timeout_seconds: float = Field(8.0, gt=0, le=60)
    seed: int = 0

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cross_checks(self) -> Settings:
        if self.source == "file" and self.file.path is None:
            raise ValueError("file.path is required when source is 'file'")
        if self.kafka.interactions_topic == self.kafka.embeddings_topic:
            raise ValueError("kafka.interactions_topic must differ from kafka.embeddings_topic")
        for name in self.models:
            check_label_value(name, "models:")
        return self

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with secrets masked, safe to log."""
        return _redact(self.model_dump(mode="json"))


def default_state_dir() -> Path:
    """Where references and checkpoints live unless ``state_dir`` says: per user, never the working
    directory (``$XDG_STATE_HOME/embedding-monitor``, else ``~/.local/state/embedding-monitor``).
    Containers set ``EMBMON_STATE_DIR`` to a volume."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "embedding-monitor"


def _redact(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _redact(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, key) for v in value]
    if value is not None and looks_secret(key):
        return "***"
    return mask_query_secrets(value) if isinstance(value, str) else value  # e.g. a URL's ?api_key=


def parse_kafka_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from ``--kafka-option``; VALUE is read as JSON when it parses (numbers, booleans),
    except for secrets (``sasl_plain_password=12345`` stays the string kafka-python needs).

    The error for a malformed option never shows what follows a secret-looking key: a typo such as
    ``sasl_plain_password:hunter2`` would otherwise print the password to the terminal and the logs.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        name = re.split(r"[\s:]", text.strip(), maxsplit=1)[0] if not sep else ""
        shown = text if name and not looks_secret(name) else f"{name or '='}..."
        raise ConfigError(f"kafka.options: {shown!r} is not KEY=VALUE")
    key = key.strip().replace(".", "_")
    if looks_secret(key):
        return key, raw
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = raw
    return key, value


def load_settings(
    config_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Settings:
    """Settings from a YAML file, the environment and explicit overrides (highest precedence).

    ``overrides`` is a nested dict, e.g. ``{"kafka": {"group_id": "g"}}``; the CLI builds it.
    ``defaults`` sit below the YAML file (the demo's presets use it).

    The file is read here, not by pydantic-settings' ``YamlConfigSettingsSource``: that source
    silently ignores a missing file (a typo in ``--config`` would run on defaults) and fails with
    a bare ``TypeError`` on a top-level list, where this names the file and the problem.
    """
    yaml_data = {} if config_path is None else read_config_file(Path(config_path))
    yaml_data = deep_merge(dict(defaults or {}), yaml_data)

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _DictSource(settings_cls, yaml_data))

    try:
        settings = _Loaded(**dict(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    except (SettingsError, RecursionError) as exc:  # an EMBMON_* section, list or mapping that is not JSON
        raise ConfigError(_environment_problem(exc)) from None
    _check_http_files(settings.http)
    return settings


def _check_http_files(http: HttpSettings) -> None:
    """Read the admin token file and load the TLS files now, so that a short, empty or binary token or
    a file that is not PEM fails like any other setting (exit 2, one line naming the setting and the
    file), before the daemon logs or binds anything. The daemon reads them again when it starts."""
    from monitor.server.security import read_token_file, server_ssl_context

    if http.admin_token_file is not None:
        read_token_file(http.admin_token_file)
    if http.tls_certfile is not None and http.tls_keyfile is not None:
        server_ssl_context(http.tls_certfile, http.tls_keyfile, http.tls_client_cafile)


def read_config_file(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``. Anything else raises :class:`ConfigError` naming the file, and for
    a syntax error its line and column, never the line's text: that line may hold a password."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start})") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = ": ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"config file {path}: not valid YAML: {where}{what}") from None
    except yaml.reader.ReaderError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: unacceptable character #x{exc.character:04x} "
                          f"at offset {exc.position}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML ({type(exc).__name__})") from None
    except RecursionError:  # PyYAML's composer recurses once per level: [[[[... or {a: {a: ...
        raise ConfigError(f"config file {path}: nested too deeply to be a settings file") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return loaded


def _environment_problem(exc: Exception) -> str:
    """Which EMBMON_* variable pydantic-settings could not read as JSON, by name only (the value may be
    a secret). Its own message names the top-level field and no variable."""
    match = re.search(r'field "([^"]+)"', str(exc))
    field = match.group(1) if match else ""
    names = sorted(
        name for name, value in os.environ.items()
        if name.upper().startswith(ENV_PREFIX + field.upper()) and _reads_as_json(name) and not _is_json(value)
    )
    shown = ", ".join(names) or f"{ENV_PREFIX}{field.upper()}..."
    return f"environment: {shown}: not valid JSON (a section, list or mapping is given as JSON in the environment)"


def _reads_as_json(variable: str) -> bool:
    """Whether ``EMBMON_A__B`` addresses a section, list or mapping (read as JSON), not a value in one."""
    annotation: Any = Settings
    for part in variable.upper().removeprefix(ENV_PREFIX).lower().split("__"):
        model = next((a for a in _alternatives(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
    return any(
        get_origin(a) in (list, dict) or (isinstance(a, type) and issubclass(a, (BaseModel, list, dict)))
        for a in _alternatives(annotation)
    )


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    """``X | Y | None`` -> (X, Y, None); anything else -> (annotation,)."""
    return get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


class _DictSource(PydanticBaseSettingsSource):
    """The parsed YAML file as a settings source (lowest precedence)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self._data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the dotted field path."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(settings)"
        message = err["msg"].removeprefix("Value error, ")
        lines.append(f"{path}: {message}")
    return "invalid configuration: " + "; ".join(lines)


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, merging nested mappings key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def nested_override(dotted: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``[("kafka.group_id", "g")]`` -> ``{"kafka": {"group_id": "g"}}``; None values are dropped."""
    out: dict[str, Any] = {}
    for path, value in dotted:
        if value is None:
            continue
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out
