"""Helpers for the scale-out tests: an in-memory producer, and feeding publications to a merge table."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from monitor.scaleout.table import MergeTable


class _Done:
    def get(self, timeout: float | None = None) -> None:
        return None


@dataclass
class MemoryProducer:
    """Stands in for KafkaProducer: keeps what was sent; ``fail`` makes sends raise."""

    sent: list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]] = field(default_factory=list)
    fail: bool = False

    def send(self, topic: str, key: bytes, value: bytes | None, headers: Any, partition: int) -> _Done:
        if self.fail:
            raise ConnectionError("broker unreachable")
        self.sent.append((key, value, list(headers)))
        return _Done()

    def flush(self, timeout: float | None = None) -> None:
        pass

    def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def close(self, timeout: float | None = None) -> None:
        pass

    def take(self) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]:
        out, self.sent = self.sent, []
        return out


def feed(table: MergeTable, records: Iterable[tuple[bytes, bytes | None, Any]], partition: int = 0) -> None:
    """Apply records of the partials topic to ``table`` as the reducer's intake does."""
    for offset, (key, value, headers) in enumerate(records):
        table.offer_record(key, value, headers, ("partials", partition, offset))
