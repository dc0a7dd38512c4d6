"""Decoding's settings: ``decoding:`` (where JSON is parsed) and ``limits:`` (what one message and the
label sets may hold). Light: pydantic only."""

from __future__ import annotations

from pydantic import Field

from monitor.settings_base import Section


class DecodingSettings(Section):
    """Where JSON embedding events are parsed (docs/operations.md, "Load and backpressure")."""

    json_workers: int = Field(
        1,
        ge=0,
        le=16,
        description="worker processes that parse JSON embedding messages off the GIL kafka-python "
        "needs; 0 parses on the poll thread",
    )


class LimitSettings(Section):
    """Budgets that keep memory and label cardinality bounded whatever the input."""

    max_models: int = Field(20, ge=1, le=1000)
    max_streams_per_model: int = Field(10, ge=1, le=1000)
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_dimension: int = Field(8192, ge=2)
    max_rows_per_message: int = Field(100_000, ge=1)
