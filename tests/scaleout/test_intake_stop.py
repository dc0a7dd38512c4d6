"""A reducer's intake that is stopped while its loop still builds a consumer closes that consumer.

Under load a group join or a bootstrap can outlast ``stop``'s wait for the intake's thread. The
consumer that build returns afterwards was assigned to the intake after ``stop`` had closed it, and
nothing closed it again: its broker socket surfaced as a ``ResourceWarning`` in a later test.
"""

from __future__ import annotations

import threading
from pathlib import Path

from monitor.config import load_settings
from monitor.daemon.counters import InternalErrors
from monitor.decoding.decoder import Decoder
from monitor.scaleout.intake import PartialsReader
from monitor.scaleout.table import MergeTable


class _Consumer:
    """Enough of a consumer for one idle poll: no partitions, and its closes counted."""

    def __init__(self) -> None:
        self.closed = 0

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set()

    def close(self, autocommit: bool = False) -> None:
        self.closed += 1


def test_a_consumer_built_after_stop_gave_up_waiting_is_closed(tmp_path: Path) -> None:
    settings = load_settings(overrides={
        "source": "kafka", "state_dir": str(tmp_path), "kafka": {"interactions_topic": None},
        "scale_out": {"role": "reducer"},
    })
    building, release = threading.Event(), threading.Event()
    consumer = _Consumer()

    def slow_build() -> _Consumer:  # a bootstrap or join that outlasts the stop's wait
        building.set()
        release.wait(10)
        return consumer

    intake = PartialsReader(settings, MergeTable(settings), Decoder(settings.limits), [], InternalErrors(),
                            consumer_factory=slow_build)  # type: ignore[arg-type]
    intake.start()
    assert building.wait(10)
    assert intake.stop(timeout=0.1) is False  # gave up: the thread is still in the build
    release.set()
    intake._thread.join(10)
    assert not intake.alive
    assert consumer.closed == 1
