"""No single reducer: two reducer processes in a group share the streams, and one takes over when the other dies.

Three replica processes consume a 3-partition embeddings topic carrying four streams; their
partials go to a 2-partition partials topic, each stream's to one partition. Two reducer processes
(``scale_out.reducer_group``) each own one partition, so each merges and exports two streams:
every stream's gauges come from exactly one reducer, with exact counts. One reducer is SIGKILLed;
the group gives its partition to the other, which rebuilds those streams from the partials topic
and exports all four, with exact counts, within 60 s (the fail-over time is printed: it is bounded
below by the group's session timeout and, on tansu, by ``max_poll_interval_ms``). The killed reducer
then comes back with its checkpoint and the two share the streams again, the survivor dropping the
series of the partition it gave back. Throughout, every exact window gauge each reducer exports
equals a single daemon's that read the same topic, to 1e-9 relative (the largest relative
difference per gauge is printed).
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.config import load_settings
from monitor.scaleout.partials import partition_of
from tests.support import daemons
from tests.support.broker import Broker, kafka_daemon_overrides
from tests.support.scaleout import EXACT, WINDOW, reducer_process, replica
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

STREAMS = ("s0", "s1", "s2", "s3")  # two on each partials partition
DIM, ROWS, BATCHES = 16, 20, 6
FAIL_OVER_LIMIT_SECONDS = 60


def produce(broker: Broker, topic: str, seed: int) -> dict[str, int]:
    """Binary batches of every stream over every partition; rows produced per stream."""
    rng = np.random.default_rng(seed)
    producer = broker.producer()
    counts = dict.fromkeys(STREAMS, 0)
    for i in range(BATCHES):
        for stream in STREAMS:
            block = rng.standard_normal((ROWS, DIM)).astype(np.float32) + STREAMS.index(stream)
            producer.send(topic, block.tobytes(), partition=i % 3,
                          headers=[("model", b"m"), ("dim", str(DIM).encode()), ("stream", stream.encode())])
            counts[stream] += ROWS
    producer.flush()
    producer.close()
    return counts


def exported(port: int) -> dict[str, float]:
    """The window records of every stream this reducer exports."""
    samples = scrape(port)
    return {s: n for s in STREAMS if (n := value(samples, "embmon_window_records", model="m", stream=s)) is not None}


def differences(port: int, single: int, streams: set[str], worst: dict[str, float]) -> None:
    """Every exact gauge of ``streams`` on this reducer against the single daemon's: equal to 1e-9
    relative; ``worst`` keeps the largest relative difference per gauge."""
    got, want = scrape(port), scrape(single)
    for stream in sorted(streams):
        for name in EXACT:
            a = value(got, f"embmon_{name}", model="m", stream=stream)
            b = value(want, f"embmon_{name}", model="m", stream=stream)
            assert a is not None and b is not None, (stream, name)
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), (stream, name)
            worst[name] = max(worst.get(name, 0.0), abs(a - b) / max(abs(b), 1e-300))


def owned(port: int) -> set[str]:
    samples = scrape(port)
    return {s for s in STREAMS if value(samples, "embmon_reducer_stream_owned", model="m", stream=s) == 1}


@pytest.mark.slow
def test_two_reducers_share_the_streams_and_one_takes_over(broker: Broker, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    topic, partials = "emb-group", "emb-group-partials"
    broker.create_topics(topic, partitions=3)
    broker.create_topics(partials, partitions=2)
    assert sorted(partition_of("m", s, [0, 1]) for s in STREAMS) == [0, 0, 1, 1]
    for key, setting in WINDOW.items():
        monkeypatch.setenv(f"EMBMON_WINDOW__{key.upper()}", str(setting))
    monkeypatch.setenv("EMBMON_SCALE_OUT__PARTIALS_TOPIC", partials)
    monkeypatch.setenv("EMBMON_SCALE_OUT__ROLE", "replica")
    with contextlib.ExitStack() as running:
        replicas = [running.enter_context(replica(broker, topic, f"replica-{i}", tmp_path / f"r{i}",
                                                  tmp_path / f"r{i}.log", group=f"{topic}-replicas"))
                    for i in range(3)]
        reducers = [running.enter_context(reducer_process(broker, topic, partials, tmp_path / f"reducer-{i}",
                                                          tmp_path / f"reducer-{i}.log"))
                    for i in range(2)]
        single = running.enter_context(daemons.crash_tested(broker, topic, f"{topic}-single", tmp_path / "single",
                                                            tmp_path / "single.log",
                                                            env={"EMBMON_SCALE_OUT__ROLE": "single"}))
        expected = produce(broker, topic, seed=1)

        def shared_exactly() -> bool:
            views = [exported(r.port) for r in reducers]
            return (all(len(v) == 2 for v in views) and set(views[0]) | set(views[1]) == set(STREAMS)
                    and {**views[0], **views[1]} == expected)

        wait_until(shared_exactly, timeout=120,
                   message="each reducer exports two streams, every stream once, with exact counts")
        assert [owned(r.port) for r in reducers] == [set(exported(r.port)) for r in reducers]
        worst: dict[str, float] = {}
        wait_until(lambda: exported(single.port) == expected, timeout=60, message="the single daemon counted all")
        for r in reducers:
            differences(r.port, single.port, set(exported(r.port)), worst)
        for r in reducers:
            assert value(scrape(r.port), "embmon_reducer_partitions_owned") == 1
            assert value(scrape(r.port), "embmon_reducer_replicas", state="live") == 3

        victim, survivor = reducers
        assert victim.kill() == -signal.SIGKILL
        killed_at = time.monotonic()
        wrong: list[dict[str, float]] = []

        def took_over() -> bool:
            """All four exported, exact; and no stream ever exported with another count meanwhile."""
            seen = exported(survivor.port)
            if any(expected[s] != n for s, n in seen.items()):
                wrong.append(seen)
            return seen == expected

        wait_until(took_over, timeout=FAIL_OVER_LIMIT_SECONDS + 30, interval=0.1,
                   message="the surviving reducer exports all four streams with exact counts")
        fail_over = time.monotonic() - killed_at
        assert not wrong, f"partial counts exported while taking over: {wrong[:3]} (produced {expected})"
        print(f"reducer fail-over: all 4 streams exported, exact, {fail_over:.1f} s after the SIGKILL")
        assert fail_over <= FAIL_OVER_LIMIT_SECONDS
        assert owned(survivor.port) == set(STREAMS)

        # the survivor keeps merging what the replicas publish next, still exactly
        more = produce(broker, topic, seed=2)
        expected = {s: n + more[s] for s, n in expected.items()}
        wait_until(lambda: exported(survivor.port) == expected, timeout=90,
                   message="the survivor's counts follow new records exactly")
        wait_until(lambda: exported(single.port) == expected, timeout=60, message="the single daemon counted all")
        differences(survivor.port, single.port, set(STREAMS), worst)
        samples = scrape(survivor.port)
        assert value(samples, "embmon_reducer_partitions_owned") == 2
        rebalances = value(samples, "embmon_reducer_rebalances_total") or 0
        assert rebalances >= 1

        # the victim comes back with its checkpoint: the group gives it a partition again, the
        # survivor drops that partition's streams from its /metrics, and each exports two, exactly
        back = running.enter_context(reducer_process(broker, topic, partials, tmp_path / "reducer-0",
                                                     tmp_path / "reducer-0-back.log"))
        reducers = [back, survivor]
        wait_until(shared_exactly, timeout=120,
                   message="back to two streams each, every stream once, with exact counts")
        assert (value(scrape(survivor.port), "embmon_reducer_rebalances_total") or 0) > rebalances
        assert [owned(r.port) for r in reducers] == [set(exported(r.port)) for r in reducers]
        for r in reducers:
            differences(r.port, single.port, set(exported(r.port)), worst)
        print("largest relative difference per gauge, reducers vs single daemon: "
              + ", ".join(f"{name} {d:.1e}" for name, d in sorted(worst.items())))
        assert all(p.returncode is None for p in replicas)


@pytest.mark.slow  # about 7 s alone, two group joins: kept out of the fast tier's budget
def test_in_a_group_each_model_level_gauge_comes_from_one_reducer_that_read_every_interaction(
        broker: Broker, tmp_path: Path) -> None:
    """Each reducer of the group reads the whole interactions topic (its own consumer, by
    assignment); ``embmon_interactions_total`` and the clicks probe's estimates of model m are
    exported by the owner of m's first stream (s0) alone, with every event counted."""
    topic, partials, interactions = "emb-group-int", "emb-group-int-partials", "emb-group-int-interactions"
    broker.create_topics(topic, partitions=3)
    broker.create_topics(partials, partitions=2)
    broker.create_topics(interactions)

    def settings(name: str, **scale: object):  # type: ignore[no-untyped-def]
        return load_settings(overrides=kafka_daemon_overrides(
            broker, topic, f"{topic}-replicas", tmp_path / name,
            kafka={"interactions_topic": interactions}, window=WINDOW, checkpoint={"interval_seconds": 0.5},
            drift={"enabled": False},
            probes={"clicks": [{"name": "clicks", "k": [5], "catalog_stream": None, "catalog_size": 100,
                                "interval_seconds": 3600}]},
            scale_out={"partials_topic": partials, **scale}))

    with contextlib.ExitStack() as running:
        running.enter_context(daemons.monitor(settings("replica", role="replica", replica_id="replica-0")))
        reducers = [running.enter_context(daemons.reducer(settings(f"reducer-{i}", role="reducer",
                                                                   reducer_group=f"{topic}-reducers")))
                    for i in range(2)]
        expected = produce(broker, topic, seed=3)
        producer = broker.producer()
        events = 40
        for q in range(events):
            results = [f"doc-{(q + i) % 50}" for i in range(5)]
            event = {"query_id": f"q{q}", "model": "m", "results": results, "clicks": results[:1] if q % 2 else []}
            producer.send(interactions, orjson.dumps(event))
        producer.flush()
        producer.close()

        def counted() -> list[float | None]:
            return [value(scrape(r.http.port), "embmon_interactions_total", model="m") for r in reducers]

        wait_until(lambda: sorted(map(len, (exported(r.http.port) for r in reducers))) == [2, 2]
                   and sorted(counted(), key=lambda v: v or 0) == [None, events], timeout=90,
                   message="two streams each, and m's interactions counted by one reducer, all of them")
        (owner,) = [r for r, n in zip(reducers, counted(), strict=True) if n == events]
        assert "s0" in owned(owner.http.port)  # the owner of m's first stream
        other = next(r for r in reducers if r is not owner)
        assert other.intake.interactions.snapshot().get("m") == events  # it read them too: warm if m moves
        for r in reducers:
            next(c for c in r.components if c.name == "probes").run_probe("clicks")  # type: ignore[attr-defined]
        estimates = [{name for name, _ in scrape(r.http.port) if name.startswith("embmon_retrieval_")}
                     for r in (owner, other)]
        assert estimates[0] and not estimates[1]
        assert sum(exported(r.http.port).get(s, 0) for r in reducers for s in STREAMS) == sum(expected.values())
