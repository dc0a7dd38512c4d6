"""What a metric's declaration holds (:class:`MetricSpec`) and the label sets several areas share."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_CODE = re.compile(r"monitor(\.\w+)+:\w+(\.\w+)*")
Kind = Literal["counter", "gauge", "histogram", "info"]
Area = Literal["ingest", "intrinsic", "operations", "drift", "retrieval", "canary", "scale_out", "index",
               "serving"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""  # the base unit the name ends in (seconds, bytes, ratio, ...); "" when a count or score
    area: Area = "ingest"
    # the code that computes the number, as ``module:qualname`` (docs/metrics.md shows it under the
    # metric's heading; tests/artifacts/test_catalog.py imports every one)
    code: str = ""  # required: __post_init__ refuses one that is not module:qualname

    def __post_init__(self) -> None:
        if self.unit and self.unit not in self.name:
            raise ValueError(f"metric {self.name} must name its unit {self.unit!r}")
        if not _CODE.fullmatch(self.code):
            raise ValueError(f"metric {self.name} must name the code that computes it as module:qualname, "
                             f"not {self.code!r}")
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"metric {self.name}: counters, and only counters, end in _total")

    @property
    def family(self) -> str:
        """The name prometheus-client's family objects take (without ``_total`` / ``_info``)."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name

    def series(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this metric."""
        if self.kind == "histogram":
            return tuple(self.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)


MS = ("model", "stream")
PROBE_ESTIMATE_LABELS = ("probe", "model", "slice", "k")
