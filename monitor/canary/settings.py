"""``canaries:`` settings (light: pydantic only, so the daemon's settings import nothing heavy)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from monitor.decoding.labels import check_label_value

MAX_CANARIES_PER_MODEL = 1000


class CanarySettings(BaseModel):
    """Canary ids per model, optional pinned vectors, and how close "unchanged" is.

    A canary is an item (same text, same id) that producers send through the real embedding
    service on a schedule. Its first sighting pins its vector in the state directory unless
    ``pins_file`` pins it; every later arrival is compared with the pin by cosine similarity.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    ids: dict[str, list[str]] = Field(default_factory=dict, description="model -> canary record ids")
    pins_file: Path | None = Field(
        None, description='JSONL of {"model": ..., "id": ..., "vector": [...]}: pins that win over first sightings'
    )
    tolerance: float = Field(
        1e-3, gt=0, lt=1,
        description="a canary whose cosine to its pin is below 1 - tolerance is a mismatch; the default "
        "absorbs float nondeterminism across hardware and batch sizes (bf16 inference moves cosine by ~1e-5)",
    )

    @field_validator("ids")
    @classmethod
    def _check_ids(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for model, ids in value.items():
            check_label_value(model, "model")
            if not ids or len(ids) > MAX_CANARIES_PER_MODEL:
                raise ValueError(f"{model}: give between 1 and {MAX_CANARIES_PER_MODEL} canary ids")
            if any(not isinstance(i, str) or not i for i in ids):
                raise ValueError(f"{model}: canary ids must be non-empty strings")
        return {model: list(dict.fromkeys(ids)) for model, ids in value.items()}

    @field_validator("pins_file")
    @classmethod
    def _check_file(cls, value: Path | None) -> Path | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"file {str(value)!r} does not exist")
        return value

    @model_validator(mode="after")
    def _pins_are_canaries(self) -> CanarySettings:
        for model, ident, _ in self.file_pins():
            if ident not in self.ids.get(model, []):
                raise ValueError(f"pins_file pins {model}/{ident}, which is not listed in canaries.ids")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.ids)

    def file_pins(self) -> list[tuple[str, str, list[float]]]:
        """(model, id, vector) of every line of ``pins_file``; raises ValueError naming the line."""
        if self.pins_file is None:
            return []
        pins = []
        dims: dict[str, int] = {}  # every pin of a model has the model's one dimension
        for number, line in enumerate(Path(self.pins_file).read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"pins_file line {number}"
            try:
                row = json.loads(line)
            except ValueError:
                raise ValueError(f"{where}: not JSON") from None
            if not isinstance(row, dict) or set(row) != {"model", "id", "vector"}:
                raise ValueError(f"{where}: expected exactly the keys model, id, vector")
            vector, model = row["vector"], str(row["model"])
            problem = pin_problem(vector)
            if problem is not None:
                raise ValueError(f"{where}: {problem}")
            if dims.setdefault(model, len(vector)) != len(vector):
                raise ValueError(f"{where}: a {len(vector)}-d vector; model {model}'s pins above are {dims[model]}-d")
            pins.append((model, str(row["id"]), [float(v) for v in vector]))
        return pins


def pin_problem(vector: Any) -> str | None:
    """Why ``vector`` cannot be a canary's pin (a zero or non-finite one would disable it), or None."""
    if not isinstance(vector, list) or len(vector) < 2 or not all(_finite(v) for v in vector) or not any(vector):
        return "vector must be a list of at least 2 finite numbers, not all zero"
    return None


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond float range
        return False
