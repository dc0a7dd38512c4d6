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
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from monitor.canary.settings import CanarySettings
from monitor.decoding.labels import LABEL_VALUE_RE
from monitor.drift.settings import DaemonDriftSettings
from monitor.errors import ConfigError  # re-exported: ``monitor.config.ConfigError``
from monitor.quality.settings import IntrinsicSettings
from monitor.retrieval.settings import ProbeSettings
from monitor.scaleout.settings import ScaleOutSettings
from monitor.server.security import looks_secret, mask_query_secrets
from monitor.serving.settings import ServingSettings
from monitor.settings_base import MAX_DURATION_SECONDS
from monitor.settings_base import Section as _Section
from monitor.sources.kafka_options import CONSUMER_OPTIONS, LIBRDKAFKA_NAMES, RESERVED_LIBRDKAFKA, RESERVED_OPTIONS

ENV_PREFIX = "EMBMON_"


class KafkaSettings(_Section):
    """Where and how to consume. ``options`` passes any kafka-python consumer setting through
    (security_protocol, ssl_*, sasl_*, fetch sizes, ...), like kcat's ``-X``. ``client: confluent``
    consumes through librdkafka (the ``confluent`` extra) instead: ``options`` are translated to
    librdkafka properties (``sources/kafka_options.py``) and ``librdkafka`` passes any property through."""

    client: Literal["kafka-python", "confluent"] = "kafka-python"
    librdkafka: dict[str, str | int | float | bool] = Field(default_factory=dict)

    bootstrap_servers: list[str] = Field(default_factory=lambda: ["localhost:9092"])
    embeddings_topic: str = "embeddings"
    interactions_topic: str | None = None
    group_id: str = "embedding-monitor"
    client_id: str = "embedding-monitor"
    auto_offset_reset: Literal["earliest", "latest"] = "latest"
    max_poll_records: int = Field(2000, ge=1, le=100_000)
    poll_timeout_seconds: float = Field(0.5, gt=0, le=30)
    commit_interval_seconds: float = Field(30.0, gt=0, le=86_400)  # commits follow checkpoints (docs/operations.md)
    default_stream: str = "default"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("bootstrap_servers", mode="before")
    @classmethod
    def _split_servers(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [s.strip() for s in value.split(",") if s.strip()]
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("at least one host:port is required")
        for server in value:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{server!r} is not host:port")
        return value

    @field_validator("options")
    @classmethod
    def _check_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in RESERVED_OPTIONS:
                raise ValueError(f"{key!r} is set by embedding-monitor itself; use the dedicated setting")
            if key not in CONSUMER_OPTIONS:
                raise ValueError(f"{key!r} is not a kafka-python consumer setting")
        sasl = value.get("sasl_mechanism")
        protocol = value.get("security_protocol", "PLAINTEXT")
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ValueError(f"security_protocol {protocol!r} must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
        if sasl is not None and not str(protocol).startswith("SASL"):
            raise ValueError("sasl_mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL")
        if str(protocol).startswith("SASL") and sasl is None:
            raise ValueError(f"security_protocol {protocol} needs sasl_mechanism")
        if sasl in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            value.get("sasl_plain_username") and value.get("sasl_plain_password")
        ):
            raise ValueError(f"sasl_mechanism {sasl} needs sasl_plain_username and sasl_plain_password")
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile"):
            if key in value and not Path(str(value[key])).is_file():
                raise ValueError(f"{key}: file {value[key]!r} does not exist")
        return value

    @field_validator("librdkafka")
    @classmethod
    def _check_librdkafka(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(RESERVED_LIBRDKAFKA.intersection(value))
        if reserved:
            raise ValueError(f"{reserved[0]!r} is set by embedding-monitor itself; use the dedicated setting")
        return value

    @model_validator(mode="after")
    def _check_client(self) -> KafkaSettings:
        if self.client != "confluent":
            if self.librdkafka:
                raise ValueError("librdkafka: properties only read with client: confluent")
            return self
        for key in self.options:
            if key not in LIBRDKAFKA_NAMES:
                raise ValueError(f"options.{key} has no librdkafka equivalent (client: confluent); "
                                 "set the librdkafka property under kafka.librdkafka")
        return self


class FileSourceSettings(_Section):
    """Replay a JSONL file of events or an ``.npy`` (n, d) matrix, for offline use and tests."""

    path: Path | None = None
    model: str = "default"  # for .npy, which carries no model name
    stream: str = "default"
    rate: float = Field(0.0, ge=0, description="records per second; 0 = as fast as possible")
    batch_size: int = Field(1000, ge=1, le=100_000)
    loop: bool = False


class SyntheticModel(_Section):
    name: str
    dim: int = Field(384, ge=2, le=8192)


class SyntheticPhase(_Section):
    """One step of a scripted scenario: the distribution the generator draws from, for a while."""

    kind: Literal["healthy", "anisotropic", "collapsed", "shifted", "swapped", "topic_shift", "invalid"] = "healthy"
    seconds: float = Field(30.0, gt=0, le=MAX_DURATION_SECONDS)


class SyntheticInteractions(_Section):
    """Interaction events over a synthetic catalog, so the retrieval probes have evidence (demo, tests).

    The catalog's documents (healthy draws, fixed at start) are re-emitted as JSON events with ids
    on ``catalog_stream``; each query is served the exact top ``k`` of the catalog with a share
    ``ann_miss_ratio`` of the results replaced (a known ANN recall), and clicks fall on results
    with a position bias.
    """

    rate: float = Field(20.0, gt=0, le=100_000, description="interaction events per second per model")
    catalog_size: int = Field(500, ge=20, le=100_000)
    catalog_stream: str = "catalog"
    catalog_period_seconds: float = Field(
        2.0, gt=0, le=86_400, description="every catalog document is re-emitted this often"
    )
    k: int = Field(10, ge=1, le=100)
    ann_miss_ratio: float = Field(0.05, ge=0, le=1)
    zero_result_ratio: float = Field(0.02, ge=0, le=1)


class SyntheticSourceSettings(_Section):
    """A generator of realistic-looking embeddings with scripted incidents (the demo)."""

    models: list[SyntheticModel] = Field(default_factory=lambda: [SyntheticModel(name="demo-model")])
    stream: str = "documents"
    rate: float = Field(2000.0, gt=0, description="records per second per model")
    batch_size: int = Field(200, ge=1, le=100_000)
    phases: list[SyntheticPhase] = Field(default_factory=lambda: [SyntheticPhase()])
    loop: bool = True
    seed: int = 0
    interactions: SyntheticInteractions | None = None  # off: embeddings only
    canaries: int = Field(0, ge=0, le=1000, description="fixed canary items per model (ids canary-0...), 0 = none")
    canary_period_seconds: float = Field(5.0, gt=0, le=86_400, description="every canary is re-sent this often")
    ids: bool = Field(
        False, description="send the traffic as JSON events with ids (doc-N, topic-N for topic_shift's new topic), "
        "so drift explanations name exemplars; binary batches without ids otherwise",
    )


class WindowSettings(_Section):
    """The sliding window metrics are computed over (see docs/metrics.md, "Window semantics")."""

    seconds: float = Field(900.0, gt=0, le=MAX_DURATION_SECONDS)
    subwindows: int = Field(10, ge=1, le=120)
    reservoir_size: int = Field(10_000, ge=10, le=1_000_000)
    gram_precision: Literal["float64", "float32"] = Field(
        "float64",
        description="Arithmetic of the per-batch second-moment product: float32 is ~2x faster on "
        "shifted rows; its measured error is in docs/benchmarks.md (float64 is exact)",
    )


class DecodingSettings(_Section):
    """Where JSON embedding events are parsed (docs/operations.md, "Load and backpressure")."""

    json_workers: int = Field(
        1,
        ge=0,
        le=16,
        description="worker processes that parse JSON embedding messages off the GIL kafka-python "
        "needs; 0 parses on the poll thread",
    )


class LimitSettings(_Section):
    """Budgets that keep memory and label cardinality bounded whatever the input."""

    max_models: int = Field(20, ge=1, le=1000)
    max_streams_per_model: int = Field(10, ge=1, le=1000)
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_dimension: int = Field(8192, ge=2)
    max_rows_per_message: int = Field(100_000, ge=1)


_HTTP_BUFFER_BUDGET = 256 * 2**20  # what request buffers may take at most (the sidecar's limit is 1.5 GiB)


class HttpSettings(_Section):
    """The HTTP port. TLS, basic auth and the admin token are described in docs/operations.md."""

    host: str = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the pod from outside (docs/deployment.md)
    port: int = Field(9464, ge=0, le=65535)
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    tls_client_cafile: Path | None = None  # when set, clients must present a certificate it signed
    # user -> "pbkdf2_sha256$<iterations>$<salt>$<base64 sha256 key>" (python -m monitor.server.security hash)
    basic_auth_users: dict[str, SecretStr] = Field(default_factory=dict)
    admin_token: SecretStr | None = None  # bearer token for /admin/* routes
    admin_token_file: Path | None = None  # or a file holding it (Kubernetes secret volume)
    # what one client can hold (docs/operations.md, "Connection limits"; monitor/server/http_server.py)
    max_connections: int = Field(
        512, ge=1, le=100_000,
        description="open connections at most (Prometheus' --web.max-connections default); at the cap a new one "
        "evicts the connection that has waited longest without a request in service",
    )
    max_header_bytes: int = Field(65_536, ge=1024, le=16 * 2**20, description="a request head larger gets 431")
    read_timeout_seconds: float = Field(
        10.0, gt=0, le=3600,
        description="a request's head and body must arrive within this of the connection's start (or of the "
        "request's first byte on a kept-alive connection); TLS handshakes too",
    )
    idle_timeout_seconds: float = Field(
        120.0, gt=0, le=86_400, description="a kept-alive connection is closed after this long without a request",
    )
    write_timeout_seconds: float = Field(30.0, gt=0, le=3600, description="a response must be taken within this")
    workers: int = Field(4, ge=1, le=64, description="threads that run requests (connections need none)")
    auth_failures_before_backoff: int = Field(
        5, ge=0, le=1_000_000,
        description="basic-auth failures from one address before it gets 429 for auth_backoff_seconds (0: never)",
    )
    auth_backoff_seconds: float = Field(60.0, gt=0, le=86_400)
    auth_concurrent_verifications: int = Field(
        1, ge=1, le=64, description="PBKDF2 checks at once (one core each); more get 429 at once",
    )

    @field_validator("admin_token", mode="before")
    @classmethod
    def _strip_token(cls, value: Any) -> Any:
        # `echo token > file`, `$(cat file)` and YAML block scalars leave a newline or spaces that no
        # client sends: kept, the right token would always get 401. read_token_file strips alike.
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_security(self) -> HttpSettings:
        from monitor.server.security import check_password_hash_format

        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile must be set together")
        if self.tls_client_cafile is not None and self.tls_certfile is None:
            raise ValueError("tls_client_cafile needs tls_certfile and tls_keyfile")
        for name in ("tls_certfile", "tls_keyfile", "tls_client_cafile", "admin_token_file"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: file {str(path)!r} does not exist")
        for user, hashed in self.basic_auth_users.items():
            if not user or ":" in user:
                raise ValueError(f"basic_auth_users: user name {user!r} must be non-empty and without ':'")
            problem = check_password_hash_format(hashed.get_secret_value())
            if problem:
                raise ValueError(f"basic_auth_users.{user}: {problem}")
        if self.admin_token is not None and self.admin_token_file is not None:
            raise ValueError("set admin_token or admin_token_file, not both")
        if self.admin_token is not None and len(self.admin_token.get_secret_value()) < 16:
            raise ValueError("admin_token must be at least 16 characters (surrounding whitespace is stripped)")
        return self

    @model_validator(mode="after")
    def _check_buffers(self) -> HttpSettings:
        from monitor.server.http_server import MAX_BODY_BYTES

        buffered = self.max_connections * (self.max_header_bytes + MAX_BODY_BYTES)
        if buffered > _HTTP_BUFFER_BUDGET:
            raise ValueError(
                f"max_connections × (max_header_bytes + {MAX_BODY_BYTES // 1024} KiB body) = "
                f"{buffered / 2**20:.0f} MiB of request buffers, over {_HTTP_BUFFER_BUDGET // 2**20} MiB: "
                "lower max_connections or max_header_bytes"
            )
        return self


class CheckpointSettings(_Section):
    """Periodic, atomic checkpoints of all state plus the Kafka offsets it reflects (docs/operations.md)."""

    enabled: bool | None = None  # None: on for the Kafka source, off for file/synthetic replays
    interval_seconds: float = Field(30.0, gt=0, le=86_400)
    max_bytes: int = Field(
        16 * 2**30, ge=2**20,
        description="a checkpoint file larger than this is refused at start-up without being read (like a "
        "corrupt one); about 55 MB per (model, stream) at d = 768 with the default window (docs/operations.md)",
    )


class ModelSettings(_Section):
    """Optional per-model declarations; an undeclared model's dimension is fixed by its first record."""

    dim: int | None = Field(None, ge=2)


class Settings(BaseSettings):
    """Everything the daemon can be told. See README "Configuration" for the YAML layout."""

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
            if not LABEL_VALUE_RE.match(name):
                raise ValueError(f"models: {name!r} is not a valid label value ({LABEL_VALUE_RE.pattern})")
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
