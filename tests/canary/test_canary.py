"""Canaries catch a silent model change exactly: a rotated copy of the model (identical intrinsic
metrics) on its first canary record, not float noise; pins persist, a file wins, re-pinning works."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitor.config import ConfigError, load_settings
from monitor.daemon.service import Monitor
from monitor.quality.intrinsic import report_from_matrix
from monitor.sources.base import SourceMessage
from tests.support.realdata import minilm_embeddings, random_rotation

MODEL = "minilm"
CANARIES = [f"canary-{i}" for i in range(5)]
TOKEN = "canary-admin-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    return minilm_embeddings(400)


@pytest.fixture
def monitors() -> Iterator[list[Monitor]]:
    made: list[Monitor] = []
    yield made
    for m in made:
        m.stop()


def daemon(made: list[Monitor], state_dir: Path, clock: Clock | None = None, models: dict | None = None,
           **canaries: Any) -> Monitor:
    settings = load_settings(overrides={
        "source": "synthetic", "state_dir": str(state_dir), "http": {"host": "127.0.0.1", "port": 0,
                                                                      "admin_token": TOKEN},
        "drift": {"enabled": False}, "window": {"seconds": 600, "subwindows": 6},
        "canaries": {"ids": {MODEL: CANARIES}, **canaries}, "models": models or {},
    })
    monitor = Monitor(settings, clock=clock or Clock())
    made.append(monitor)
    return monitor


def send(monitor: Monitor, rows: np.ndarray, ids: list[str]) -> None:
    monitor.pipeline.apply_messages([
        SourceMessage(orjson.dumps({"id": i, "model": MODEL, "vector": row.tolist()}), (), "embeddings")
        for i, row in zip(ids, rows, strict=True)
    ])


def samples(monitor: Monitor) -> dict[str, float]:
    for component in monitor.components:
        if component.name == "canary":
            component.publish()  # type: ignore[attr-defined]
    text = generate_latest(monitor.metrics_registry).decode()
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text) if f.name.startswith("embmon_canary")
        for s in f.samples if s.labels.get("model") == MODEL
    }


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_a_rotated_model_is_caught_on_its_first_canary_record_and_float_noise_is_not(
    tmp_path: Path, vectors: np.ndarray, monitors: list[Monitor]
) -> None:
    canary_rows, traffic = vectors[:5], vectors[5:]
    monitor = daemon(monitors, tmp_path)
    send(monitor, canary_rows, CANARIES)  # first sighting: pinned
    assert samples(monitor)["embmon_canary_pins"] == 5
    assert json.loads((tmp_path / "canary-pins.json").read_text())[MODEL].keys() == set(CANARIES)

    noisy = canary_rows + np.random.default_rng(1).normal(0, 1e-6, canary_rows.shape).astype(np.float32)
    for _ in range(3):  # the same texts re-encoded, with float noise as on other hardware
        send(monitor, noisy, CANARIES)
    quiet = samples(monitor)
    assert quiet["embmon_canary_mismatches_total"] == 0 and quiet["embmon_canary_records_total"] == 15
    assert quiet["embmon_canary_cosine_min"] > 1 - 1e-9

    variance = vectors.var(axis=0)
    dead = tuple(int(i) for i in np.flatnonzero(variance < 0.01 * variance.mean()))  # MiniLM's 3 dead channels
    rotated = (vectors @ random_rotation(vectors.shape[1], seed=3, keep=dead)).astype(np.float32)
    # the swap is invisible to every intrinsic metric...
    before, after = report_from_matrix(traffic), report_from_matrix(rotated[5:])
    for name in ("partition_isotropy", "effective_dimension", "effective_rank", "stable_rank",
                 "mean_cosine_similarity", "uniformity", "dead_dimensions"):
        assert getattr(after, name) == pytest.approx(getattr(before, name), rel=1e-6, abs=1e-9), name
    send(monitor, rotated[5:50], [f"doc-{i}" for i in range(45)])
    assert samples(monitor)["embmon_canary_mismatches_total"] == 0
    send(monitor, rotated[:1], CANARIES[:1])  # ...and the first canary record after it says so
    caught = samples(monitor)
    assert caught["embmon_canary_mismatches_total"] == 1
    assert caught["embmon_canary_cosine_min"] < 0.5


@pytest.mark.slow  # three daemons, over 5 s on the 2-core machine
def test_pins_survive_a_restart_and_a_pins_file_wins(tmp_path: Path, vectors: np.ndarray,
                                                      monitors: list[Monitor]) -> None:
    first = daemon(monitors, tmp_path / "state")
    send(first, vectors[:5], CANARIES)
    first.stop()
    restarted = daemon(monitors, tmp_path / "state")
    send(restarted, vectors[10:11], CANARIES[:1])  # a different vector under a pinned id
    assert samples(restarted)["embmon_canary_mismatches_total"] == 1

    pins = tmp_path / "pins.jsonl"
    pins.write_text(json.dumps({"model": MODEL, "id": CANARIES[0], "vector": vectors[10].tolist()}) + "\n")
    pinned = daemon(monitors, tmp_path / "state", pins_file=str(pins))
    send(pinned, vectors[10:11], CANARIES[:1])
    assert samples(pinned)["embmon_canary_mismatches_total"] == 0


@pytest.mark.parametrize(("line", "message"), [
    ("not json", "pins_file line 1: not JSON"),
    ('{"model": "minilm", "id": "canary-0"}', "expected exactly the keys model, id, vector"),
    ('{"model": "minilm", "id": "canary-0", "vector": [0, 0]}', "finite numbers, not all zero"),
    ('{"model": "minilm", "id": "other", "vector": [1, 0]}', "not listed in canaries.ids"),
])
def test_a_bad_pins_file_is_a_configuration_error_naming_the_line(tmp_path: Path, line: str, message: str) -> None:
    pins = tmp_path / "pins.jsonl"
    pins.write_text(line + "\n")
    with pytest.raises(ConfigError, match="canaries") as info:
        load_settings(overrides={"canaries": {"ids": {MODEL: CANARIES}, "pins_file": str(pins)}})
    assert message in str(info.value)


def test_repin_through_the_admin_endpoint_accepts_the_new_model_and_is_logged(
    tmp_path: Path, vectors: np.ndarray, monitors: list[Monitor], caplog: pytest.LogCaptureFixture
) -> None:
    from monitor.cli.main import main

    monitor = daemon(monitors, tmp_path / "state")
    monitor.start()
    send(monitor, vectors[:5], CANARIES)
    rotated = (vectors[:5] @ random_rotation(vectors.shape[1], seed=5)).astype(np.float32)
    send(monitor, rotated, CANARIES)
    assert samples(monitor)["embmon_canary_mismatches_total"] == 5

    request = urllib.request.Request(f"http://127.0.0.1:{monitor.http.port}/admin/canaries/repin?model={MODEL}",
                                     data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as denied:  # no token: refused
        urllib.request.urlopen(request, timeout=10)
    assert denied.value.code == 401
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with caplog.at_level(logging.WARNING, logger="monitor.canary.component"):
        code = main(["canary", "repin", "--url", f"http://127.0.0.1:{monitor.http.port}", "--token-file", str(token),
                     "--model", MODEL])
    assert code == 0
    assert any("replaced by an operator" in r.getMessage() for r in caplog.records)
    send(monitor, rotated, CANARIES)  # the new model's canaries now match their pins
    after = samples(monitor)
    assert after["embmon_canary_mismatches_total"] == 5 and after["embmon_canary_cosine_min"] > 1 - 1e-6
    assert main(["canary", "repin", "--url", f"http://127.0.0.1:{monitor.http.port}", "--token-file", str(token),
                 "--model", "unknown"]) == 1


# -- pins that would disable the canaries ------------------------------------------------------------


def _pins_json(vectors: dict[str, list[float]]) -> str:
    return json.dumps({MODEL: vectors})


@pytest.mark.parametrize(("content", "reason", "declared"), [
    ("{not json", "not JSON", None),
    (_pins_json({"canary-0": [1.0] * 384, "canary-1": [1.0] * 8}), "the pins of model minilm differ in dimension",
     None),
    (_pins_json({"canary-0": [0.0] * 384}), "minilm/canary-0: vector must be a list of at least 2 finite numbers",
     None),
    ('{"minilm": {"canary-0": [NaN, 1.0, 2.0]}}', "minilm/canary-0: vector must be", None),
    (_pins_json({"canary-0": [1.0] * 8}), "the pins of model minilm are 8-d, models.minilm.dim is 384", 384),
], ids=["not-json", "ragged", "zero", "nan", "8-d-for-a-384-d-model"])
def test_stored_pins_that_cannot_be_used_are_set_aside_and_the_canaries_still_catch_a_swap(
    tmp_path: Path, vectors: np.ndarray, monitors: list[Monitor], caplog: pytest.LogCaptureFixture,
    content: str, reason: str, declared: int | None, capsys: pytest.CaptureFixture[str],
) -> None:
    from monitor.cli.main import main

    state = tmp_path / "state"
    state.mkdir()
    (state / "canary-pins.json").write_text(content)
    # `canary show` reads no settings: only the declared dimension's mismatch is the daemon's to see
    assert main(["canary", "show", "--state-dir", str(state)]) == (0 if declared else 2)
    assert (reason in capsys.readouterr().err) is not bool(declared)
    monitor = daemon(monitors, state, models={MODEL: {"dim": declared}} if declared else {})
    [line] = [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]
    assert reason in line and "moved aside to canary-pins.json.rejected-" in line
    assert not (state / "canary-pins.json").exists() and len(list(state.glob("canary-pins.json.rejected-*"))) == 1
    text = generate_latest(monitor.metrics_registry).decode()
    assert 'embmon_state_files_rejected_total{file="canary_pins"} 1.0' in text
    send(monitor, vectors[:5], CANARIES)  # pinned afresh
    rotated = (vectors[:5] @ random_rotation(vectors.shape[1], seed=5)).astype(np.float32)
    send(monitor, rotated, CANARIES)  # before: cosine_min NaN and no mismatch with a zero or NaN pin
    caught = samples(monitor)
    assert caught["embmon_canary_mismatches_total"] == 5 and caught["embmon_canary_cosine_min"] < 0.5


def test_a_pins_file_of_another_dimension_is_refused_naming_the_model_or_never_replaced(
    tmp_path: Path, vectors: np.ndarray, monitors: list[Monitor], caplog: pytest.LogCaptureFixture
) -> None:
    pins = tmp_path / "pins.jsonl"
    pins.write_text(json.dumps({"model": MODEL, "id": CANARIES[0], "vector": [0.5] * 8}) + "\n")
    with pytest.raises(ConfigError, match=r"canaries.pins_file: minilm/canary-0 is pinned with a 8-d vector, "
                                          r"model minilm is 384-d \(models.minilm.dim\)"):
        daemon(monitors, tmp_path / "declared", pins_file=str(pins), models={MODEL: {"dim": 384}})
    # undeclared, the model's dimension shows with its first record: the pin is kept, every arrival mismatches
    monitor = daemon(monitors, tmp_path / "state", pins_file=str(pins))
    for _ in range(2):
        send(monitor, vectors[:1], CANARIES[:1])
    got = samples(monitor)
    assert got["embmon_canary_mismatches_total"] == 2 and got["embmon_canary_records_total"] == 2
    [line] = [r.getMessage() for r in caplog.records if "pinned 8-d" in r.getMessage()]
    assert "canary minilm/canary-0: a 384-d vector, pinned 8-d (canaries.pins_file): model minilm changed" in line


def test_a_ragged_pins_file_is_a_configuration_error(tmp_path: Path) -> None:
    pins = tmp_path / "pins.jsonl"
    pins.write_text("\n".join(json.dumps({"model": MODEL, "id": i, "vector": [1.0] * n})
                              for i, n in ((CANARIES[0], 384), (CANARIES[1], 8))) + "\n")
    with pytest.raises(ConfigError, match="pins_file line 2: a 8-d vector; model minilm's pins above are 384-d"):
        load_settings(overrides={"canaries": {"ids": {MODEL: CANARIES}, "pins_file": str(pins)}})
