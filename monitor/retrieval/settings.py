"""Retrieval-probe settings (nested as ``probes:`` in the daemon's Settings).

Each probe kind has a list of probe definitions; every probe has a unique, label-safe ``name``
(the ``probe`` label of everything it exports), its own ``interval_seconds`` and
``timeout_seconds``, and the cutoffs ``k`` it reports at. No probe is configured by default, and
then the daemon runs no probe component at all. See docs/retrieval.md, "Retrieval probes".

Examples
--------
>>> s = ProbeSettings.model_validate({
...     "clicks": [{"name": "clicks", "model": "minilm", "k": [10]}],
...     "ann_recall": [{"name": "ann", "model": "minilm", "stream": "documents"}],
... })
>>> [(p.kind, p.name) for p in s.all_probes()]
[('ann_recall', 'ann'), ('clicks', 'clicks')]
>>> s.enabled
True
>>> from pydantic import ValidationError
>>> try:
...     ProbeSettings.model_validate({"clicks": [{"name": "x"}], "ann_recall": [{"name": "x", "model": "m"}]})
... except ValidationError as exc:
...     print(exc.errors()[0]["msg"])
Value error, probe names must be unique across all probes; repeated: ['x']
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from monitor.decoding.labels import LabelValue, check_label_value
from monitor.outbound import check_headers, check_url
from monitor.retrieval.families import PROBE_METRIC_FAMILIES
from monitor.retrieval.probes.ids_path import parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate
from monitor.settings_base import MAX_DURATION_SECONDS
from monitor.settings_base import Section as _Section

MAX_PROBES = 32
MAX_CUTOFFS = 5

Similarity = Literal["cosine", "dot", "l2"]


class StatisticsSettings(_Section):
    """How every probe turns per-query values into a mean with an interval, and slices them."""

    resamples: int = Field(1000, ge=1, le=100_000, description="bootstrap resamples per interval")
    confidence: float = Field(0.95, gt=0, lt=1)
    seed: int = Field(0, ge=0)
    max_slices: int = Field(
        20, ge=1, le=100, description="slice labels per probe and model; the rest fold into 'other'"
    )
    min_slice_queries: int = Field(30, ge=1, description="below this a slice is flagged small_slice")


class _ProbeBase(_Section):
    name: str
    interval_seconds: float = Field(300.0, gt=0, le=7 * 86400)
    timeout_seconds: float = Field(60.0, gt=0, le=86400)
    k: list[int] = Field(default_factory=lambda: [10])

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value == "all":
            raise ValueError("'all' is reserved")
        return check_label_value(value, "probe name")

    @field_validator("k")
    @classmethod
    def _cutoffs(cls, value: list[int]) -> list[int]:
        if not 1 <= len(value) <= MAX_CUTOFFS:
            raise ValueError(f"give 1 to {MAX_CUTOFFS} cutoffs")
        if any(k < 1 or k > 1000 for k in value):
            raise ValueError("cutoffs must be between 1 and 1000")
        return sorted(set(value))

    @property
    def max_k(self) -> int:
        return max(self.k)


def _families(value: list[str]) -> list[str]:
    unknown = [f for f in value if f not in PROBE_METRIC_FAMILIES]
    if unknown:
        raise ValueError(f"unknown metric families {unknown}; known: {list(PROBE_METRIC_FAMILIES)}")
    if not value:
        raise ValueError("give at least one metric family")
    return list(dict.fromkeys(value))


# a label value (model, stream): checked once here for every probe kind
Label = LabelValue
# metric families a probe exports, each once
MetricFamilies = Annotated[list[str], AfterValidator(_families)]


class HttpRetrieverSettings(_Section):
    """A search endpoint: one request per golden query, ranked ids read from the JSON response.

    ``request_template`` is JSON text or a mapping. Placeholders ``{{text}}``, ``{{vector}}``,
    ``{{k}}`` and ``{{query_id}}`` may appear bare (``"k": {{k}}``) or quoted (``"q": "{{text}}"``):
    a JSON string that is exactly one placeholder becomes the value with its JSON type (string,
    list of numbers, integer); a placeholder inside a longer string is interpolated as text. The
    body is then serialised with a JSON encoder, so no value can break out of its place.
    ``ids_path`` is a dotted path with ``[*]`` (every element) and ``[n]`` (one element), e.g.
    ``hits.hits[*]._id``. Placeholders in ``url`` are URL-encoded.
    """

    kind: Literal["http"] = "http"
    url: str
    method: Literal["POST", "GET"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    request_template: str | dict[str, Any] | None = None
    ids_path: str
    request_timeout_seconds: float = Field(5.0, gt=0, le=600)
    max_error_ratio: float = Field(
        0.1, ge=0, le=1, description="share of failed requests above which the whole run fails"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        check_url(value.replace("{{", "").replace("}}", ""))  # placeholders are filled URL-encoded
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        check_headers(value)
        return value

    @field_validator("request_template")
    @classmethod
    def _template(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value is None:
            return value
        RequestTemplate(value)  # raises ValueError naming the problem
        return value

    @field_validator("ids_path")
    @classmethod
    def _path(cls, value: str) -> str:
        parse_ids_path(value)
        return value

    @model_validator(mode="after")
    def _body(self) -> HttpRetrieverSettings:
        if self.method == "POST" and self.request_template is None:
            raise ValueError("request_template is required for POST")
        return self


class KnnRetrieverSettings(_Section):
    """Exact k-NN over the current window sample of ``(probe model, stream)``."""

    kind: Literal["knn"] = "knn"
    stream: str = "documents"
    similarity: Similarity = "cosine"

    @field_validator("stream")
    @classmethod
    def _stream(cls, value: str) -> str:
        return check_label_value(value, "stream")


class EncoderSettings(_Section):
    """A sentence-transformers model (a local directory) that embeds golden queries given as text."""

    path: Path
    batch_size: int = Field(64, ge=1, le=4096)
    normalize: bool = True

    @field_validator("path")
    @classmethod
    def _exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(f"{str(value)!r} is not a directory holding a sentence-transformers model")
        return value


class GoldenProbeSettings(_ProbeBase):
    """Labelled queries (a JSONL file) run against a retriever; see docs/retrieval.md for the format."""

    kind: Literal["golden"] = "golden"
    file: Path
    model: str
    retriever: Annotated[HttpRetrieverSettings | KnnRetrieverSettings, Field(discriminator="kind")]
    encoder: EncoderSettings | None = None
    metrics: MetricFamilies = Field(default_factory=lambda: list(PROBE_METRIC_FAMILIES))
    relevance_threshold: float = Field(1.0, gt=0)
    gain: Literal["linear", "exponential"] = "linear"
    max_grade: float = Field(3.0, gt=0)

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        return check_label_value(value, "model")

    @field_validator("file")
    @classmethod
    def _file(cls, value: Path) -> Path:
        if not value.is_file():
            raise ValueError(f"golden set {str(value)!r} does not exist")
        return value


class AnnRecallProbeSettings(_ProbeBase):
    """Served-vs-exact recall@k of the production ANN index, from interaction events."""

    kind: Literal["ann_recall"] = "ann_recall"
    model: Label
    stream: Label = "documents"
    similarity: Similarity = "cosine"
    window_seconds: float = Field(900.0, gt=0, le=MAX_DURATION_SECONDS)
    buffer_size: int = Field(10_000, ge=1, le=1_000_000, description="interaction events held at most")
    max_queries: int = Field(2000, ge=1, le=1_000_000, description="most recent events evaluated per run")
    vector_cache_size: int = Field(
        0, ge=0, le=10_000_000,
        description="document vectors remembered by id beyond the window sample (0 = the sample only)",
    )


class ClickProbeSettings(_ProbeBase):
    """Online metrics from served results and clicks/graded feedback, plus beyond-accuracy metrics."""

    kind: Literal["clicks"] = "clicks"
    model: Label | None = Field(None, description="only this model's events; None = every model, reported per model")
    window_seconds: float = Field(3600.0, gt=0, le=MAX_DURATION_SECONDS)
    buffer_size: int = Field(100_000, ge=1, le=10_000_000)
    metrics: MetricFamilies = Field(default_factory=lambda: ["mrr", "ndcg"])
    click_grade: float = Field(1.0, gt=0, description="relevance grade of a click without an explicit grade")
    gain: Literal["linear", "exponential"] = "linear"
    catalog_stream: Label | None = Field(
        "documents", description="ids seen on (model, this stream) form the catalog; None = catalog_size only"
    )
    catalog_size: int | None = Field(
        None, ge=1, description="the catalog's size when known (overrides the stream count)"
    )
    max_catalog_ids: int = Field(1_000_000, ge=1, le=100_000_000)


class ModelStream(_Section):
    model: Label
    stream: Label = "documents"


class AgreementProbeSettings(_ProbeBase):
    """How well a candidate model's neighbours match a reference model's (seed 003), on shared ids."""

    kind: Literal["agreement"] = "agreement"
    reference: ModelStream
    candidate: ModelStream
    queries: int = Field(200, ge=1, le=100_000, description="query ids sampled from the ids both models hold")
    pairs: int = Field(10_000, ge=10, le=10_000_000, description="random pairs for the similarity Spearman")
    similarity: Similarity = "cosine"
    metrics: MetricFamilies = Field(default_factory=lambda: ["recall", "ndcg", "mrr", "map"])
    graded: bool = Field(False, description="reference rank 1 gets grade k, rank k grade 1 (else binary)")

    @model_validator(mode="after")
    def _distinct(self) -> AgreementProbeSettings:
        if self.reference == self.candidate:
            raise ValueError("reference and candidate must differ")
        return self

    @property
    def model(self) -> str:
        """The ``model`` label of what this probe exports: the candidate."""
        return self.candidate.model


ProbeSpec = GoldenProbeSettings | AnnRecallProbeSettings | ClickProbeSettings | AgreementProbeSettings


class ProbeSettings(_Section):
    """Every retrieval probe the daemon runs, and what they share."""

    device: Literal["auto", "cpu", "cuda"] | None = Field(
        None, description="where exact k-NN runs (rule: monitor/devices.py); None = the daemon's device"
    )
    knn_block_size: int = Field(8192, ge=64, le=1_000_000, description="documents per k-NN block (memory bound)")
    statistics: StatisticsSettings = Field(default_factory=StatisticsSettings)
    golden: list[GoldenProbeSettings] = Field(default_factory=list)
    ann_recall: list[AnnRecallProbeSettings] = Field(default_factory=list)
    clicks: list[ClickProbeSettings] = Field(default_factory=list)
    agreement: list[AgreementProbeSettings] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> ProbeSettings:
        names = [p.name for p in self.all_probes()]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"probe names must be unique across all probes; repeated: {repeated}")
        if len(names) > MAX_PROBES:
            raise ValueError(f"at most {MAX_PROBES} probes (the probe label must stay bounded)")
        return self

    def all_probes(self) -> list[ProbeSpec]:
        """Every configured probe, ordered by kind then as configured."""
        return [*self.golden, *self.ann_recall, *self.clicks, *self.agreement]

    @property
    def enabled(self) -> bool:
        return bool(self.all_probes())

