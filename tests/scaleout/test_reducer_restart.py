"""The reducer's own state: restarted from its checkpoint it resumes exactly once; started without one
it catches up from the replicas' full publications (``2 x scale_out.full_publish_seconds`` back)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.scaleout.reducer import Reducer
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

PARTITIONS, DIM = 4, 12


def produce(broker: Broker, topic: str, rng: np.random.Generator, messages: int) -> np.ndarray:
    producer = broker.producer()
    blocks = []
    for i in range(messages):
        block = (rng.standard_normal((25, DIM)) + i % PARTITIONS).astype(np.float32)
        blocks.append(block)
        producer.send(topic, block.tobytes(), partition=i % PARTITIONS,
                      headers=[("model", b"m"), ("dim", str(DIM).encode())])
    producer.flush()
    producer.close()
    return np.concatenate(blocks)


@pytest.mark.slow
def test_a_restarted_and_a_fresh_reducer_both_end_exact(broker: Broker, tmp_path: Path) -> None:
    topic, partials = "emb-reducer-restart", "emb-reducer-restart-partials"
    broker.create_topics(topic, partitions=PARTITIONS)
    broker.create_topics(partials, partitions=1)

    def settings(state: str, **scale: object):  # type: ignore[no-untyped-def]
        return load_settings(overrides=kafka_daemon_overrides(
            broker, topic, "restart-scaled", tmp_path / state,
            window={"seconds": 3600, "subwindows": 4, "reservoir_size": 400},
            checkpoint={"interval_seconds": 0.5}, drift={"enabled": False},
            # every sub-window is re-sent every 4 s: a reducer without checkpoint reads 8 s back
            scale_out={"partials_topic": partials, "full_publish_seconds": 4, **scale},
        ))

    rng = np.random.default_rng(3)
    with contextlib.ExitStack() as running:
        for i in range(2):
            running.enter_context(daemons.monitor(settings(f"replica-{i}", role="replica", replica_id=f"replica-{i}")))
        first = running.enter_context(daemons.reducer(settings("reducer", role="reducer")))

        def merged(reducer: Reducer, n: int) -> bool:
            return value(scrape(reducer.http.port), "embmon_window_records", model="m", stream="default") == n

        head = produce(broker, topic, rng, 40)
        wait_until(lambda: merged(first, len(head)), timeout=90, message="the first reducer merged the first half")
        first.stop()  # writes its final checkpoint
        tail = produce(broker, topic, rng, 40)
        everything = np.concatenate([head, tail])

        again = running.enter_context(daemons.reducer(settings("reducer", role="reducer")))
        fresh = running.enter_context(daemons.reducer(settings("fresh-reducer", role="reducer")))
        assert again.checkpointer.restored_from is not None and fresh.checkpointer.restored_from is None
        for reducer in (again, fresh):
            wait_until(lambda r=reducer: merged(r, len(everything)), timeout=90, message="exact after restart")
            window = reducer.table.snapshot_windows(reducer.clock())[("m", "default")]
            np.testing.assert_allclose(window.stats.vector_sum, everything.astype(np.float64).sum(axis=0),
                                       rtol=1e-9, atol=1e-9)
        # the restarted one resumed after its checkpoint: it read little again
        applied = again.table.status(again.clock()).applied
        assert applied.get("manifest", 0) > 0
