"""The demo's synthetic source: its incidents look like what they imitate."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from monitor.quality.intrinsic import report_from_matrix
from monitor.sources.settings import SyntheticSourceSettings
from monitor.sources.synthetic import SyntheticSource

DIM = 64


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def source(kind: str, canaries: int = 0) -> tuple[SyntheticSource, Clock]:
    clock = Clock()
    settings = SyntheticSourceSettings(
        models=[{"name": "m", "dim": DIM}], rate=1000.0, batch_size=500, phases=[{"kind": kind, "seconds": 1000}],
        canaries=canaries, canary_period_seconds=5.0,
    )
    src = SyntheticSource(settings, clock=clock)
    src.start()
    return src, clock


def vectors(src: SyntheticSource, clock: Clock, seconds: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Binary traffic rows and the latest vector of each canary over ``seconds`` of polls."""
    rows, canaries = [], {}
    for _ in range(int(seconds)):
        clock.now += 1.0
        for message in src.poll(0.0):
            if dict(message.headers).get("dim"):
                rows.append(np.frombuffer(message.value, dtype="<f4").reshape(-1, DIM))
            else:
                for event in orjson.loads(message.value):
                    canaries[event["id"]] = np.asarray(event["vector"])
    return np.concatenate(rows), canaries


def test_a_swapped_model_keeps_every_intrinsic_metric_but_moves_its_canaries() -> None:
    healthy, healthy_canaries = vectors(*source("healthy", canaries=3), 8)
    swapped, swapped_canaries = vectors(*source("swapped", canaries=3), 8)
    before, after = report_from_matrix(healthy), report_from_matrix(swapped)
    for name in ("effective_dimension_ratio", "mean_cosine_similarity", "effective_rank", "stable_rank",
                 "partition_isotropy", "top10_variance_ratio", "collapse_detected"):
        assert getattr(after, name) == pytest.approx(getattr(before, name), rel=1e-4, abs=1e-6), name
    assert healthy_canaries.keys() == {"canary-0", "canary-1", "canary-2"}
    again, _ = vectors(*source("healthy", canaries=3), 8)
    assert np.allclose(again, healthy)  # the same seed replays the same traffic
    for name, vector in healthy_canaries.items():
        assert float(vector @ swapped_canaries[name]) < 0.5  # the fixed item's embedding moved


def test_canaries_are_resent_every_period_unchanged_while_the_model_is_healthy() -> None:
    src, clock = source("healthy", canaries=2)
    seen: list[np.ndarray] = []
    for _ in range(20):
        clock.now += 1.0
        for message in src.poll(0.0):
            if not dict(message.headers).get("dim"):
                seen.extend(np.asarray(e["vector"]) for e in orjson.loads(message.value) if e["id"] == "canary-0")
    assert len(seen) == 5  # at the first poll, then at 5, 10, 15 and 20 s
    assert all(np.array_equal(v, seen[0]) for v in seen)


def test_a_topic_shift_brings_a_tight_new_cluster_into_part_of_the_traffic() -> None:
    healthy, _ = vectors(*source("healthy"), 4)
    shifted, _ = vectors(*source("topic_shift"), 4)
    centre = healthy.mean(axis=0)
    far = (shifted @ centre / np.linalg.norm(centre)) < np.quantile(healthy @ centre / np.linalg.norm(centre), 0.01)
    assert 0.2 < far.mean() < 0.4  # about TOPIC_SHARE of the records sit where the reference had ~1 %


def test_with_ids_the_traffic_is_json_events_and_the_new_topic_says_so_in_its_ids() -> None:
    clock = Clock()
    settings = SyntheticSourceSettings(
        models=[{"name": "m", "dim": DIM}], rate=1000.0, batch_size=500, ids=True, loop=False,
        phases=[{"kind": "healthy", "seconds": 2}, {"kind": "topic_shift", "seconds": 1000}],
    )
    src = SyntheticSource(settings, clock=clock)
    src.start()
    by_second = []
    for _ in range(4):
        clock.now += 1.0
        events = [e for m in src.poll(0.0) for e in orjson.loads(m.value)]
        assert all(not dict(m.headers) for m in src.poll(0.0))  # nothing binary left
        by_second.append(events)
    ids = [e["id"] for events in by_second for e in events]
    assert len(ids) == len(set(ids)) == 4000  # unique, one per record
    assert all(i.startswith("doc-") for i in ids[:1000])  # the poll at 1 s: healthy, no topic records
    late = [e for events in by_second[1:] for e in events]  # polls from 2 s on: topic_shift
    topic = np.array([e["id"].startswith("topic-") for e in late])
    assert 0.2 < topic.mean() < 0.4  # about TOPIC_SHARE
    vectors = np.array([e["vector"] for e in late])
    centre = src._models[0].topic / np.linalg.norm(src._models[0].topic)
    assert (vectors[topic] @ centre).min() > (vectors[~topic] @ centre).max()  # the ids mark the new topic's rows


def test_phase_left_counts_down_and_wraps_with_the_loop() -> None:
    clock = Clock()
    settings = SyntheticSourceSettings(
        models=[{"name": "m", "dim": DIM}],
        phases=[{"kind": "healthy", "seconds": 10}, {"kind": "swapped", "seconds": 5}],
    )
    src = SyntheticSource(settings, clock=clock)
    src.start()
    for now, kind, left in (
        (0.0, "healthy", 10.0),
        (7.5, "healthy", 2.5),
        (12.0, "swapped", 3.0),
        (16.0, "healthy", 9.0),
    ):
        clock.now = now
        assert (src.current_phase.kind, src.phase_left(), src.elapsed) == (kind, pytest.approx(left), now)


def test_records_wait_for_their_batch_to_fill_at_most_a_tenth_of_a_second() -> None:
    clock = Clock()
    settings = SyntheticSourceSettings(models=[{"name": "m", "dim": DIM}], rate=1000.0, batch_size=500)
    src = SyntheticSource(settings, clock=clock)
    src.start()
    clock.now = 0.05  # 50 records due: not a batch's worth yet (100, a tenth of a second's traffic)
    assert src.poll(0.0) == []
    clock.now = 0.1
    (message,) = src.poll(0.0)
    assert len(message.value) == 100 * DIM * 4  # one message of 100 rows, not 100 messages
