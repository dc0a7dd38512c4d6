"""The sliding window's settings: ``window:`` (light: pydantic only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from monitor.settings_base import MAX_DURATION_SECONDS, Section


class WindowSettings(Section):
    """The sliding window metrics are computed over (see docs/metrics.md, "Window semantics")."""

    seconds: float = Field(900.0, gt=0, le=MAX_DURATION_SECONDS)
    subwindows: int = Field(10, ge=1, le=120)
    reservoir_size: int = Field(10_000, ge=10, le=1_000_000)
    gram_precision: Literal["float64", "float32"] = Field(
        "float64",
        description="Arithmetic of the per-batch second-moment product: float32 is ~2x faster on "
        "shifted rows; its measured error is in docs/benchmarks.md (float64 is exact)",
    )
