"""A replica SIGKILLed and restarted mid-stream: the reducer's counts end exact, nothing lost or doubled.

Two replica processes (``embedding-monitor run --role replica``) share the embeddings topic's
partitions; the crash tests' producer (``KnownSequence``) writes its known sequence over ~40 s
(binary batches, JSON events, some invalid records); one replica is SIGKILLed at seeded random
moments while it consumes, checkpoints and publishes, and restarted. Its partitions move to the
other replica meanwhile and back when it returns. At the end the reducer's merged window
holds every record exactly once: counts equal what was produced and the exact window metrics equal
those of the whole matrix (the window is long enough to hold the whole stream).
"""

from __future__ import annotations

import contextlib
import random
import re
import signal
import time
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.daemon import failpoints
from monitor.quality.intrinsic import report_from_matrix
from monitor.scaleout.marker import PublishedMarker
from tests.support import daemons
from tests.support.broker import CLIENTS, Broker, listening
from tests.support.logs import tracebacks
from tests.support.producers import KnownSequence
from tests.support.scaleout import (
    EXACT,
    exact_counts_in,
    produced,
    replica,
    scaled_settings,
    wait_for_exact_counts,
    wait_for_further_publications,
)
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

KILLS = 3


@pytest.mark.slow
@pytest.mark.parametrize("client", CLIENTS)
def test_a_replica_killed_mid_stream_leaves_the_reducer_exact(broker: Broker, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    topic = f"emb-scaled-crash-{client}"
    rng = random.Random(20261122)
    logs: list[Path] = []
    killed_mid_stream = 0
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(scaled_settings(monkeypatch, broker, topic,
                                                                        f"crash-scaled-{client}", tmp_path)))
        steady = running.enter_context(replica(broker, topic, "replica-b", tmp_path / "b", tmp_path / "b.log",
                                               group=f"crash-scaled-{client}", client=client))
        wait_until(lambda: "assigned partitions" in steady.output(), timeout=60, message="the steady replica joined")
        producer = running.enter_context(KnownSequence(broker, topic))
        for kill in range(KILLS):
            log = tmp_path / f"a-{kill}.log"
            logs.append(log)
            with replica(broker, topic, "replica-a", tmp_path / "a", log, group=f"crash-scaled-{client}",
                         client=client) as victim:
                wait_until(lambda: "assigned partitions: [(" in victim.output(), timeout=60,
                           message="the victim got partitions")
                time.sleep(rng.uniform(0.5, 3.0))  # the point: killed at random while it consumes and commits
                killed_mid_stream += producer.is_alive()
                assert victim.kill() == -signal.SIGKILL
            time.sleep(rng.uniform(0.0, 4.0))  # the point: a random outage; its partitions may move meanwhile
        logs.append(tmp_path / "a-final.log")
        victim = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", logs[-1],
                                               group=f"crash-scaled-{client}", client=client))
        expected = produced(producer)

        wait_for_exact_counts(reducer.http.port, expected)
        # both replicas keep publishing: a doubled or lost publication would show within a few cycles
        wait_for_further_publications(reducer)
        samples = scrape(reducer.http.port)
        # the replicas' own ingest counters (checkpointed with their state) add up exactly too, once the last
        # victim has restored its state (the reducer can be exact before: the earlier victims published)
        for daemon in (steady, victim):  # a replica that died or never bound its port: say why, with its log
            wait_until(lambda d=daemon: listening(d.port) or d.returncode is not None, timeout=60,
                       message=f"a replica's metrics port {daemon.port}")
            assert daemon.returncode is None, f"a replica exited {daemon.returncode}:\n{daemon.output()[-3000:]}"

        def invalid_counts() -> list[float]:
            return [value(scrape(port), "embmon_records_invalid_total", stream="default", reason="bad_binary") or 0
                    for port in (steady.port, victim.port)]

        with contextlib.suppress(AssertionError):
            wait_until(lambda: sum(invalid_counts()) == producer.invalid, timeout=60, message="invalid counts")
        invalid = invalid_counts()

    assert exact_counts_in(samples, expected)
    assert sum(invalid) == producer.invalid
    assert killed_mid_stream >= 2
    text = [log.read_text() for log in logs]
    restored = [int(n) for t in text for n in re.findall(r"restored state from \S+ \((\d+) streams", t)]
    assert sum(n > 0 for n in restored) >= 2, restored  # restarts resumed from checkpoints
    assert not [tb for t in text + [(tmp_path / "b.log").read_text()] for tb in tracebacks(t)]
    settings = load_settings().quality
    for model, matrix in (("bin", producer.bin_rows.reshape(-1, producer.DIM_BIN)), ("json", producer.json_rows)):
        want = report_from_matrix(matrix, settings=settings)
        for name in EXACT:
            got = value(samples, f"embmon_{name}", model=model, stream="default")
            assert got == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-12), (model, name)
        assert value(samples, "embmon_dead_dimensions", model=model, stream="default") == want.dead_dimensions
    assert value(samples, "embmon_reducer_replicas", state="live") == 2


GAP_GROUP = "gap-scaled"


@pytest.mark.slow
def test_a_replica_killed_between_its_commit_and_its_marker_loses_nothing(broker: Broker, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowest crash window: the group's offsets moved to a publication the marker does not
    name yet. The other replica resumes from those offsets, so the restarted replica must restore
    that publication's checkpoint, not the one before (which would lose the records in between)."""
    topic = "emb-scaled-gap"
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(scaled_settings(monkeypatch, broker, topic, GAP_GROUP,
                                                                        tmp_path)))
        producer = running.enter_context(KnownSequence(broker, topic))
        victim = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", tmp_path / "a-0.log",
                                               GAP_GROUP, env={"EMBMON_FAILPOINT": "replica-committed@5"}))
        assert victim.wait(timeout=90) == failpoints.EXIT_STATUS  # died right after a commit, before its marker
        marker = PublishedMarker(tmp_path / "a").read()
        assert marker is not None and marker.committing is not None and marker.committing.epoch > marker.epoch
        steady = running.enter_context(replica(broker, topic, "replica-b", tmp_path / "b", tmp_path / "b.log",
                                               GAP_GROUP))
        # the other replica takes every partition and resumes from the offsets the victim committed
        wait_until(lambda: "assigned partitions: [(" in steady.output(), timeout=60,
                   message="the steady replica got partitions")
        wait_until(lambda: value(scrape(steady.port), "embmon_records_total", model="bin", stream="default"),
                   timeout=60, message="the steady replica consuming from the victim's offsets")
        running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", tmp_path / "a-1.log", GAP_GROUP))
        expected = produced(producer)
        wait_until(lambda: exact_counts_in(scrape(reducer.http.port), expected), timeout=120,
                   message="the reducer's counts reach what was produced")
        wait_for_further_publications(reducer)
        samples = scrape(reducer.http.port)
    assert exact_counts_in(samples, expected)
    restart_log = (tmp_path / "a-1.log").read_text()
    assert f"the commit of epoch {marker.committing.epoch} went through before the restart" in restart_log
    assert not [tb for name in ("a-1.log", "b.log") for tb in tracebacks((tmp_path / name).read_text())]
