"""The state directory fails under a running daemon (a real broker, ``python -m monitor run``): it
fills up, turns read-only (mid-run and at start), or is deleted. The daemon keeps consuming and
serving, counts each failed write, commits no offset past its newest checkpoint on disk, and a
daemon killed during the fault and restarted once it is gone counts every record exactly once."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from monitor.daemon.service import STALE_MIN_SECONDS
from monitor.storage import checkpoint_format as ckpt
from tests.support import daemons
from tests.support.broker import Broker, free_port
from tests.support.logs import tracebacks
from tests.support.mounts import fill, remount, tmpfs
from tests.support.scrape import http_answer, http_status, scrape, value
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROWS, DIM = 20, 16  # per message: a binary batch of model "bin"


class Stream:
    """Binary batches of known size written to two partitions, and the daemons that count them."""

    def __init__(self, broker: Broker, tmp_path: Path, name: str, state_dir: Path):
        self.broker, self.tmp_path, self.state_dir = broker, tmp_path, state_dir
        self.topic, self.group = f"emb-{name}", f"{name}-group"
        broker.create_topics(self.topic, partitions=2)
        self.producer = broker.producer()
        self.sent = 0
        self.port = free_port()
        self.logs: list[Path] = []
        self.rng = np.random.default_rng(0)

    def send(self, messages: int) -> None:
        headers = [("model", b"bin"), ("dim", str(DIM).encode())]
        for _ in range(messages):
            rows = self.rng.standard_normal((ROWS, DIM)).astype(np.float32)
            self.producer.send(self.topic, rows.tobytes(), headers=headers, partition=self.sent % 2)
            self.sent += 1
        self.producer.flush()

    def daemon(self) -> daemons.DaemonProcess:
        log = self.tmp_path / f"run-{len(self.logs)}.log"
        self.logs.append(log)
        return daemons.crash_tested(self.broker, self.topic, self.group, self.state_dir, log, port=self.port)

    def records(self) -> float:
        return value(scrape(self.port), "embmon_records_total", model="bin", stream="default") or 0

    def write_failures(self) -> float:
        return value(scrape(self.port), "embmon_checkpoint_write_failures_total", stage="write") or 0

    def all_counted(self) -> bool:
        """Every record sent is counted, and the consumer has nothing left to read (so a double count
        would show: a replayed poll lands before the lag reaches 0)."""
        samples = scrape(self.port)
        return (value(samples, "embmon_records_total", model="bin", stream="default") == self.sent * ROWS
                and value(samples, "embmon_consumer_lag_records", topic=self.topic) == 0)

    def committed(self) -> dict[int, int | None]:
        consumer = KafkaConsumer(bootstrap_servers=self.broker.bootstrap, group_id=self.group,
                                 enable_auto_commit=False)
        try:
            return {p: consumer.committed(TopicPartition(self.topic, p)) for p in (0, 1)}
        finally:
            consumer.close()

    def assert_commits_not_past_the_checkpoint(self) -> None:
        """The group's position on each partition is at most one past the newest checkpoint's offset."""
        durable = {p: o for t, p, o in ckpt.read_file(self.state_dir / ckpt.CURRENT)["offsets"] if t == self.topic}
        for partition, position in self.committed().items():
            assert position is None or position <= durable.get(partition, -1) + 1, (partition, position, durable)

    def assert_serving_through_the_fault(self, failures_before: float) -> None:
        """Records sent during the fault are counted, writes fail and are counted, the probes say healthy."""
        self.send(30)
        wait_until(lambda: self.records() == self.sent * ROWS, timeout=60, message="records counted during the fault")
        wait_until(lambda: self.write_failures() >= failures_before + 2, timeout=30, message="failed writes counted")
        assert http_status(self.port, "/healthz") == 200
        # ready, unless the fault outlasted the checkpoints' staleness bound (a loaded machine): then it says so
        status, body = http_answer(self.port, "/readyz")
        age = value(scrape(self.port), "embmon_checkpoint_age_seconds") or 0.0
        assert (status, body) == (200, "ready") or (
            status == 503 and body.startswith("checkpoint stale") and age > STALE_MIN_SECONDS), (status, body, age)
        self.assert_commits_not_past_the_checkpoint()

    def no_tracebacks(self) -> None:
        assert not [tb for log in self.logs for tb in tracebacks(log.read_text())]


@pytest.fixture
def state_tmpfs(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "state", "2m") as path:
        yield path


def checkpointed(stream: Stream) -> bool:
    samples = scrape(stream.port)
    return value(samples, "embmon_checkpoint_last_success_timestamp_seconds") is not None


def test_a_full_disk_costs_checkpoints_only_and_a_restart_counts_exactly(
    broker: Broker, tmp_path: Path, state_tmpfs: Path
) -> None:
    stream = Stream(broker, tmp_path, "full-disk", state_tmpfs)
    with stream.daemon() as daemon:
        stream.send(30)
        wait_until(lambda: stream.records() == stream.sent * ROWS and checkpointed(stream), timeout=60,
                   message="counted and checkpointed")
        filler = fill(state_tmpfs)
        stream.assert_serving_through_the_fault(stream.write_failures())
        # no failed write leaves its temporary file behind to keep the disk full
        assert sorted(p.name for p in state_tmpfs.iterdir()) == sorted([ckpt.CURRENT, ckpt.PREVIOUS, "filler"])
        assert daemon.kill() == -signal.SIGKILL  # a crash while nothing new is durable
    filler.unlink()
    with stream.daemon() as daemon:
        stream.send(20)
        wait_until(stream.all_counted, timeout=60, message="every record counted once after the restart")
        assert daemon.stop() == 0
    stream.no_tracebacks()


def test_a_read_only_state_dir_mid_run_and_at_start(broker: Broker, tmp_path: Path, state_tmpfs: Path) -> None:
    stream = Stream(broker, tmp_path, "read-only", state_tmpfs)
    with stream.daemon() as daemon:
        stream.send(30)
        wait_until(lambda: stream.records() == stream.sent * ROWS and checkpointed(stream), timeout=60,
                   message="counted and checkpointed")
        remount(state_tmpfs, "ro")
        stream.assert_serving_through_the_fault(stream.write_failures())
        assert daemon.kill() == -signal.SIGKILL
    with stream.daemon() as daemon:  # read-only at start: it restores, consumes, and cannot write
        wait_until(lambda: "restored state from" in daemon.output(), timeout=40, message="restored")
        stream.assert_serving_through_the_fault(0)
        assert daemon.kill() == -signal.SIGKILL
    remount(state_tmpfs, "rw")
    with stream.daemon() as daemon:
        stream.send(10)
        wait_until(stream.all_counted, timeout=60, message="every record counted once after the restart")
        assert daemon.stop() == 0
    stream.no_tracebacks()


def test_a_deleted_state_dir_is_made_again_and_a_restart_counts_exactly(broker: Broker, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    stream = Stream(broker, tmp_path, "deleted", state_dir)
    with stream.daemon() as daemon:
        stream.send(30)
        wait_until(lambda: stream.records() == stream.sent * ROWS and checkpointed(stream), timeout=60,
                   message="counted and checkpointed")
        shutil.rmtree(state_dir)
        stream.send(30)
        wait_until(lambda: stream.records() == stream.sent * ROWS, timeout=60, message="counted after the deletion")
        # the next checkpoint makes the directory again and holds everything applied
        wait_until(lambda: (state_dir / ckpt.CURRENT).exists() and stream.committed() == {0: 30, 1: 30},
                   timeout=30, message="checkpointed and committed again")
        assert http_status(stream.port, "/healthz") == 200
        stream.assert_commits_not_past_the_checkpoint()
        assert daemon.kill() == -signal.SIGKILL
    with stream.daemon() as daemon:
        stream.send(10)
        wait_until(stream.all_counted, timeout=60, message="every record counted once after the restart")
        assert daemon.stop() == 0
    stream.no_tracebacks()
