"""Index-probe settings (nested as ``index:`` in the daemon's Settings; light: pydantic only).

An index probe talks to the vector store that serves the queries: it runs the production search
(with the user's own settings) beside the engine's exact search with the same filter, on a budget
of exact searches per cycle, and samples stored vectors for the census. See docs/index.md.

Examples
--------
>>> s = IndexSettings.model_validate({"probes": [{
...     "name": "docs", "model": "minilm", "engine": "lancedb",
...     "lancedb": {"uri": "/tmp/lance", "table": "docs"}}]})
>>> s.enabled, s.probes[0].engine, s.probes[0].budget.exact_searches
(True, 'lancedb', 200)
>>> from pydantic import ValidationError
>>> try:
...     IndexSettings.model_validate({"probes": [{"name": "docs", "model": "m", "engine": "pgvector"}]})
... except ValidationError as exc:
...     print(exc.errors()[0]["msg"])
Value error, engine pgvector needs its section pgvector:
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from monitor.decoding.labels import LABEL_VALUE_RE, is_label_value
from monitor.outbound import check_url
from monitor.retrieval.settings import EncoderSettings
from monitor.settings_base import Section

MAX_INDEX_PROBES = 16
MAX_FILTER_COLUMNS = 16
# a SQL/engine identifier we may interpolate (quoted) into a statement: letters, digits, underscore
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")

Metric = Literal["cosine", "l2", "dot"]
ENGINES = ("pgvector", "lancedb", "qdrant", "chroma")


def _identifier(value: str, what: str) -> str:
    if not IDENTIFIER.match(value):
        raise ValueError(f"{what} {value!r} is not a plain identifier ({IDENTIFIER.pattern})")
    return value


_FORBIDDEN_IN_EXPRESSION = ("%", ";", "'", "$", "\\", "--", "/*", "*/")


def check_order_expression(value: str) -> str:
    """An ORDER BY expression we can splice into the production query: ``{q}`` exactly once (it
    binds one parameter), ``{col}`` at least once, no other braces, balanced parentheses, and
    nothing that quotes, comments, ends the statement or takes a parameter of its own.

    >>> check_order_expression("({col})::halfvec(4) <=> ({q})::halfvec(4)")
    '({col})::halfvec(4) <=> ({q})::halfvec(4)'
    >>> check_order_expression("{col} <=> {q} --")
    Traceback (most recent call last):
    ...
    ValueError: order_expression may not hold '--' (comments, quotes, parameters and ';' are refused)
    """
    if value.count("{q}") != 1:
        raise ValueError("order_expression must use {q} exactly once")
    if "{col}" not in value:
        raise ValueError("order_expression must use {col}")
    for bad in _FORBIDDEN_IN_EXPRESSION:
        if bad in value:
            raise ValueError(f"order_expression may not hold {bad!r} "
                             "(comments, quotes, parameters and ';' are refused)")
    rest = value.replace("{q}", "").replace("{col}", "")
    if "{" in rest or "}" in rest:
        raise ValueError("order_expression: only {col} and {q} may stand in braces")
    depth = 0
    for char in rest:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0:
        raise ValueError("order_expression: unbalanced parentheses")
    return value


def _http_url(value: str) -> str:
    """An engine's HTTP(S) base URL, checked as every outbound URL is (monitor/outbound.py)."""
    return check_url(value).rstrip("/")


class _EngineSettings(Section):
    """What every engine section has: the distance, and the fields a query's filter may name."""

    metric: Metric = "cosine"
    filter_columns: list[str] = Field(
        default_factory=list, description="fields a query's equality predicates may name (others are skipped)"
    )

    @field_validator("filter_columns")
    @classmethod
    def _filters(cls, value: list[str]) -> list[str]:
        if len(value) > MAX_FILTER_COLUMNS:
            raise ValueError(f"at most {MAX_FILTER_COLUMNS} filter columns")
        return [_identifier(v, "filter column") for v in value]


class PgvectorSettings(_EngineSettings):
    """PostgreSQL + pgvector: the table, its columns, and the production query's settings."""

    dsn: SecretStr | None = Field(None, description="libpq connection string or URI (or dsn_file)")
    dsn_file: Path | None = Field(None, description="a file holding the DSN (a mounted secret)")
    table: str = Field(..., description="table (optionally schema.table) holding the vectors")
    id_column: str = "id"
    vector_column: str = "embedding"
    text_column: str | None = Field(None, description="the stored text, re-embedded when census.encoder is set")
    ef_search: int | None = Field(None, ge=1, le=1000, description="hnsw.ef_search of the production query")
    iterative_scan: Literal["off", "strict_order", "relaxed_order"] | None = None
    max_scan_tuples: int | None = Field(None, ge=1, description="hnsw.max_scan_tuples")
    ivfflat_probes: int | None = Field(None, ge=1, description="ivfflat.probes of the production query")
    order_expression: str | None = Field(
        None,
        description="the ORDER BY of the production query when the index is over an expression, e.g. "
        "'({col})::halfvec(384) <=> ({q})::halfvec(384)'; {col} is the vector column, {q} the query. "
        "Its exact twin (index scans off) gives the quantization part of the recall loss",
    )
    rerank_candidates: int | None = Field(
        None, ge=1, le=10_000,
        description="with order_expression: fetch this many by the expression, re-rank them at full precision",
    )
    statement_timeout_ms: int = Field(5000, ge=1, le=600_000)
    connect_timeout_seconds: float = Field(5.0, gt=0, le=300)

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        for part in value.split("."):
            _identifier(part, "table")
        if value.count(".") > 1:
            raise ValueError(f"table {value!r}: at most schema.table")
        return value

    @field_validator("id_column", "vector_column", "text_column")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        return None if value is None else _identifier(value, "column")

    @field_validator("order_expression")
    @classmethod
    def _expression(cls, value: str | None) -> str | None:
        return None if value is None else check_order_expression(value)

    @field_validator("dsn_file")
    @classmethod
    def _dsn_file(cls, value: Path | None) -> Path | None:
        if value is None:
            return value
        try:
            text = Path(value).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {str(value)!r}: {getattr(exc, 'strerror', None) or exc}") from None
        if not text:
            raise ValueError(f"{str(value)!r} is empty")
        return value

    @model_validator(mode="after")
    def _one_dsn(self) -> PgvectorSettings:
        if (self.dsn is None) == (self.dsn_file is None):
            raise ValueError("give exactly one of dsn and dsn_file")
        if self.rerank_candidates is not None and self.order_expression is None:
            raise ValueError("rerank_candidates needs order_expression")
        return self

    def connection_string(self) -> str:
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        assert self.dsn_file is not None
        return Path(self.dsn_file).read_text().strip()


class LanceDbSettings(_EngineSettings):
    """An embedded LanceDB table and the production query's settings."""

    uri: str = Field(..., description="the database directory (or object-store URI)")
    table: str
    id_column: str = "id"
    vector_column: str = "vector"
    text_column: str | None = None
    nprobes: int | None = Field(None, ge=1, le=100_000)
    refine_factor: int | None = Field(None, ge=1, le=1000)
    ef: int | None = Field(None, ge=1, le=10_000, description="HNSW ef of the production query")
    prefilter: bool = Field(True, description="filter before the vector search (False: after, as some apps do)")

    @field_validator("table", "id_column", "vector_column", "text_column")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _identifier(value, "name")


class QdrantSettings(_EngineSettings):
    """A Qdrant-shaped HTTP API (a template: see docs/index.md, "Other engines")."""

    url: str = Field(..., description="base URL, e.g. http://qdrant:6333")
    collection: str
    vector_name: str | None = Field(None, description="a named vector of the collection")
    hnsw_ef: int | None = Field(None, ge=1, le=100_000)
    api_key_file: Path | None = None
    timeout_seconds: float = Field(10.0, gt=0, le=300)

    _url = field_validator("url")(classmethod(lambda cls, value: _http_url(value)))

    @field_validator("collection")
    @classmethod
    def _collection(cls, value: str) -> str:
        return _identifier(value, "collection")


class ChromaSettings(_EngineSettings):
    """A Chroma server's collection, over its HTTP API (v2). The served search is the collection's own
    HNSW settings; the exact search reads every row under the filter, at most ``exact_max_rows``."""

    url: str = Field(..., description="the server's base URL, e.g. http://chroma:8000")
    collection: str = Field(..., description="the collection's name")
    tenant: str = "default_tenant"
    database: str = "default_database"
    token_file: Path | None = Field(None, description="a file holding a bearer token (a mounted secret)")
    timeout_seconds: float = Field(10.0, gt=0, le=300, description="each request's deadline")
    exact_max_rows: int = Field(
        50_000, ge=1, le=10_000_000,
        description="most rows one exact search may read (Chroma has no brute-force search: it is done here)",
    )
    page_rows: int = Field(1000, ge=1, le=100_000, description="rows per get request")

    _url = field_validator("url")(classmethod(lambda cls, value: _http_url(value)))

    @field_validator("collection", "tenant", "database")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,126}[A-Za-z0-9]", value):
            raise ValueError(f"{value!r}: 3-128 of letters, digits, '.', '_', '-', starting and ending alphanumeric")
        return value


class BudgetSettings(Section):
    """What one cycle may cost the production database."""

    exact_searches: int = Field(200, ge=1, le=100_000, description="exact (brute-force) searches per cycle")
    census_rows: int = Field(2000, ge=0, le=100_000, description="stored rows the census reads per cycle")
    served_searches: int | None = Field(
        None, ge=0, le=100_000,
        description="with scopes: production (served) searches per cycle that screen the scopes by fill rate; "
        "None: 4 x exact_searches",
    )
    uniform_share: float = Field(
        0.5, gt=0, le=1,
        description="with scopes: share of exact_searches drawn uniformly (the overall estimate); the rest "
        "goes adaptively to the scopes whose interval is low and wide",
    )

    @property
    def screen(self) -> int:
        return self.exact_searches * 4 if self.served_searches is None else self.served_searches


class QuerySettings(Section):
    """Where the probe's queries come from: the live interaction stream, a golden file, or both."""

    stream: bool = Field(True, description="sample query vectors (and their filters) from the interactions")
    golden_file: Path | None = Field(None, description='JSONL of {"query_vector": [...], "filter": {...}}')
    buffer: int = Field(5000, ge=1, le=1_000_000, description="recent interaction queries held for sampling")
    window_seconds: float = Field(3600.0, gt=0, le=30 * 86400)
    scope_field: str | None = Field(
        None, description="the filter key whose value is the scope label (tenant, collection); None: no scopes"
    )
    min_per_scope: int = Field(
        5, ge=0, le=1000,
        description="queries screened (served search, fill rate) from each scope per cycle, least recently "
        "seen scopes first, within half the screen",
    )
    max_scopes: int = Field(
        10_000, ge=1, le=100_000,
        description="scope values whose evidence is kept over window_seconds (the least recently seen is evicted)",
    )

    @field_validator("golden_file")
    @classmethod
    def _file(cls, value: Path | None) -> Path | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"file {str(value)!r} does not exist")
        return value


class CensusSettings(Section):
    """The index census: stored vectors against the stream's latest vector for the same id."""

    enabled: bool = True
    stream: str | None = Field(None, description="the embedding stream whose ids the index holds (None: any)")
    tracked_ids: int = Field(
        2000, ge=10, le=100_000,
        description="ids tracked with their latest vector: a hash sample of the stream (bottom-k by hash)",
    )
    tolerance: float = Field(
        1e-3, gt=0, lt=1, description="a stored vector whose cosine to the latest is below 1 - tolerance is stale"
    )
    grace_seconds: float = Field(
        300.0, ge=0, le=30 * 86400, description="an id seen more recently than this may not be indexed yet"
    )
    degenerate_rows: int = Field(500, ge=0, le=100_000, description="random stored rows checked for zero/NaN rows")
    hub_queries: int = Field(
        50, ge=0, le=10_000, description="stored rows searched exactly (k + 1) for duplicates and hubness"
    )
    encoder: EncoderSettings | None = Field(
        None, description="a sentence-transformers model (the encoder extra): re-embed the stored text "
        "(the engine's text_column) instead of comparing with the stream's latest vector"
    )


PGVECTOR_MIN_TIMEOUT = 2.5  # seconds: 2 s to connect fit within the 85 % cutoff


class IndexProbeSpec(Section):
    """One index (one model's vectors in one engine table or collection)."""

    name: str
    model: str = Field(..., description="the model whose queries and vectors the index holds")
    engine: Literal["pgvector", "lancedb", "qdrant", "chroma"]
    k: int = Field(10, ge=1, le=1000)
    interval_seconds: float = Field(300.0, gt=0, le=7 * 86400)
    timeout_seconds: float = Field(120.0, gt=0, le=86400)
    epsilon: float = Field(0.01, ge=0, le=1, description="ε of the tie-aware ε-recall")
    attribution: bool = Field(
        True, description="spend exact searches on the loss parts (filter: unfiltered twins; quantization)"
    )
    worst_scopes: int = Field(5, ge=1, le=50, description="scopes exported by name; the rest fold into 'other'")
    flag_margin: float = Field(
        0.1, ge=0, le=1,
        description="a scope is flagged when its recall's upper bound is this far below the overall lower bound",
    )
    backoff_max_seconds: float = Field(600.0, gt=0, le=86400)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    queries: QuerySettings = Field(default_factory=QuerySettings)
    census: CensusSettings = Field(default_factory=CensusSettings)
    pgvector: PgvectorSettings | None = None
    lancedb: LanceDbSettings | None = None
    qdrant: QdrantSettings | None = None
    chroma: ChromaSettings | None = None

    @field_validator("name", "model")
    @classmethod
    def _label(cls, value: str) -> str:
        if value == "all" or not is_label_value(value):
            raise ValueError(f"{value!r} is not a valid label value ({LABEL_VALUE_RE.pattern}, not 'all')")
        return value

    @model_validator(mode="after")
    def _engine_section(self) -> IndexProbeSpec:
        if getattr(self, self.engine) is None:
            raise ValueError(f"engine {self.engine} needs its section {self.engine}:")
        others = [e for e in ENGINES if e != self.engine and getattr(self, e) is not None]
        if others:
            raise ValueError(f"engine {self.engine}: remove the section(s) {others}")
        if not self.queries.stream and self.queries.golden_file is None:
            raise ValueError("queries: enable stream or give golden_file")
        if self.engine == "pgvector" and self.timeout_seconds < PGVECTOR_MIN_TIMEOUT:
            # libpq waits whole seconds, at least 2, to connect, and the cycle cuts its calls at 85 %
            # of timeout_seconds: under this, no connection could ever be made in time
            raise ValueError(f"timeout_seconds: a pgvector probe needs at least {PGVECTOR_MIN_TIMEOUT} s "
                             f"(a connection may take libpq's minimum of 2 s), not {self.timeout_seconds}")
        return self

    @property
    def filter_columns(self) -> list[str]:
        section = getattr(self, self.engine)
        return list(section.filter_columns)


class IndexSettings(Section):
    """``index:``: the index probes (none by default: then the daemon runs no index component)."""

    probes: list[IndexProbeSpec] = Field(default_factory=list, max_length=MAX_INDEX_PROBES)

    @field_validator("probes")
    @classmethod
    def _unique(cls, value: list[IndexProbeSpec]) -> list[IndexProbeSpec]:
        names = [p.name for p in value]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"index probe names must be unique; repeated: {repeated}")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.probes)
