"""Online detectors on per-record signals: pinned detection indices on seeded streams."""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest
from river import drift as river_drift

from monitor.drift.online.detector_kinds import DEFAULT_DETECTOR_PARAMS, DETECTOR_PARAMETERS
from monitor.drift.online.detectors import DetectorStatus, OnlineDriftMonitor, build_detector
from monitor.drift.online.signals import SignalBaseline, record_signals

DIM = 16
CHANGE_AT = 10_000
LENGTH = 16_000


def _stream(seed: int, n: int = LENGTH, pull_after: float = 1.0, scale_after: float = 1.0) -> np.ndarray:
    """Records around the first axis; from CHANGE_AT on, the pull towards it and the length change."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(0.0, 0.35, size=(n, DIM))
    rows[:, 0] += np.where(np.arange(n) < CHANGE_AT, 1.0, pull_after)
    rows *= np.where(np.arange(n) < CHANGE_AT, 1.0, scale_after)[:, None]
    return rows.astype(np.float32)


@pytest.fixture(scope="module")
def baseline() -> SignalBaseline:
    return SignalBaseline.from_reference(_stream(0, 5000))


def _run(monitor: OnlineDriftMonitor, data: np.ndarray, batch: int = 1000) -> list[tuple[str, str, int]]:
    changes = []
    for start in range(0, len(data), batch):
        changes += monitor.update(data[start : start + batch], now=1000.0 + start / 1000)
    return [(c.signal, c.detector, c.record_index) for c in changes]


@pytest.mark.parametrize(
    ("kind", "aggregate", "expected"),
    [
        ("adwin", 1, [("cosine", "adwin", 10463), ("norm", "adwin", 10687)]),
        ("adwin", 16, [("cosine", "adwin", 11263), ("norm", "adwin", 11263)]),
        ("page_hinkley", 16, [("cosine", "page_hinkley", 10943), ("norm", "page_hinkley", 11343)]),
        ("kswin", 16, [("cosine", "kswin", 10975)]),
    ],
)
def test_pull_change_is_detected_at_pinned_records(
    baseline: SignalBaseline, kind: str, aggregate: int, expected: list
) -> None:
    """The records lean less towards the centroid from record 10,000 (cosine -0.3 sd, norm too)."""
    monitor = OnlineDriftMonitor(baseline, {kind: DEFAULT_DETECTOR_PARAMS[kind]}, aggregate=aggregate)
    assert _run(monitor, _stream(2, pull_after=0.9)) == expected


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("adwin", 10751), ("page_hinkley", 10639), ("kswin", 10927)],
)
def test_abrupt_norm_change_is_detected_at_pinned_records(baseline: SignalBaseline, kind: str, expected: int) -> None:
    """Every vector 5% longer from record 10,000; the direction, hence the cosine, is unchanged."""
    monitor = OnlineDriftMonitor(baseline, {kind: DEFAULT_DETECTOR_PARAMS[kind]}, aggregate=16)
    assert _run(monitor, _stream(3, scale_after=1.05)) == [("norm", kind, expected)]


@pytest.mark.parametrize("kind", ["adwin", "page_hinkley", "kswin"])
def test_quiet_on_a_stream_without_change(baseline: SignalBaseline, kind: str) -> None:
    monitor = OnlineDriftMonitor(baseline, {kind: DEFAULT_DETECTOR_PARAMS[kind]}, aggregate=16)
    assert _run(monitor, _stream(1)) == []
    assert monitor.records_seen == LENGTH


def test_batch_boundaries_do_not_change_the_detections(baseline: SignalBaseline) -> None:
    data = _stream(2, pull_after=0.9)
    in_thousands = _run(OnlineDriftMonitor(baseline, aggregate=64), data, batch=1000)
    ragged = _run(OnlineDriftMonitor(baseline, aggregate=64), data, batch=777)
    assert in_thousands == ragged
    assert {detector for _, detector, _ in in_thousands} == {"adwin", "page_hinkley"}
    assert all(CHANGE_AT <= index < CHANGE_AT + 5000 for _, _, index in in_thousands)


def test_status_counts_changes_and_remembers_the_last(baseline: SignalBaseline) -> None:
    monitor = OnlineDriftMonitor(baseline, {"adwin": DEFAULT_DETECTOR_PARAMS["adwin"]}, aggregate=16, history=1)
    changes = monitor.update(_stream(3, scale_after=1.05), now=123.0)
    status = monitor.status()
    assert status[("norm", "adwin")] == DetectorStatus(changes=1, last_record_index=10751, last_timestamp=123.0)
    assert status[("cosine", "adwin")] == DetectorStatus(changes=0, last_record_index=None, last_timestamp=None)
    assert list(monitor.recent_changes) == changes[-1:]


def test_a_pickled_monitor_carries_on_exactly_where_it_stopped(baseline: SignalBaseline) -> None:
    """Checkpoint mid-stream (with a partial mini-batch pending), restore, and continue."""
    data = _stream(2, pull_after=0.9)
    straight = OnlineDriftMonitor(baseline, aggregate=64)
    expected = _run(straight, data)
    first = OnlineDriftMonitor(baseline, aggregate=64)
    head = _run(first, data[:9_990])
    restored = pickle.loads(pickle.dumps(first))  # noqa: S301 - the bytes pickled on this line
    tail = [(c.signal, c.detector, c.record_index) for c in restored.update(data[9_990:], now=0.0)]
    assert head + tail == expected
    def counts(monitor: OnlineDriftMonitor) -> dict:
        return {key: (s.changes, s.last_record_index) for key, s in monitor.status().items()}

    assert counts(restored) == counts(straight)
    assert sum(changes for changes, _ in counts(restored).values()) == len(expected) > 0


def test_signals_are_the_cosine_to_the_centroid_and_the_norm() -> None:
    vectors = np.array([[3.0, 4.0], [0.0, 2.0]], dtype=np.float32)
    signals = record_signals(vectors, np.array([1.0, 0.0]))
    assert signals["norm"] == pytest.approx([5.0, 2.0])
    assert signals["cosine"] == pytest.approx([0.6, 0.0])


def test_baseline_standardises_the_reference_and_floors_a_constant_norm() -> None:
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(3000, 8)) + 2.0
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    baseline = SignalBaseline.from_reference(rows)
    z = (record_signals(rows, baseline.centroid_unit)["cosine"] - baseline.means["cosine"]) / baseline.stds["cosine"]
    assert z.mean() == pytest.approx(0.0, abs=1e-6) and z.std(ddof=1) == pytest.approx(1.0)
    assert SignalBaseline.from_reference(unit).stds["norm"] == pytest.approx(1e-3, rel=1e-3)


def test_misconfiguration_fails_at_construction(baseline: SignalBaseline) -> None:
    with pytest.raises(ValueError, match="unknown detector"):
        build_detector("cusum")
    with pytest.raises(ValueError, match=r"does not take \['threshold'\]"):
        build_detector("adwin", {"threshold": 3})
    with pytest.raises(ValueError, match="aggregate"):
        OnlineDriftMonitor(baseline, aggregate=0)
    with pytest.raises(ValueError, match="signals"):
        OnlineDriftMonitor(baseline, signals=("entropy",))
    with pytest.raises(ValueError, match="at least one detector"):
        OnlineDriftMonitor(baseline, {})
    with pytest.raises(ValueError, match=r"shape \(n, 16\)"):
        OnlineDriftMonitor(baseline).update(np.ones((3, 4), np.float32), now=0.0)
    with pytest.raises(ValueError, match="zero vector"):
        SignalBaseline.from_reference(np.r_[np.ones((2, 3)), -np.ones((2, 3))])


def test_parameter_names_match_the_installed_river() -> None:
    """Settings check names against a static table (no river at load time); an upgrade must not drift from it."""
    classes = {"adwin": river_drift.ADWIN, "page_hinkley": river_drift.PageHinkley, "kswin": river_drift.KSWIN}
    assert DETECTOR_PARAMETERS.keys() == classes.keys()
    for kind, cls in classes.items():
        assert DETECTOR_PARAMETERS[kind] == set(inspect.signature(cls).parameters), kind
