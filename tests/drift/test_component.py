"""The drift component without a broker: references (first N, pinned, stored, lagged), cycles, checkpoints.

Records go through a real ``StateRegistry`` (the windows the refresh would publish) and the
component's ingest hook; the clock is injected, so capture times and lagged picks are exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from river import drift as river_drift

from monitor.cli.main import build_parser, settings_from_args
from monitor.config import ConfigError, Settings, deep_merge, load_settings
from monitor.drift.online.online_state import decode_detector, encode_detector
from monitor.drift.references.lagged import LAGGED_DIR
from monitor.drift.references.profile import ReferenceProfile
from monitor.drift.references.store import ReferenceStore, StoredReference
from monitor.storage import checkpoint_format as ckpt
from tests.support.drift import BASE_DRIFT, DIM, Harness, axis, settings_for, unit_rows


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(11)


def test_first_records_become_the_reference_exactly_and_are_stored(tmp_path: Path, rng: np.random.Generator) -> None:
    h = Harness(settings_for(tmp_path / "state"))
    rows = unit_rows(rng, 470, axis(0))
    h.feed("m", "s", rows, batch=70)  # the 300th record falls inside the fifth batch
    ref = h.component.reference("m", "s")
    assert ref is not None and ref.count == 300 and ref.source == "first 300 records"
    np.testing.assert_allclose(ref.centroid, rows[:300].mean(axis=0, dtype=np.float64), rtol=1e-12, atol=1e-15)
    assert ref.sample.shape == (300, DIM)  # all of them: fewer than 2 x reference_sample_size
    assert {tuple(r) for r in ref.sample} == {tuple(r) for r in rows[:300]}
    # the detectors saw exactly the records after the reference
    assert h.component._streams[("m", "s")].online.records_seen == 170
    assert h.value("embmon_reference_records", model="m", stream="s") == 300
    assert h.value("embmon_reference_timestamp_seconds", model="m", stream="s") == 1_000.0
    assert h.value("embmon_drift_change_points_total", model="m", stream="s", signal="cosine", detector="adwin") == 0
    h.component.flush()
    stored = ReferenceStore(tmp_path / "state").load_all()[("m", "s")]
    assert stored.origin == "first_records" and stored.profile.count == 300
    np.testing.assert_array_equal(stored.profile.sample, ref.sample)
    # a stored file is itself a pinnable reference
    assert ReferenceProfile.from_npz(stored.path).count == 300
    h.close()


def test_a_cycle_tests_each_window_once_and_flags_a_shift(tmp_path: Path, rng: np.random.Generator) -> None:
    # the suite's sustained rule alone: an evidence alarm is an alert on its own (test_evidence_daemon.py)
    h = Harness(settings_for(tmp_path / "state", sustained={"detections": 2, "cycles": 3}, evidence_share=0))
    h.feed("m", "s", unit_rows(rng, 600, axis(0)))
    assert h.component.run_cycle() == {}  # nothing published yet
    h.publish()
    first = h.component.run_cycle()[("m", "s")]
    assert not first.report.detected and not first.sustained
    assert h.value("embmon_drift_detected", model="m", stream="s", test="suite") == 0
    assert h.component.run_cycle()[("m", "s")] is first  # the same window is not tested twice
    # a new model's vectors: the mean turns
    h.now += 61
    h.feed("m", "s", unit_rows(rng, 600, axis(0) + 1.5 * axis(1)))
    h.publish()
    second = h.component.run_cycle()[("m", "s")]
    assert second.report.detected and not second.sustained  # 1 of the last 3 cycles
    h.now += 1
    h.publish()
    third = h.component.run_cycle()[("m", "s")]
    assert third.report.detected and third.sustained  # 2 of the last 3
    s = h.samples()
    labels = {"model": "m", "stream": "s"}

    def v(name: str, **extra: str) -> float:
        return s[(name, frozenset({**labels, **extra}.items()))]

    assert v("embmon_drift_detected", test="suite") == 1 and v("embmon_drift_detected", test="sustained") == 1
    for test in ("mmd", "ks", "centroid", "classifier"):
        result = third.report.result(test)
        assert v("embmon_drift_p_value", test=test) == result.p_value
        assert v("embmon_drift_threshold", test=test) == result.threshold
    assert v("embmon_drift_p_value", test="suite") <= v("embmon_drift_threshold", test="suite")
    assert v("embmon_drift_threshold", test="suite") == pytest.approx(h.settings.drift.cycle_alpha)
    assert v("embmon_drift_mmd2") == third.report.result("mmd").statistic > 0
    assert v("embmon_drift_centroid_cosine_distance") > 0.05
    assert 0.8 < v("embmon_drift_classifier_auc") <= 1
    assert 0 < v("embmon_drift_drifted_components_ratio") <= 1
    h.close()


def test_too_small_a_window_is_not_tested(tmp_path: Path, rng: np.random.Generator) -> None:
    h = Harness(settings_for(tmp_path / "state", reference={"records": 100}))
    h.feed("m", "s", unit_rows(rng, 150, axis(0)))  # min_records is 200
    h.publish()
    assert h.component.run_cycle() == {}
    assert h.value("embmon_reference_records", model="m", stream="s") == 100
    h.close()


def write_references(tmp_path: Path, rng: np.random.Generator) -> tuple[Path, Path, Path]:
    npz = tmp_path / "global.npz"
    ReferenceProfile.from_sample(unit_rows(rng, 120, axis(2)), captured_at=111.0, source="test npz").to_npz(npz)
    npy = tmp_path / "one.npy"
    np.save(npy, unit_rows(rng, 90, axis(3)))
    small = tmp_path / "small.npy"
    np.save(small, unit_rows(rng, 50, axis(0, 8), 0.5))
    return npz, npy, small


def check_pins(h: Harness, rng: np.random.Generator, npy: Path) -> None:
    """global.npz for every d=16 stream; one.npy for m2/s only; d=8 streams fall back to first records."""
    for model in ("m1", "m2", "m3"):
        h.feed(model, "s", unit_rows(rng, 60, axis(0)))
    h.feed("m2", "other", unit_rows(rng, 60, axis(0)))
    h.feed("small", "s", unit_rows(rng, 130, axis(0, 8)))
    keys = [("m1", "s"), ("m2", "s"), ("m3", "s"), ("m2", "other"), ("small", "s")]
    refs = {k: h.component.reference(*k) for k in keys}
    assert refs[("m1", "s")].count == 120 and refs[("m1", "s")].source == "test npz"
    assert refs[("m3", "s")] is refs[("m1", "s")]
    assert refs[("m2", "other")] is refs[("m1", "s")]
    assert refs[("m2", "s")].count == 90 and refs[("m2", "s")].source == f"pinned {npy}"
    assert refs[("m2", "s")].captured_at == npy.stat().st_mtime
    # the d=16 file does not fit: first records instead (reference.records = 100 here)
    assert refs[("small", "s")].count == 100 and refs[("small", "s")].source == "first 100 records"
    assert h.value("embmon_reference_timestamp_seconds", model="m1", stream="s") == 111.0
    h.component.flush()
    stored = ReferenceStore(h.settings.state_dir).load_all()
    assert {k: r.origin for k, r in stored.items()} == {
        ("m1", "s"): "pinned", ("m2", "s"): "pinned", ("m3", "s"): "pinned", ("m2", "other"): "pinned",
        ("small", "s"): "first_records",
    }


def test_pinned_references_from_run_flags(tmp_path: Path, rng: np.random.Generator) -> None:
    npz, npy, _ = write_references(tmp_path, rng)
    args = build_parser().parse_args(
        ["run", "--source", "synthetic", "--state-dir", str(tmp_path / "state"), "--reference", str(npz),
         "--reference", f"m2/s={npy}", "--reference-records", "100"]
    )
    settings = settings_from_args(args)
    assert settings.drift.reference.path == npz
    assert settings.drift.reference.pinned == {"m2/s": npy}
    assert settings.drift.reference.records == 100
    settings = Settings.model_validate(
        deep_merge(settings.model_dump(), {"drift": deep_merge(BASE_DRIFT, {"reference": {"records": 100}})})
    )
    h = Harness(settings)
    check_pins(h, rng, npy)
    h.close()


def test_pinned_references_from_the_config_file(tmp_path: Path, rng: np.random.Generator) -> None:
    npz, npy, small = write_references(tmp_path, rng)
    config = tmp_path / "embmon.yaml"
    drift = deep_merge(BASE_DRIFT, {"reference": {"records": 100, "path": str(npz), "pinned": {"m2/s": str(npy)}}})
    config.write_text(yaml.safe_dump({"source": "synthetic", "state_dir": str(tmp_path / "state"), "drift": drift}))
    h = Harness(load_settings(config))
    check_pins(h, rng, npy)
    h.close()
    # a pin aimed at one model whose dimension is wrong: that model gets no reference at all
    drift["reference"] = {"records": 100, "pinned": {"small": str(npy)}}
    config.write_text(yaml.safe_dump({"source": "synthetic", "state_dir": str(tmp_path / "state2"), "drift": drift}))
    h = Harness(load_settings(config))
    h.feed("small", "s", unit_rows(rng, 130, axis(0, 8)))
    assert h.component.reference("small", "s") is None
    assert "dimension 16" in (h.component._streams[("small", "s")].problem or "")
    h.close()


def test_reference_settings_are_checked_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"drift.reference.pinned.*missing.npz.*does not exist"):
        load_settings(overrides={"drift": {"reference": {"pinned": {"m": str(tmp_path / "missing.npz")}}}})
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(ConfigError, match=r"drift.reference.*must be an .npz reference or an .npy"):
        load_settings(overrides={"drift": {"reference": {"path": str(tmp_path / "x.txt")}}})
    np.save(tmp_path / "a.npy", np.ones((3, 4), dtype=np.float32))
    with pytest.raises(ConfigError, match="is not MODEL or MODEL/STREAM"):
        load_settings(overrides={"drift": {"reference": {"pinned": {"m/": str(tmp_path / "a.npy")}}}})
    args = build_parser().parse_args(["run", "--reference", str(tmp_path / "a.npy"), "--reference", "b.npy"])
    with pytest.raises(ConfigError, match="given twice"):
        settings_from_args(args)
    # a readable file that is not a usable reference is refused when the component starts
    np.save(tmp_path / "zeros.npy", np.zeros((5, 4), dtype=np.float32))
    settings = settings_for(tmp_path / "state", reference={"path": str(tmp_path / "zeros.npy")})
    with pytest.raises(ConfigError, match="drift.reference.path: .*5 rows are all zeros"):
        Harness(settings)


def test_detector_values_river_refuses_stop_the_start(tmp_path: Path) -> None:
    # the settings check parameter names only (no river at load time); river checks the values
    settings = settings_for(tmp_path / "state", online={"detectors": {"kswin": {"alpha": 2.0}}})
    with pytest.raises(ConfigError, match=r"drift.online.detectors.kswin: Alpha must be between 0 and 1"):
        Harness(settings)


def test_a_capture_survives_restarts_until_the_pinned_file_changes(tmp_path: Path, rng: np.random.Generator) -> None:
    pin = tmp_path / "pin.npy"
    np.save(pin, unit_rows(rng, 80, axis(0)))
    settings = settings_for(tmp_path / "state", reference={"pinned": {"m": str(pin)}})
    h = Harness(settings)
    h.feed("m", "s", unit_rows(rng, 250, axis(0)))
    assert h.component.reference("m", "s").count == 80
    h.now = 1_030.0  # still inside the 60 s window
    [captured] = h.component.capture_current([h.registry.get("m", "s")])
    assert captured.origin == "captured" and captured.profile.count == 250 and captured.path is not None
    assert h.value("embmon_reference_timestamp_seconds", model="m", stream="s") == 1_030.0
    h.close()
    # restart, same configuration: the capture stays
    h = Harness(settings)
    assert h.component.reference("m", "s").count == 250  # known before any record arrives
    assert h.value("embmon_reference_records", model="m", stream="s") == 250
    h.close()
    # the operator pins a new file at the same path: it wins at the next start
    np.save(pin, unit_rows(rng, 70, axis(1)))
    h = Harness(settings)
    assert h.component.reference("m", "s").count == 70
    h.close()


def test_lagged_reference_follows_the_clock(tmp_path: Path, rng: np.random.Generator) -> None:
    """lag 100 s, a cycle every 10 s: each cycle compares with the window taken 100 s earlier."""
    settings = settings_for(
        tmp_path / "state", reference={"lagged_seconds": 100.0}, interval_seconds=10.0,
    )
    window = {"window": {"seconds": 10.0, "subwindows": 1}}
    settings = Settings.model_validate(deep_merge(settings.model_dump(), window))
    h = Harness(settings, now=10_000.0)
    ring = h.component.ring
    assert ring is not None and (ring.spacing, ring.tolerance, ring.capacity) == (10.0, 10.0, 12)
    verdicts = {}
    for step in range(31):
        h.now = 10_000.0 + 10 * step
        shifted = step >= 20  # the stream changes at t0 + 200 s
        h.feed("m", "s", unit_rows(rng, 250, axis(0) + (1.5 * axis(1) if shifted else 0)))
        h.publish()
        results = h.component.run_cycle()
        ref = h.component.reference("m", "s")
        if step < 9:
            assert ref is None and results == {}
            assert h.value("embmon_reference_timestamp_seconds", model="m", stream="s") is None
        elif step == 9:  # the first snapshot is 90 s old: within the tolerance of the 100 s lag
            assert ref is not None and ref.captured_at == 10_000.0
        else:
            assert ref is not None and ref.captured_at == h.now - 100
            assert h.value("embmon_reference_timestamp_seconds", model="m", stream="s") == h.now - 100
            assert h.value("embmon_reference_records", model="m", stream="s") == 250
            verdicts[step] = results[("m", "s")].report.detected
        files = list((tmp_path / "state" / LAGGED_DIR / "m" / "s").glob("*.npz"))
        assert len(files) <= ring.capacity
    assert len(files) == ring.capacity
    # same distribution 100 s apart: quiet; shifted window vs pre-shift reference: drift;
    # once the reference is post-shift too: quiet again
    assert not any(verdicts[s] for s in range(10, 20))
    assert all(verdicts[s] for s in range(20, 30))
    assert not verdicts[30]
    # the online detectors standardise with the first window and flagged the change
    assert h.value("embmon_drift_change_points_total", model="m", stream="s", signal="cosine", detector="adwin") >= 1
    h.close()
    # a restart reloads the ring: the lagged reference is there at the next cycle
    h2 = Harness(settings, now=h.now + 10)
    h2.feed("m", "s", unit_rows(rng, 250, axis(0) + 1.5 * axis(1)))
    h2.publish()
    h2.component.run_cycle()
    assert h2.component.reference("m", "s").captured_at == h2.now - 100
    h2.close()


def test_store_and_cycle_failures_are_counted_in_the_scrape(tmp_path: Path, rng: np.random.Generator) -> None:
    def errors(h: Harness) -> dict[str, float | None]:
        return {stage: h.value("embmon_drift_errors_total", stage=stage) for stage in ("store", "cycle", "test")}

    # a file where the references directory belongs: the first-N reference cannot be stored
    state = tmp_path / "state"
    state.mkdir()
    (state / "references").write_text("in the way")
    h = Harness(settings_for(state))
    assert errors(h) == {"store": 0, "cycle": 0, "test": 0}  # every stage from the start
    h.feed("m", "s", unit_rows(rng, 400, axis(0)))
    h.component.flush()
    assert h.component.reference("m", "s") is not None  # still used, from memory
    assert errors(h) == {"store": 1, "cycle": 0, "test": 0}
    h.publish()
    assert ("m", "s") in h.component.run_cycle()  # the cycle itself is fine
    h.component.flush()
    assert errors(h) == {"store": 2, "cycle": 0, "test": 0}  # nor could the regions the cycle fitted
    h.close()

    # a file where the lagged ring belongs: the cycle cannot take its snapshot
    lagged_state = tmp_path / "lagged"
    lagged_state.mkdir()
    (lagged_state / LAGGED_DIR).write_text("in the way")
    h = Harness(settings_for(lagged_state, reference={"lagged_seconds": 100.0}))
    h.feed("m", "s", unit_rows(rng, 250, axis(0)))
    h.feed("m", "t", unit_rows(rng, 250, axis(0)))
    h.publish()
    with pytest.raises(RuntimeError, match="drift cycle failed for 2 stream"):
        h.component.run_cycle()
    assert errors(h) == {"store": 0, "cycle": 2, "test": 0}
    h.close()


def test_a_failing_drift_test_is_counted_and_left_out_of_the_verdict(
    tmp_path: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise FloatingPointError("degenerate sample")

    monkeypatch.setattr("monitor.drift.twosample.suite.classifier_test", broken)
    settings = settings_for(tmp_path / "state")
    settings.drift.screen_level = 1.0  # every test runs: a quiet cycle would screen the classifier out
    h = Harness(settings)
    h.feed("m", "s", unit_rows(rng, 600, axis(0)))
    h.publish()
    report = h.component.run_cycle()[("m", "s")].report
    assert [r.test for r in report.results] == ["mmd", "ks", "centroid"] and "classifier" in report.errors
    assert h.value("embmon_drift_errors_total", stage="test") == 1
    assert h.value("embmon_drift_errors_total", stage="cycle") == 0
    assert h.value("embmon_drift_p_value", model="m", stream="s", test="classifier") is None
    h.close()


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint does to a component state: flatten, JSON, unflatten."""
    arrays: list[np.ndarray] = []
    tree = json.loads(json.dumps(ckpt.flatten(state, arrays)))
    return ckpt.unflatten(tree, arrays)


def test_state_dict_restores_builders_detectors_verdicts_and_counters(tmp_path: Path, rng: np.random.Generator) -> None:
    settings = settings_for(tmp_path / "state")
    h = Harness(settings)
    h.feed("m", "s", unit_rows(rng, 700, axis(0)))
    h.feed("m", "partial", unit_rows(rng, 120, axis(0)))  # 120 of 300 first records
    h.publish()
    h.component.run_cycle()
    h.now += 1
    h.feed("m", "s", unit_rows(rng, 1500, axis(1)))  # the mean turns by 90 degrees
    state = round_trip(h.component.state_dict())
    h.component.flush()
    before = h.samples()
    assert any(n == "embmon_drift_change_points_total" and v > 0 for (n, _), v in before.items())

    h2 = Harness(settings, now=h.now)
    h2.component.load_state_dict(state)
    assert h2.samples() == before  # references, last verdicts and change counters
    # the builder resumes: 180 more records complete the reference of m/partial
    rest = unit_rows(rng, 200, axis(0))
    for harness in (h, h2):
        harness.feed("m", "partial", rest)
    assert h2.component.reference("m", "partial").count == 300
    np.testing.assert_array_equal(
        h2.component.reference("m", "partial").sample, h.component.reference("m", "partial").sample
    )
    # the detectors resume exactly: the same records give the same change points
    more = unit_rows(rng, 3000, axis(0) + 3.0 * axis(2))
    outs = []
    for harness in (h, h2):
        online = harness.component._streams[("m", "s")].online
        outs.append([(c.signal, c.detector, c.record_index) for c in online.update(more, harness.now)])
    assert outs[0] == outs[1] and outs[0]
    h.close()
    h2.close()


def _stream(name: str) -> Any:
    return lambda state: next(e for e in state["streams"] if e["stream"] == name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: _stream("s")(s)["result"]["tests"][0].__setitem__(2, 1.5), "p-value is 1.5, outside"),
        (lambda s: _stream("s")(s)["result"]["tests"][0].__setitem__(1, float("nan")), "statistic is nan"),
        (lambda s: _stream("s")(s)["result"].__setitem__("window_size", -3), "window size is -3"),
        (lambda s: _stream("s")(s).__setitem__("last_end", float("inf")), "end of the last window tested is inf"),
        (lambda s: _stream("partial")(s)["builder"]["vector_sum"].__setitem__(0, np.nan), "vector sum holds NaN"),
        (lambda s: s.__setitem__("cycles", -1), "drift cycles is -1"),
        (lambda s: s["changes"][0].__setitem__(4, -2), "is -2, outside"),
        (lambda s: _stream("s")(s)["result"].__setitem__("evidence", [5, float("nan"), 2.0, False, 0]),
         "log evidence is nan"),
        (lambda s: s.__setitem__("evidence_alarms", [["m", "s", -1]]), "evidence alarms of m/s is -1"),
    ],
    ids=["p-above-1", "nan-statistic", "negative-window", "infinite-last-end", "nan-builder-sum", "negative-cycles",
         "negative-change-count", "nan-log-evidence", "negative-evidence-alarms"],
)
def test_a_crafted_drift_state_is_refused_whole(
    tmp_path: Path, rng: np.random.Generator, change: Any, message: str
) -> None:
    """Values no cycle produces: the component raises (the checkpoint counts it ``invalid``) before
    any stream took part of the state, so the scrape equals a fresh component's."""
    settings = settings_for(tmp_path / "state")
    h = Harness(settings)
    h.feed("m", "s", unit_rows(rng, 700, axis(0)))
    h.feed("m", "partial", unit_rows(rng, 120, axis(0)))
    h.publish()
    h.component.run_cycle()
    h.now += 1
    h.feed("m", "s", unit_rows(rng, 1500, axis(1)))
    h.component.flush()
    state = round_trip(h.component.state_dict())
    change(state)
    h2, fresh = Harness(settings, now=h.now), Harness(settings, now=h.now)
    with pytest.raises(ValueError, match=message):
        h2.component.load_state_dict(state)
    assert h2.samples() == fresh.samples()
    assert h2.component._streams.get(("m", "partial")) is None or h2.component._streams[("m", "partial")].builder \
        is None or h2.component._streams[("m", "partial")].builder.seen == 0
    for harness in (h, h2, fresh):
        harness.close()


def test_state_of_another_reference_is_not_restored(tmp_path: Path, rng: np.random.Generator) -> None:
    settings = settings_for(tmp_path / "state")
    h = Harness(settings)
    h.feed("m", "s", unit_rows(rng, 700, axis(0)))
    h.publish()
    h.component.run_cycle()
    state = round_trip(h.component.state_dict())
    h.now += 5
    h.component.capture_current([h.registry.get("m", "s")])  # re-pinned after the checkpoint
    h.close()
    h2 = Harness(settings, now=h.now)
    h2.component.load_state_dict(state)
    assert h2.component.reference("m", "s").captured_at == h.now  # the file on disk wins
    assert h2.value("embmon_drift_detected", model="m", stream="s", test="suite") is None  # old verdict dropped
    assert h2.component._streams[("m", "s")].online.records_seen == 0
    h2.close()


@pytest.mark.parametrize(
    ("kind", "params"),
    [("adwin", {"delta": 1e-3}), ("page_hinkley", {"threshold": 10.0, "alpha": 1.0}),
     ("kswin", {"alpha": 1e-3, "window_size": 100, "stat_size": 30, "seed": 3})],
)
def test_detector_state_round_trips_without_pickle(kind: str, params: dict[str, Any]) -> None:
    values = np.random.default_rng(5).standard_normal(1500) + np.r_[np.zeros(600), np.full(900, 1.5)]

    def detections(detector: Any, xs: np.ndarray, offset: int) -> list[int]:
        out = []
        for i, x in enumerate(xs):
            detector.update(float(x))
            if detector.drift_detected:
                out.append(offset + i)
        return out

    factory = {"adwin": river_drift.ADWIN, "page_hinkley": river_drift.PageHinkley, "kswin": river_drift.KSWIN}[kind]
    original = factory(**params)
    detections(original, values[:500], 0)
    restored = decode_detector(kind, params, round_trip(encode_detector(original)))
    expected = detections(original, values[500:], 500)
    assert expected and detections(restored, values[500:], 500) == expected
    with pytest.raises(ValueError, match="attributes"):
        decode_detector(kind, params, {"unknown": 1})


def test_stored_reference_origin_is_checked(tmp_path: Path, rng: np.random.Generator) -> None:
    store = ReferenceStore(tmp_path)
    profile = ReferenceProfile.from_sample(unit_rows(rng, 10, axis(0)), captured_at=5.0, source="t")
    with pytest.raises(ValueError, match="origin"):
        store.save(StoredReference("m", "s", profile, "guess"))
    path = store.save(StoredReference("a/b", "..", profile, "file"))
    assert path.parent.parent == store.root  # label characters cannot escape the directory
    (path.parent / "junk.npz").write_bytes(b"not a zip")
    assert list(store.load_all()) == [("a/b", "..")]
