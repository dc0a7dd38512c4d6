"""Shared fixtures: a real broker per test module, a fresh settings builder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import Broker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """A real Kafka-compatible broker (tansu, memory storage) on a free loopback port."""
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path
