"""The checkpoints' settings: ``checkpoint:`` (:mod:`monitor.daemon.checkpointing`; light: pydantic only)."""

from __future__ import annotations

from pydantic import Field

from monitor.settings_base import Section


class CheckpointSettings(Section):
    """Periodic, atomic checkpoints of all state plus the Kafka offsets it reflects (docs/operations.md)."""

    enabled: bool | None = None  # None: on for the Kafka source, off for file/synthetic replays
    interval_seconds: float = Field(30.0, gt=0, le=86_400)
    max_bytes: int = Field(
        16 * 2**30, ge=2**20,
        description="a checkpoint file larger than this is refused at start-up without being read (like a "
        "corrupt one); about 55 MB per (model, stream) at d = 768 with the default window (docs/operations.md)",
    )
