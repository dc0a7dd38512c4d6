"""``scale_out:`` settings: the daemon's role, and how replicas and the reducer meet in Kafka.

Light on purpose (pydantic only): the settings module imports it, and settings are read before
anything heavy is loaded.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from monitor.decoding.labels import check_label_value
from monitor.drift.online.detector_kinds import DetectorKind, check_detectors
from monitor.settings_base import MAX_DURATION_SECONDS

Role = Literal["single", "replica", "reducer"]


SUBWINDOW_DETECTORS: dict[DetectorKind, dict[str, Any]] = {
    "page_hinkley": {"min_instances": 5, "delta": 0.5, "threshold": 25.0, "alpha": 1.0},
    "adwin": {"delta": 1e-4, "clock": 1, "grace_period": 5, "min_window_length": 3},
}


def default_replica_id() -> str:
    """The host name: stable across restarts in a StatefulSet (``embedding-monitor-0``, ...)."""
    return socket.gethostname().split(".")[0][:64] or "replica"


class ScaleOutSettings(BaseModel):
    """Several replicas plus one reducer, exact global metrics (docs/deployment.md, "Scaling out").

    With ``role: single`` (the default) nothing here is used and the daemon behaves as if this
    section did not exist.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, allow_inf_nan=False)

    role: Role = "single"
    # Identifies a replica's publications; must survive restarts (a StatefulSet's pod name does)
    # and be unique among the replicas, or their partials replace each other.
    replica_id: str = Field(default_factory=default_replica_id)
    partials_topic: str = "embedding-monitor-partials"
    # Kafka's default message size limit is ~1 MB: larger partials go in chunks of this size.
    max_record_bytes: int = Field(900_000, ge=16_384, le=64 * 1024 * 1024)
    # Every sub-window is re-sent this often (default: window.seconds), so a reducer that starts
    # without a checkpoint needs to read back only twice this far.
    full_publish_seconds: float | None = Field(None, gt=0, le=MAX_DURATION_SECONDS)
    publish_timeout_seconds: float = Field(30.0, gt=0, le=600)
    # Reducer: a replica whose newest publication is older than this is reported stale (its
    # partials stay merged until their sub-windows leave the window: they are still exact).
    stale_after_seconds: float = Field(120.0, gt=0, le=MAX_DURATION_SECONDS)
    # Reducers: None, one reducer reading every partition of the partials topic by assignment; a
    # group id, reducers in that consumer group, each merging and exporting the streams of the
    # partitions it is assigned (docs/deployment.md, "Several reducers").
    reducer_group: str | None = Field(None, min_length=1, max_length=255)
    # Reducer: the replica label budget; publications of further replicas are not merged, counted.
    max_replicas: int = Field(32, ge=1, le=1000)
    # Reducer: the change detectors on the merged per-sub-window signal series (docs/drift.md,
    # "Change detectors when scaled out"): one update per sub-window, so they may detect from the
    # 5th (Page-Hinkley) and check at every update (ADWIN), where one daemon's defaults wait 30
    # and 32 mini-batches. No alarm on 200,000 simulated null updates (iid unit normals); a
    # 20-sd shift of the sub-window mean caught at the 2nd update (Page-Hinkley), a 5-sd one at the 6th-9th.
    # Securing the partials topic (docs/deployment.md, "Securing the partials topic"). A file of
    # HMAC keys, one per line (the first signs, every one is accepted: rotation): replicas sign
    # every record they publish, and replicas and reducers refuse records no key signed.
    partials_key_file: Path | None = None
    # The replica ids whose publications are trusted: merged by reducers, and able to move where a
    # partition resumes. Empty: any replica id (then only the key keeps forged ids out).
    replicas: list[str] = Field(default_factory=list, max_length=1000)
    # A publication's epoch is its capture time: one further ahead of the reader's clock than this
    # is refused (a far-future epoch would otherwise outrank every genuine publication).
    max_clock_skew_seconds: float = Field(300.0, gt=0, le=86_400)
    detectors: dict[DetectorKind, dict[str, Any]] = Field(
        default_factory=lambda: {kind: dict(params) for kind, params in SUBWINDOW_DETECTORS.items()}, min_length=1)

    @field_validator("detectors")
    @classmethod
    def _check_detectors(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        check_detectors(value)
        return value

    @field_validator("replica_id")
    @classmethod
    def _label_safe(cls, value: str) -> str:
        return check_label_value(value, "replica_id")  # it becomes a label value

    @field_validator("replicas")
    @classmethod
    def _replica_ids(cls, value: list[str]) -> list[str]:
        for replica in value:
            cls._label_safe(replica)
        return value

    @field_validator("partials_key_file")
    @classmethod
    def _key_file(cls, value: Path | None) -> Path | None:
        from monitor.scaleout.signing import read_key_file

        if value is not None:
            read_key_file(value)  # a KeyFileError names the file, never a key
        return value

    @model_validator(mode="after")
    def _replica_listed(self) -> ScaleOutSettings:
        if self.role == "replica" and self.replicas and self.replica_id not in self.replicas:
            raise ValueError(f"replica_id {self.replica_id!r} is not in replicas: every reader would refuse its "
                             "publications")
        return self

    def partials_keys(self) -> tuple[bytes, ...]:
        """The HMAC keys of the partials topic, the signing one first (none without a key file)."""
        from monitor.scaleout.signing import read_key_file

        return () if self.partials_key_file is None else read_key_file(self.partials_key_file)
