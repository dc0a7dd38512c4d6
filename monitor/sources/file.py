"""Replay a file as if it were the embeddings topic: JSONL events or an ``.npy`` (n, d) matrix.

JSONL lines go through the same decoder as Kafka messages (one line = one message), and an
``.npy`` matrix is cut into binary batches, so a replay exercises exactly the production path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from monitor.sources.base import Source, SourceMessage
from monitor.sources.settings import FileSourceSettings

logger = logging.getLogger(__name__)


class FileSource(Source):
    name = "file"

    def __init__(self, settings: FileSourceSettings):
        if settings.path is None:
            raise ValueError("file.path is required for the file source")
        self.settings = settings
        self.path = Path(settings.path)
        self._messages: Iterator[tuple[SourceMessage, int]] | None = None
        self._done = False
        self._emitted = 0
        self._started_at = 0.0

    def start(self) -> None:
        if not self.path.is_file():
            raise FileNotFoundError(f"file.path: {self.path} does not exist")
        self._messages = self._iterate()
        self._started_at = time.monotonic()

    def _iterate(self) -> Iterator[tuple[SourceMessage, int]]:
        while True:
            if self.path.suffix == ".npy":
                yield from self._npy_messages()
            else:
                yield from self._jsonl_messages()
            if not self.settings.loop:
                return

    def _npy_messages(self) -> Iterator[tuple[SourceMessage, int]]:
        matrix = np.load(self.path, mmap_mode="r", allow_pickle=False)
        if matrix.ndim != 2:
            raise ValueError(f"file.path: {self.path} holds shape {matrix.shape}, expected (n, d)")
        headers = (
            ("model", self.settings.model.encode()),
            ("dim", str(matrix.shape[1]).encode()),
            ("stream", self.settings.stream.encode()),
        )
        step = self.settings.batch_size
        for start in range(0, matrix.shape[0], step):
            rows = np.ascontiguousarray(matrix[start : start + step], dtype="<f4")
            yield SourceMessage(rows.tobytes(), headers, "embeddings"), rows.shape[0]

    def _jsonl_messages(self) -> Iterator[tuple[SourceMessage, int]]:
        with self.path.open("rb") as handle:
            for line in handle:
                line = line.strip()
                if line:
                    yield SourceMessage(line, (), "embeddings"), 1

    def poll(self, timeout: float) -> list[SourceMessage]:
        if self._messages is None or self._done:
            time.sleep(timeout)
            return []
        out: list[SourceMessage] = []
        budget = self._budget(timeout)
        records = 0
        while records < budget:
            try:
                message, count = next(self._messages)
            except StopIteration:
                self._done = True
                logger.info("file source %s: replay finished after %d records", self.path, self._emitted)
                break
            out.append(message)
            records += count
        self._emitted += records
        if not out and not self._done:
            time.sleep(min(timeout, 0.05))
        return out

    def _budget(self, timeout: float) -> int:
        """How many records may go out now to keep to ``rate`` (unbounded when rate is 0)."""
        if self.settings.rate <= 0:
            return self.settings.batch_size * 10
        allowed = (time.monotonic() - self._started_at + timeout) * self.settings.rate
        return max(0, int(allowed) - self._emitted)

    @property
    def exhausted(self) -> bool:
        return self._done
