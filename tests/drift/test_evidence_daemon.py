"""The accumulating detector in the daemon: settings and budget split, the ingest-side labelling,
the cycle's combined verdict and its exported series, the null false-alarm bound at the daemon's
level, and a persistent shift too small for one window.

Real components throughout: the drift component on a real ``StateRegistry`` with the windows a
refresh would publish (:class:`tests.support.drift.Harness`), its real suite and regions.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from monitor.config import ConfigError, load_settings
from monitor.drift.attribution.explain import explanation
from monitor.drift.attribution.regions import fit_regions
from monitor.drift.export import CycleResult
from monitor.drift.online.evidence import conformal_p_values, threshold_for
from monitor.drift.online.evidence_feed import EvidenceFeed, labels_from_counts
from monitor.drift.settings import DriftSettings
from monitor.state.checks import InvalidState
from monitor.storage import checkpoint_format as ckpt
from tests.support.drift import Harness, settings_for

DIM, CLUSTERS = 16, 8
EQUAL = np.full(CLUSTERS, 1 / CLUSTERS)


class Clusters:
    """Rows from ``CLUSTERS`` well-separated Gaussian clusters at given shares (a region is about a cluster)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.centres = 3.0 * np.random.default_rng(0).standard_normal((CLUSTERS, DIM))

    def draw(self, n: int, shares: np.ndarray = EQUAL) -> np.ndarray:
        picked = self.rng.choice(CLUSTERS, n, p=shares)
        return (self.centres[picked] + self.rng.standard_normal((n, DIM))).astype(np.float32)


def round_trip(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint does to a state: flatten, encode, decode (the checkpoint container)."""
    arrays: list[np.ndarray] = []
    return ckpt.decode(ckpt.encode(ckpt.flatten(state, arrays), arrays))  # type: ignore[no-any-return]


def _only_ks(**drift: Any) -> dict[str, Any]:
    """A cheap suite (KS alone) so that hundreds of cycles fit in the fast tier."""
    off = {"enabled": False}
    return {"mmd": off, "centroid": off, "classifier": off, "online": off, **drift}


def _run(h: Harness, source: Clusters, rows: int, shares: np.ndarray = EQUAL) -> CycleResult:
    h.now += h.settings.drift.interval_seconds
    h.feed("m", "s", source.draw(rows, shares), batch=250)
    h.publish()
    return h.component.run_cycle()[("m", "s")]


# ---------------------------------------------------------------------------------- settings
def test_the_budget_is_split_between_the_suite_and_the_detector() -> None:
    whole = DriftSettings(interval_seconds=60, false_alarm_every="7d", evidence_share=0)
    half = DriftSettings(interval_seconds=60, false_alarm_every="7d")
    alpha = 60 / (7 * 86400)
    assert whole.evidence_threshold is None and whole.cycle_alpha == pytest.approx(alpha)
    assert half.evidence_share == 0.5 and half.cycle_alpha == pytest.approx(alpha / 2)
    assert half.evidence_threshold == pytest.approx(threshold_for(alpha, 0.5)) == pytest.approx(20_160)
    quarter = DriftSettings(interval_seconds=60, false_alarm_every="7d", evidence_share=0.25)
    # together: (1 - s) α from the suite plus s α from the detector (1 / A per cycle)
    assert quarter.cycle_alpha + 1 / quarter.evidence_threshold == pytest.approx(alpha)
    # where the detector cannot run, the suite keeps the whole budget
    for off in ({"regions": {"enabled": False}}, {"reference": {"lagged_seconds": 600}}):
        settings = DriftSettings(interval_seconds=60, false_alarm_every="7d", **off)
        assert settings.evidence_threshold is None and settings.cycle_alpha == pytest.approx(alpha)
    # a sustained rule: the suite's alerts get (1 - s) of the alert rate
    sustained = DriftSettings(interval_seconds=60, false_alarm_every="7d", sustained={"detections": 2, "cycles": 3})
    assert sustained.cycle_alpha < DriftSettings(
        interval_seconds=60, false_alarm_every="7d", evidence_share=0, sustained={"detections": 2, "cycles": 3}
    ).cycle_alpha


@pytest.mark.parametrize(
    ("overrides", "field"),
    [({"evidence_share": 1.0}, "evidence_share"), ({"evidence_share": -0.1}, "evidence_share"),
     ({"evidence_rows": 0}, "evidence_rows"), ({"evidence_share": "half"}, "evidence_share")],
)
def test_a_bad_evidence_setting_is_refused_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        DriftSettings(**overrides)
    with pytest.raises(ConfigError, match=f"drift.{field}"):
        load_settings(overrides={"source": "synthetic", "drift": overrides})


# ---------------------------------------------------------------------------------- the feed
def test_the_feed_labels_at_most_the_cap_and_bets_only_when_rows_came() -> None:
    source = Clusters(1)
    regions = fit_regions(source.draw(1600).astype(np.float64), seed=0)
    assert regions is not None
    feed = EvidenceFeed(regions, threshold=1e6, cap=300, seed=3)
    rows = source.draw(500)
    assert feed.add(rows[:200]) == 200 and feed.add(rows[200:]) == 100 and feed.add(rows) == 0
    taken = feed.take()
    np.testing.assert_array_equal(taken, feed.label(rows[:300]))  # the first rows, in arrival order
    assert (taken == regions.assign(rows[:300])[0]).mean() >= 0.99  # the nearest centre, in float32
    assert feed.step() is None and feed.detector.cycles == 0  # nothing came: no update
    assert feed.add_labels(taken) == 300
    result = feed.step()
    assert result is not None and result.rows == 300 and feed.detector.cycles == 1
    quiet = feed.step()  # no row since: the last bet shown again, no update
    assert quiet is not None and quiet.rows == 0 and quiet.log_evidence == result.log_evidence
    assert feed.detector.cycles == 1
    assert result.log_threshold == pytest.approx(math.log(1e6))
    counts = np.bincount(taken, minlength=regions.k)
    labels = labels_from_counts(counts, regions.k, np.random.default_rng(0))
    assert np.array_equal(np.bincount(labels, minlength=regions.k), counts)
    for bad in (counts[:-1], np.r_[counts[:-1], -1]):
        with pytest.raises(ValueError, match="non-negative region counts"):
            labels_from_counts(bad, regions.k, np.random.default_rng(0))


def test_long_cycles_get_the_same_p_values_in_cache_sized_chunks() -> None:
    rng = np.random.default_rng(4)
    labels, bag = rng.integers(0, 16, 5000), rng.integers(0, 40, 16)
    whole = conformal_p_values(labels[None], bag[None], np.random.default_rng(9))[0]  # (1, n): one block
    np.testing.assert_array_equal(conformal_p_values(labels, bag, np.random.default_rng(9)), whole)


# ---------------------------------------------------------------------------------- the component
def test_each_cycle_bets_on_the_fresh_rows_and_exports_the_evidence(tmp_path: Path) -> None:
    source = Clusters(2)
    h = Harness(settings_for(tmp_path / "state", interval_seconds=60, false_alarm_every="7d",
                             reference_sample_size=800, reference={"records": 1600}, evidence_rows=700,
                             **_only_ks()))
    h.feed("m", "s", source.draw(1600), batch=400)
    first = _run(h, source, 500)  # fits the regions: the detector starts here, with nothing to bet on yet
    assert first.evidence is None and h.value("embmon_drift_log_evidence", model="m", stream="s") is None
    slot = h.component._streams[("m", "s")]
    assert slot.evidence is not None and slot.evidence.regions is slot.reference.profile.regions
    second = _run(h, source, 1000)  # more than the cap: the first 700 are bet on
    assert second.evidence is not None and second.evidence.rows == 700 and not second.evidence.alarmed
    assert second.evidence.log_threshold == pytest.approx(math.log(20_160))
    assert h.value("embmon_drift_log_evidence", model="m", stream="s") == pytest.approx(second.evidence.log_evidence)
    assert h.value("embmon_drift_log_evidence_threshold", model="m", stream="s") == pytest.approx(math.log(20_160))
    assert h.value("embmon_drift_detected", model="m", stream="s", test="evidence") == 0
    assert h.value("embmon_drift_evidence_alarms_total", model="m", stream="s") == 0
    assert second.report.cycle_alpha == pytest.approx(60 / (7 * 86400) / 2)  # the suite's half
    assert explanation("m", "s", second)["evidence"]["rows"] == 700  # the explanation carries the bet
    # the verdict survives a checkpoint with its evidence; a corrupt bet is refused
    state = second.state_dict()
    assert CycleResult.from_state_dict(state).evidence == second.evidence
    for bad in ([1, 2.0], [-1, 1.0, 2.0, False, 0], [5, float("nan"), 2.0, False, 0], [5, 1.0, 2.0, "yes", 0]):
        with pytest.raises(InvalidState):
            CycleResult.from_state_dict({**state, "evidence": bad})
    # a restarted daemon: the stored reference has its regions, the detector starts at once; from the
    # checkpoint it resumes where it was, and bets as the running one does on the same rows
    h.component.flush()
    state = round_trip(h.component.state_dict())
    restarted, fresh = Harness(h.settings, now=h.now), Harness(h.settings, now=h.now)
    again = fresh.component._streams[("m", "s")].evidence
    assert again is not None and again.detector.cycles == 0 and again.regions.k == slot.evidence.regions.k
    restarted.component.load_state_dict(state)
    resumed = restarted.component._streams[("m", "s")].evidence
    assert resumed is not None and resumed.detector.cycles == slot.evidence.detector.cycles == 1
    np.testing.assert_array_equal(resumed.detector.bag, slot.evidence.detector.bag)
    rows = source.draw(300)
    for feed in (resumed, slot.evidence):
        feed.add(rows)
    assert resumed.step() == slot.evidence.step()
    # a checkpointed detector no run writes is refused with the whole state; another reference's is not resumed
    entry = next(e for e in state["streams"] if e["stream"] == "s")
    for change, message in (
        (lambda e: e["evidence"]["bag"].__setitem__(0, -1), "evidence bag count is -1"),
        (lambda e: e["evidence"]["recent"].__setitem__(0, float("nan")), "evidence recent count is nan"),
        (lambda e: e["evidence"]["rng"].__setitem__("bit_generator", "SeedSequence"), "PCG64"),
        (lambda e: e["evidence"].__setitem__("bag", [1] * 65), "2..64 counts"),
    ):
        crafted = copy.deepcopy(state)
        change(next(e for e in crafted["streams"] if e["stream"] == "s"))
        with pytest.raises(InvalidState, match=message):
            fresh.component.load_state_dict(crafted)
    assert fresh.component._streams[("m", "s")].evidence.detector.cycles == 0
    elsewhere = copy.deepcopy(state)
    next(e for e in elsewhere["streams"] if e["stream"] == "s")["evidence"]["regions"] ^= 1
    fresh.component.load_state_dict(elsewhere)  # a warning: this detector starts afresh
    assert fresh.component._streams[("m", "s")].evidence.detector.cycles == 0 and entry["evidence"]["cycles"] == 1
    restarted.close()
    fresh.close()
    # a new reference starts a new detector (once its regions are fitted); the alarm counter carries on
    old = slot.evidence
    h.component.capture_current([h.registry.get("m", "s")])
    assert slot.evidence is None
    _run(h, source, 500)
    assert slot.evidence is not None and slot.evidence is not old and slot.evidence.detector.cycles == 0
    assert h.value("embmon_drift_evidence_alarms_total", model="m", stream="s") == 0
    h.close()


def test_the_daemon_false_alarm_rate_stays_within_its_bound(tmp_path: Path) -> None:
    """Exchangeable traffic (the reference and every later row drawn from one distribution), a small
    threshold (A = 1 / (0.9 · 30 s / 60 s) = 2.2), 50 cycles: the detector's alarms must stay within
    50 / A plus a binomial margin (an excess of 1.7 times the bound fails), and the combined
    verdict within the whole budget's."""
    found = _null_alarms(tmp_path, cycles=50, every="60s", share=0.9, rows=120)
    assert found["cycles"] >= 48
    assert found["evidence"] <= found["cycles"] / found["A"] + 3 * math.sqrt(found["cycles"] / found["A"]) + 2, found
    alpha = 30 / 60
    assert found["combined"] <= found["cycles"] * alpha + 3 * math.sqrt(found["cycles"] * alpha) + 2, found


@pytest.mark.slow
def test_the_daemon_false_alarm_rate_stays_within_its_bound_over_many_cycles(tmp_path: Path) -> None:
    found = _null_alarms(tmp_path, cycles=1500, every="1200s", share=0.5, rows=120)  # A = 80
    bound = found["cycles"] / found["A"]
    assert found["evidence"] <= bound + 3 * math.sqrt(bound) + 2, found
    print(f"\n{found}")


def _null_alarms(tmp_path: Path, *, cycles: int, every: str, share: float, rows: int) -> dict[str, float]:
    source = Clusters(5)
    h = Harness(settings_for(tmp_path / "state", interval_seconds=30, false_alarm_every=every, evidence_share=share,
                             **_only_ks()))
    h.feed("m", "s", source.draw(300), batch=300)
    counted = {"cycles": 0, "evidence": 0, "combined": 0, "A": h.settings.drift.evidence_threshold or 0.0}
    for _ in range(cycles + 1):
        result = _run(h, source, rows)
        if result.computed_at != h.now or result.evidence is None or not result.evidence.rows:  # no new bet
            continue
        counted["cycles"] += 1
        counted["evidence"] += result.evidence.alarmed
        counted["combined"] += result.detected
    h.close()
    assert h.value("embmon_drift_evidence_alarms_total", model="m", stream="s") == counted["evidence"]
    return counted


MOVED = np.r_[EQUAL[0] + 0.1, np.full(CLUSTERS - 1, (1 - EQUAL[0] - 0.1) / (CLUSTERS - 1))]


def _shifted_stream(tmp_path: Path, seed: int, horizon: int) -> tuple[Harness, list[CycleResult]]:
    """Two usual cycles, then one cluster's share raised from 12.5% to 22.5% for up to ``horizon``
    cycles (1,000 fresh rows each, a 200-row window sample), stopping at the first flagged cycle."""
    source = Clusters(seed)
    h = Harness(settings_for(tmp_path / "state", interval_seconds=60, false_alarm_every="7d",
                             reference_sample_size=800, reference={"records": 1600}, online={"enabled": False}))
    h.feed("m", "s", source.draw(1600), batch=400)
    before = [_run(h, source, 1000) for _ in range(2)]
    assert not any(r.detected for r in before)
    after: list[CycleResult] = []
    while len(after) < horizon and not (after and after[-1].detected):
        after.append(_run(h, source, 1000, MOVED))
    return h, after


def test_a_persistent_share_shift_too_small_for_one_window_is_flagged(tmp_path: Path) -> None:
    """Each cycle's window is too small for the suite at a week's budget; the detector adds the
    fresh rows of every cycle up and alarms (this stream, seeded: at the 6th shifted cycle)."""
    h, after = _shifted_stream(tmp_path, seed=3, horizon=8)
    flagged = after[-1]
    assert flagged.detected and flagged.flagged_by == "evidence", [(r.report.detected, r.evidence) for r in after]
    assert not any(r.report.detected for r in after)  # the suite missed it in every window
    assert flagged.sustained  # an alarm is an alert on its own
    assert h.value("embmon_drift_detected", model="m", stream="s", test="evidence") == 1
    assert h.value("embmon_drift_detected", model="m", stream="s", test="suite") == 0
    assert h.value("embmon_drift_evidence_alarms_total", model="m", stream="s") == 1
    h.close()


@pytest.mark.slow
def test_the_combined_verdict_finds_a_persistent_small_shift_in_most_streams(tmp_path: Path) -> None:
    """Eight seeded streams, a horizon of 12 shifted cycles: the combined verdict flags at least 6,
    the suite alone (at its half of the budget) at most 2."""
    delays, suite = [], 0
    for seed in range(8):
        h, after = _shifted_stream(tmp_path / str(seed), seed, horizon=12)
        delays.append(len(after) if after[-1].detected else None)
        suite += any(r.report.detected for r in after)
        h.close()
    print(f"\ndelays in cycles (None: not within 12): {delays}; the suite flagged {suite} of 8")
    assert sum(d is not None for d in delays) >= 6 and suite <= 2, (delays, suite)


# ---------------------------------------------------------------------------------- checkpoint fuzz
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(-5, 5), max_size=70), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(field=st.sampled_from(["regions", "bag", "recent", "components", "cycles", "alarms", "rng", "last"]),
       value=_VALUES, drop=st.booleans())
def test_a_checkpointed_detector_is_resumed_exactly_or_refused_unchanged(field: str, value: Any, drop: bool) -> None:
    """Outside bytes (a checkpoint file): any value in any field resumes a detector this feed could
    have written, or is refused with :class:`InvalidState` (or a missing key's ``KeyError``), the
    feed unchanged."""
    regions = _FUZZ_REGIONS
    written = EvidenceFeed(regions, threshold=100.0, cap=1000, seed=2)
    written.add_labels(np.arange(40) % regions.k)
    written.step()
    state = round_trip({"e": written.state_dict()})["e"]
    if drop:
        state.pop(field)
    else:
        state[field] = value
    feed = EvidenceFeed(regions, threshold=100.0, cap=1000, seed=5)
    before = feed.state_dict()
    try:
        feed.load_state_dict(state)
    except (InvalidState, KeyError):
        assert feed.state_dict() == before
        return
    d = feed.detector
    assert len(d.bag) == regions.k and (d.bag >= regions.reference_counts).all()
    assert np.isfinite(d.recent).all() and (d.recent >= 0).all() and d.log_evidence < math.inf
    feed.add_labels(np.arange(10) % regions.k)
    feed.step()  # and it still bets


_FUZZ_REGIONS = fit_regions(Clusters(9).draw(400).astype(np.float64), seed=0)
