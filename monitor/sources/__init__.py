"""Where records come from. The daemon only sees :class:`~monitor.sources.base.Source`; it never
knows which one runs.

A source yields :class:`~monitor.sources.base.SourceMessage` batches from ``poll``, each message
tagged with the kind of stream it belongs to (``embeddings`` or ``interactions``) and, for Kafka,
its position, so that the daemon can commit exactly the offsets its state reflects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.sources.base import Source

__all__ = ["build_source"]


def build_source(settings: Settings) -> Source:
    """The source the settings ask for."""
    if settings.source == "kafka" and settings.kafka.client == "confluent":
        from monitor.sources.kafka.confluent import ConfluentSource

        return ConfluentSource(settings.kafka)
    if settings.source == "kafka":
        from monitor.sources.kafka.source import KafkaSource

        return KafkaSource(settings.kafka)
    if settings.source == "file":
        from monitor.sources.file import FileSource

        return FileSource(settings.file)
    from monitor.sources.synthetic import SyntheticSource

    return SyntheticSource(settings.synthetic)
