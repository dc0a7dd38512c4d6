"""Intrinsic-metric settings (nested as ``quality:`` in the daemon's Settings).

Apart from the metrics (:mod:`monitor.quality.intrinsic`, which needs torch), so that loading
settings stays fast.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator


class IntrinsicSettings(BaseModel):
    """Thresholds and budgets of the intrinsic metrics (``quality:`` in the settings file)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dead_dimension_ratio: float = Field(
        0.01,
        description="A dimension is dead when its variance is below this share of the mean "
        "per-dimension variance (relative, so it works for any vector scale).",
    )
    uniformity_t: float = Field(2.0, description="Temperature t of the uniformity kernel exp(-t·d²).")
    uniformity_pair_budget: int = Field(
        2_000_000,
        description="Most pairs uniformity evaluates: the first m sample rows with m(m-1)/2 <= budget.",
    )
    alignment_alpha: float = Field(2.0, description="Exponent α of the alignment distance ‖u₁-u₂‖^α.")
    collapse_min_records: int = Field(
        100, description="Below this many window records collapse_detected stays 0 (too little evidence)."
    )
    collapse_dead_dimension_share: float = Field(
        0.10, description="Collapse when more than this share of dimensions is dead."
    )
    collapse_effective_rank_ratio: float = Field(
        0.30,
        description="Collapse when effective_rank / min(d, n-1) is below this (n-1 bounds the rank "
        "of n centred vectors).",
    )
    collapse_stable_rank: float = Field(
        1.5, description="Collapse when the stable rank is below this (one direction holds the variance)."
    )
    collapse_mean_cosine: float = Field(
        0.95, description="Collapse when the mean cosine similarity is above this (near-identical vectors)."
    )

    @field_validator("dead_dimension_ratio")
    @classmethod
    def _relative_ratio(cls, value: float) -> float:
        if not 0.0 < value < 1.0:
            raise ValueError(
                "must be in (0, 1): it is relative to the mean per-dimension variance, "
                "so 1 or more would call ordinary dimensions dead"
            )
        return value

    @field_validator("uniformity_t", "alignment_alpha")
    @classmethod
    def _positive_finite(cls, value: float) -> float:
        if not (value > 0.0 and math.isfinite(value)):
            raise ValueError("must be a positive finite number")
        return value

    @field_validator("uniformity_pair_budget")
    @classmethod
    def _at_least_one_pair(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1 (uniformity needs one pair)")
        return value

    @field_validator("collapse_min_records")
    @classmethod
    def _at_least_two(cls, value: int) -> int:
        if value < 2:
            raise ValueError("must be at least 2 (a covariance needs two vectors)")
        return value

    @field_validator("collapse_dead_dimension_share", "collapse_effective_rank_ratio")
    @classmethod
    def _share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("must be a share between 0 and 1")
        return value

    @field_validator("collapse_stable_rank")
    @classmethod
    def _stable_rank_floor(cls, value: float) -> float:
        if not (value >= 1.0 and math.isfinite(value)):
            raise ValueError("must be at least 1 (the smallest possible stable rank)")
        return value

    @field_validator("collapse_mean_cosine")
    @classmethod
    def _cosine(cls, value: float) -> float:
        if not -1.0 <= value <= 1.0:
            raise ValueError("must be a cosine between -1 and 1")
        return value
