"""Crash safety: the daemon is SIGKILLed at seeded random moments while a producer writes a known
sequence; after the restarts every record is counted exactly once and the window metrics are
those of an uninterrupted run.

Exact (compared to 1e-6): everything computed from the window's sufficient statistics, i.e. the
record counters, embmon_records_invalid_total and the spectral/norm/cosine gauges. Not compared:
embmon_uniformity and embmon_sample_records, which depend on which rows the reservoir kept (the
reservoir's RNG state is restored, but the batches it sees depend on how polls were cut).
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.quality.intrinsic import report_from_matrix
from tests.support import daemons
from tests.support.broker import CLIENTS, Broker, free_port
from tests.support.logs import tracebacks
from tests.support.producers import KnownSequence
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

KILLS = 6
EXACT = ("partition_isotropy", "effective_dimension", "mean_cosine_similarity", "vector_norm_mean",
         "vector_norm_stddev", "effective_rank", "stable_rank", "top10_variance_ratio")


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_sigkill_at_random_moments_counts_every_record_exactly_once(
    broker: Broker, tmp_path: Path, client: str
) -> None:
    topic, group = f"emb-crash-{client}", f"crash-group-{client}"
    broker.create_topics(topic, partitions=2)
    state_dir, port = tmp_path / "state", free_port()
    rng = random.Random(20240607)
    seen_before_kill: list[float] = []
    # the stream is written only while a daemon runs, so every kill lands mid-stream however long a
    # start takes on a busy machine
    writing = threading.Event()
    with KnownSequence(broker, topic, gate=writing) as producer:
        for kill in range(KILLS):
            log = tmp_path / f"run-{kill}.log"
            with daemons.crash_tested(broker, topic, group, state_dir, log, port=port, client=client) as daemon:
                wait_until(lambda: "assigned partitions" in daemon.output(), timeout=40, message="partitions assigned")
                writing.set()
                time.sleep(rng.uniform(0.05, 2.5))  # the point: killed at random while it consumes and commits
                writing.clear()
                with_records = scrape(port)
                seen_before_kill.append(value(with_records, "embmon_records_total", model="bin", stream="default") or 0)
                assert daemon.kill() == -signal.SIGKILL
        writing.set()
        producer.join(timeout=90)
    assert producer.error is None

    log = tmp_path / "final.log"
    with daemons.crash_tested(broker, topic, group, state_dir, log, port=port, client=client) as daemon:
        expected_bin = producer.MESSAGES * 20

        def done() -> bool:
            s = scrape(port)
            return (value(s, "embmon_records_total", model="bin", stream="default") == expected_bin
                    and value(s, "embmon_records_total", model="json", stream="default") == producer.MESSAGES
                    and value(s, "embmon_window_records", model="bin", stream="default") == expected_bin)

        wait_until(done, timeout=120, message="all records counted after the restarts")
        time.sleep(1.5)  # the point: no replayed (double-counted) poll lands within 1.5 s (nothing to wait for)
        samples = scrape(port)
        assert daemon.stop(timeout=15) == 0

    # the kills did interrupt consumption mid-stream, and restarts resumed from checkpoints
    assert sum(0 < seen < expected_bin for seen in seen_before_kill) >= 3, seen_before_kill
    logs = [(tmp_path / f"run-{k}.log").read_text() for k in range(KILLS)] + [log.read_text()]
    restored = [int(n) for text in logs for n in re.findall(r"restored state from \S+ \((\d+) streams", text)]
    assert sum(n > 0 for n in restored) >= 3, restored
    assert not [tb for text in logs for tb in tracebacks(text)]

    assert value(samples, "embmon_records_total", model="bin", stream="default") == expected_bin
    assert value(samples, "embmon_records_total", model="json", stream="default") == producer.MESSAGES
    assert value(samples, "embmon_records_invalid_total", stream="default", reason="bad_binary") == producer.invalid
    settings = load_settings().quality
    for model, matrix in (("bin", producer.bin_rows.reshape(-1, producer.DIM_BIN)), ("json", producer.json_rows)):
        expected = report_from_matrix(matrix, settings=settings)
        for name in EXACT:
            got = value(samples, f"embmon_{name}", model=model, stream="default")
            assert got == pytest.approx(getattr(expected, name), rel=1e-6, abs=1e-9), (model, name)
        assert value(samples, "embmon_window_records", model=model, stream="default") == matrix.shape[0]
        assert value(samples, "embmon_dead_dimensions", model=model, stream="default") == expected.dead_dimensions
