"""The record sources' settings: ``kafka:``, ``file:`` and ``synthetic:`` (light: pydantic only).

kafka-python option names and their librdkafka equivalents, which ``kafka.options`` is checked
against, are in :mod:`monitor.sources.kafka.options` (no kafka import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from monitor.settings_base import MAX_DURATION_SECONDS, Section
from monitor.sources.kafka.options import CONSUMER_OPTIONS, LIBRDKAFKA_NAMES, RESERVED_LIBRDKAFKA, RESERVED_OPTIONS


class KafkaSettings(Section):
    """Where and how to consume. ``options`` passes any kafka-python consumer setting through
    (security_protocol, ssl_*, sasl_*, fetch sizes, ...), like kcat's ``-X``. ``client: confluent``
    consumes through librdkafka (the ``confluent`` extra) instead: ``options`` are translated to
    librdkafka properties (``sources/kafka/options.py``) and ``librdkafka`` passes any property through."""

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


class FileSourceSettings(Section):
    """Replay a JSONL file of events or an ``.npy`` (n, d) matrix, for offline use and tests."""

    path: Path | None = None
    model: str = "default"  # for .npy, which carries no model name
    stream: str = "default"
    rate: float = Field(0.0, ge=0, description="records per second; 0 = as fast as possible")
    batch_size: int = Field(1000, ge=1, le=100_000)
    loop: bool = False


class SyntheticModel(Section):
    name: str
    dim: int = Field(384, ge=2, le=8192)


class SyntheticPhase(Section):
    """One step of a scripted scenario: the distribution the generator draws from, for a while."""

    kind: Literal["healthy", "anisotropic", "collapsed", "shifted", "swapped", "topic_shift", "invalid"] = "healthy"
    seconds: float = Field(30.0, gt=0, le=MAX_DURATION_SECONDS)


class SyntheticInteractions(Section):
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


class SyntheticSourceSettings(Section):
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
