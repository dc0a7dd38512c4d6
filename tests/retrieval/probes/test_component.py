"""The probe component: outcomes counted per probe, failures isolated, through the real daemon."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.deadline import Deadline
from monitor.decoding.records import InteractionEvent
from monitor.retrieval.probes.base import Probe, ProbeResult, sample
from monitor.retrieval.probes.component import ProbeComponent
from monitor.retrieval.probes.deadline import ProbeDeadline, ProbeError, ProbeTimeout
from tests.support import daemons
from tests.support.broker import free_port
from tests.support.probes import ListSource, SearchServer, collect, paused_jobs, probe_context
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until


class Scripted(Probe):
    """A probe whose runs do what the test says: succeed, raise, overrun, or pass the deadline."""

    def __init__(self, name: str, behaviour: str, timeout: float = 5.0):
        super().__init__(name, interval_seconds=1.0, timeout_seconds=timeout)
        self.behaviour = behaviour
        self.events = 0

    def on_interaction(self, event: InteractionEvent, now: float) -> None:
        if self.behaviour == "hook_raises":
            raise RuntimeError("hook bug")
        self.events += 1

    def run(self, deadline: Deadline) -> ProbeResult:
        if self.behaviour == "raises":
            raise ProbeError("endpoint down")
        if self.behaviour == "deadline":
            while True:
                deadline.check()
                time.sleep(0.01)  # the point: a run that works until its deadline stops it
        if self.behaviour == "overruns":  # ignores the deadline, finishes late
            time.sleep(self.timeout_seconds + 0.05)  # the point: work that outlasts the timeout
        return ProbeResult(samples=(sample("retrieval_gini", 0.25, probe=self.name, model="m"),))


def component(tmp_path: Path, probes: list[Probe], clock: Any = time.time) -> ProbeComponent:
    settings = load_settings(overrides={"state_dir": str(tmp_path)})
    return ProbeComponent(probe_context(settings, clock=clock), probes=probes)


def test_every_outcome_is_exported_from_the_start_and_counted(tmp_path: Path) -> None:
    probes = [Scripted("ok", "succeeds"), Scripted("bad", "raises"), Scripted("slow", "deadline", timeout=0.05),
              Scripted("late", "overruns", timeout=0.05)]
    comp = component(tmp_path, probes, clock=lambda: 1234.0)
    before = collect(comp)
    for name in ("ok", "bad", "slow", "late"):
        for outcome in ("success", "failure", "timeout"):
            assert value(before, "embmon_probe_runs_total", probe=name, outcome=outcome) == 0
        assert value(before, "embmon_probe_last_success_timestamp_seconds", probe=name) == 1234.0  # start time
    assert [j.name for j in comp.jobs()] == ["probe:ok", "probe:bad", "probe:slow", "probe:late"]
    assert [(j.interval_seconds, j.timeout_seconds) for j in comp.jobs()][2] == (1.0, 0.05)

    assert comp.run_probe("ok") is not None
    with pytest.raises(ProbeError, match="endpoint down"):  # re-raised so the daemon logs and counts it
        comp.run_probe("bad")
    assert comp.run_probe("slow") is None
    assert comp.run_probe("late") is None  # finished, but past its timeout: discarded
    after = collect(comp)
    expected = {"ok": "success", "bad": "failure", "slow": "timeout", "late": "timeout"}
    for name, outcome in expected.items():
        for other in ("success", "failure", "timeout"):
            assert value(after, "embmon_probe_runs_total", probe=name, outcome=other) == (other == outcome), name
        assert value(after, "embmon_probe_duration_seconds", probe=name) is not None
    assert value(after, "embmon_retrieval_gini", probe="ok", model="m") == 0.25
    assert value(after, "embmon_retrieval_gini", probe="late", model="m") is None  # its result was discarded
    assert value(after, "embmon_probe_duration_seconds", probe="slow") >= 0.05


def test_a_failing_run_keeps_the_previous_result(tmp_path: Path) -> None:
    probe = Scripted("p", "succeeds")
    comp = component(tmp_path, [probe])
    comp.run_probe("p")
    probe.behaviour = "raises"
    with pytest.raises(ProbeError):
        comp.run_probe("p")
    samples = collect(comp)
    assert value(samples, "embmon_retrieval_gini", probe="p", model="m") == 0.25
    assert value(samples, "embmon_probe_runs_total", probe="p", outcome="failure") == 1


def test_one_probes_hook_failure_does_not_starve_the_others(tmp_path: Path) -> None:
    broken, healthy = Scripted("broken", "hook_raises"), Scripted("healthy", "succeeds")
    comp = component(tmp_path, [broken, healthy])
    for _ in range(3):
        comp.on_interaction(InteractionEvent(model="m", results=("a",)), now=1.0)
    assert healthy.events == 3


def test_deadline_raises_probe_timeout_only_once_spent() -> None:
    now = [0.0]
    deadline = ProbeDeadline.starting_now(2.0, clock=lambda: now[0])
    deadline.check()
    now[0] = 1.9
    deadline.check()
    assert deadline.remaining() == pytest.approx(0.1)
    now[0] = 2.0
    with pytest.raises(ProbeTimeout, match="2s timeout"):
        deadline.check()


def test_the_daemon_schedules_component_jobs_unpaused(tmp_path: Path) -> None:
    settings = load_settings(overrides={"http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path)})
    factories = [lambda ctx: ProbeComponent(ctx, probes=[Scripted("p", "succeeds")])]
    with daemons.monitor(settings, source=ListSource(), component_factories=factories) as monitor:
        # APScheduler 3 adds a job with next_run_time=None paused: a probe job must not be added so
        assert paused_jobs(monitor) == []
        assert any(job.id == "probe:p" for job in monitor.jobs.scheduler.get_jobs())


def test_failing_and_timing_out_endpoints_fail_alone_through_the_daemon(tmp_path: Path) -> None:
    """Four golden probes in one daemon: a healthy endpoint, a slow one (the probe times out), one
    answering garbage and one that is down. Only the healthy one succeeds and exports quality."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((50, 8)).astype(np.float32)
    ids = [f"d{i}" for i in range(50)]
    golden = tmp_path / "golden.jsonl"
    golden.write_text("".join(json.dumps({"query_id": f"q{i}", "vector": docs[i].tolist(), "qrels": {ids[i]: 1}}) + "\n"
                              for i in range(12)))
    template = '{"vector": {{vector}}, "k": {{k}}}'
    with (
        SearchServer(ids, docs) as good,
        SearchServer(ids, docs, mode="slow", delay=0.3) as slow,
        SearchServer(ids, docs, mode="garbage") as garbage,
    ):
        def probe(name: str, url: str, timeout: float = 20.0) -> dict[str, Any]:
            return {"name": name, "file": str(golden), "model": "m", "k": [5], "interval_seconds": 0.4,
                    "timeout_seconds": timeout,
                    "retriever": {"kind": "http", "url": url, "request_template": template,
                                  "ids_path": "hits.hits[*]._id", "request_timeout_seconds": 2}}

        settings = load_settings(overrides={
            "http": {"host": "127.0.0.1", "port": 0}, "state_dir": str(tmp_path / "state"), "refresh_seconds": 0.5,
            "probes": {"statistics": {"resamples": 200}, "golden": [
                probe("good", good.url), probe("slow", slow.url, timeout=0.7), probe("garbage", garbage.url),
                probe("down", f"http://127.0.0.1:{free_port()}/search")]},
        })
        with daemons.monitor(settings, source=ListSource()) as monitor:
            port = monitor.http.port

            def all_ran() -> bool:
                s = scrape(port)
                return (
                    (value(s, "embmon_probe_runs_total", probe="good", outcome="success") or 0) >= 2
                    and (value(s, "embmon_probe_runs_total", probe="slow", outcome="timeout") or 0) >= 1
                    and (value(s, "embmon_probe_runs_total", probe="garbage", outcome="failure") or 0) >= 2
                    and (value(s, "embmon_probe_runs_total", probe="down", outcome="failure") or 0) >= 2
                )

            wait_until(all_ran, timeout=45, message="every probe ran")
            s = scrape(port)
    started = value(s, "embmon_probe_last_success_timestamp_seconds", probe="garbage")
    assert value(s, "embmon_probe_last_success_timestamp_seconds", probe="good") > started
    for name in ("slow", "garbage", "down"):
        assert value(s, "embmon_probe_runs_total", probe=name, outcome="success") == 0
        assert value(s, "embmon_retrieval_queries", probe=name, model="m", slice="all") is None
        assert value(s, "embmon_probe_last_success_timestamp_seconds", probe=name) == started
    assert value(s, "embmon_probe_runs_total", probe="good", outcome="failure") == 0
    assert value(s, "embmon_retrieval_mrr", probe="good", model="m", slice="all", k="5") == 1.0  # query = its document
    assert value(s, "embmon_retrieval_queries", probe="good", model="m", slice="all") == 12
    # the daemon's own job counter agrees with the probe's outcome
    assert value(s, "embmon_job_runs_total", job="probe:garbage", outcome="failure") >= 2
    assert value(s, "embmon_job_runs_total", job="probe:slow", outcome="timeout") >= 1


def filled_probes(tmp_path: Path) -> tuple[Callable[[], ProbeComponent], ProbeComponent, tuple[str, ...]]:
    """A click and an ANN probe with buffered events, a catalog and a vector cache; and a maker of empty twins."""
    from monitor.decoding.records import EmbeddingBatch

    rng = np.random.default_rng(3)
    docs = rng.standard_normal((40, 6)).astype(np.float32)
    ids = tuple(f"d{i}" for i in range(40))
    settings = load_settings(overrides={"state_dir": str(tmp_path), "probes": {
        "statistics": {"resamples": 50},
        "ann_recall": [{"name": "ann", "model": "m", "k": [3], "vector_cache_size": 30}],
        "clicks": [{"name": "clicks", "model": "m", "k": [3]}]}})

    def fresh() -> ProbeComponent:
        return ProbeComponent(probe_context(settings, clock=lambda: 500.0))

    comp = fresh()
    comp.on_embeddings(EmbeddingBatch("m", "documents", docs, ids=ids), now=400.0)
    for i in range(25):
        served = tuple(ids[j] for j in rng.choice(40, 3, replace=False))
        comp.on_interaction(
            InteractionEvent(
                model="m",
                query_id=f"q{i}",
                query_vector=docs[i] + 0.01,
                results=served,
                clicks=served[:1] if i % 3 else (),
                relevance={served[-1]: 2.0} if i % 5 == 0 else {},
                slice="head" if i % 2 else None,
                ts=float(i),
            ),
            now=450.0 + i,
        )
    return fresh, comp, ids


def test_probe_state_survives_a_checkpoint_round_trip(tmp_path: Path) -> None:
    """Buffered events, the catalog, the vector cache, run counters and last successes come back
    through the daemon's checkpoint encoding, and the restored probes compute the same numbers."""
    from monitor.storage import checkpoint_format as checkpoint

    fresh, comp, ids = filled_probes(tmp_path)
    before = {name: comp.run_probe(name) for name in ("ann", "clicks")}
    tree_arrays: list[np.ndarray] = []
    blob = checkpoint.encode(checkpoint.flatten(comp.state_dict(), tree_arrays), tree_arrays)

    restored = fresh()
    restored.load_state_dict(checkpoint.decode(blob))
    after = {name: restored.run_probe(name) for name in ("ann", "clicks")}
    for name in before:
        assert before[name] is not None and after[name] == before[name], name
    assert before["ann"].estimate("ann_recall", "m", 3) is not None
    # no window is published here: the ANN pool is the vector cache alone (the newest 30 documents)
    assert sorted(restored.probes["ann"].cache.snapshot()[0]) == sorted(ids[10:])  # type: ignore[attr-defined]
    assert restored.probes["clicks"].catalog.get("m") == set(ids)  # type: ignore[attr-defined]
    samples = collect(restored)
    assert value(samples, "embmon_probe_runs_total", probe="ann", outcome="success") == 2  # 1 restored + 1 new
    assert value(samples, "embmon_probe_last_success_timestamp_seconds", probe="clicks") == 500.0
    with pytest.raises(ValueError, match="unsupported probe state version"):
        fresh().load_state_dict({"version": 99})


def _probe(name: str) -> Callable[[dict], dict]:
    return lambda state: state["probes"][name]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["runs"][0].__setitem__(2, -4), "is -4, outside"),
        (lambda s: s["last_success"].__setitem__("ann", float("nan")), "last success of probe ann is nan"),
        (lambda s: _probe("ann")(s)["buffer"].__setitem__("dropped", -1), "dropped events is -1"),
        (lambda s: _probe("clicks")(s)["buffer"]["times"].__setitem__(3, np.inf), "times holds NaN or infinity"),
        (lambda s: _probe("clicks")(s)["buffer"]["items"][0][4].__setitem__("x", float("nan")), "relevance grade"),
        (lambda s: _probe("ann")(s)["buffer"]["items"]["vectors"].__setitem__((2, 0), np.nan), "query vector holds"),
        (lambda s: _probe("ann")(s)["cache"]["vectors"].__setitem__((0, 1), np.inf), "cached document vectors"),
    ],
    ids=["negative-runs", "nan-last-success", "negative-dropped", "infinite-time", "nan-grade", "nan-query",
         "infinite-cached-vector"],
)
def test_a_crafted_probe_state_is_refused_whole_and_the_probes_start_empty(
    tmp_path: Path, change: Callable[[dict], None], message: str
) -> None:
    """A checkpoint whose probe state holds values no run produces: the component raises (the
    checkpoint counts it ``invalid`` and keeps the windows) and not one probe keeps part of it."""
    fresh, comp, _ = filled_probes(tmp_path)
    comp.run_probe("ann")
    state = comp.state_dict()
    change(state)
    restored = fresh()
    with pytest.raises(ValueError, match=message):
        restored.load_state_dict(state)
    assert [len(p.buffer) for p in restored.probes.values()] == [0, 0]  # type: ignore[attr-defined]
    assert len(restored.probes["ann"].cache) == 0  # type: ignore[attr-defined]
    assert restored.probes["clicks"].catalog.get("m") is None  # type: ignore[attr-defined]
    assert value(collect(restored), "embmon_probe_runs_total", probe="ann", outcome="success") == 0


def test_a_probe_hook_that_raises_is_logged_once_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    """The retrieval and index probes call their hooks through logs.each_guarded on the ingest thread."""
    import logging

    from monitor.logs import RateLimitedLog, each_guarded

    class Hook:
        def __init__(self, name: str, fails: bool):
            self.name, self.fails, self.calls = name, fails, 0

        def on_embeddings(self, batch: object, now: float) -> None:
            self.calls += 1
            if self.fails:
                raise ValueError("boom")

    hooks = [Hook("a", True), Hook("b", False)]
    log = RateLimitedLog(logging.getLogger("test.hooks"), interval=60.0)
    with caplog.at_level(logging.WARNING, logger="test.hooks"):
        for _ in range(3):
            each_guarded(hooks, "on_embeddings", (None, 0.0), log, "probe")
    assert [h.calls for h in hooks] == [3, 3]
    assert [r.getMessage() for r in caplog.records] == ["probe a: on_embeddings failed"]
