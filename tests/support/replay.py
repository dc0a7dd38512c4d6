"""A drift shift replayed in time: successive cycles over a window that fills with new items.

From the shift on, a ``share`` of the arrivals come from :data:`topics.NEW_TOPICS`, so the window's
new share climbs from 0 to ``share`` over one window length and stays there. A cycle runs every
``records_per_cycle`` arrivals on a uniform sample of the window's records, with a fresh seed per
cycle as the daemon's (its subsampling and held-out splits change; the reference sample and its
regions do not). Shared by ``bench/drift_explain.py`` and ``tests/drift/test_regions.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from monitor.drift.attribution.regions import fit_regions
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.suite import DriftReport, run_drift_suite
from tests.support import topics

CYCLES_PER_WINDOW = 24  # the window spans 24 cycles: the verdict's power depends on the sample, not the length
RECORDS_PER_CYCLE = 250  # 6,000 records in a full window, so a 2,000-row sample is a third of it


@dataclass(frozen=True)
class Outcome:
    """One replicate: the cycle (1-based, after the shift) of the first verdict, whether a region or
    the novel share was named at it or the next cycle, and the named exemplars of arrivals."""

    first_verdict: int | None
    named_by_second: bool
    exemplars: tuple[str, ...]
    closest: float  # smallest p / threshold over the cycles once the window is full (< 1 fires)


def cycles(settings: DriftSettings, replicate: int, share: float, windows: int = 2) -> Iterator[DriftReport]:
    """The reports of ``windows`` window lengths of cycles after the shift (the generator may be left early)."""
    vectors = topics.embeddings()
    rows = settings.window_sample_size
    rng = np.random.default_rng(5000 + replicate)
    reference = vectors[topics.draw(rng, 2 * settings.reference_sample_size)]
    regions = fit_regions(reference, seed=replicate)
    stream = [topics.draw(rng, RECORDS_PER_CYCLE) for _ in range(CYCLES_PER_WINDOW)]
    for cycle in range(windows * CYCLES_PER_WINDOW):
        stream.append(topics.draw(rng, RECORDS_PER_CYCLE, new_share=share))
        live = np.concatenate(stream[-CYCLES_PER_WINDOW:])
        records = live[rng.choice(len(live), min(rows, len(live)), replace=False)]
        yield run_drift_suite(vectors[records], reference, settings, seed=cycle + 100 * replicate, regions=regions,
                              window_ids=topics.ids_of(records))


def replicate_outcome(settings: DriftSettings, replicate: int, share: float = 0.10, windows: int = 2) -> Outcome:
    """Replay until the verdict's second cycle (or ``windows`` window lengths without a verdict)."""
    first: int | None = None
    named, shown, ratios = False, [], []
    for cycle, report in enumerate(cycles(settings, replicate, share, windows), start=1):
        if cycle >= CYCLES_PER_WINDOW:
            ratios.append(min(r.p_value / r.threshold for r in report.results))
        if report.detected and first is None:
            first = cycle
        if first is None:
            continue
        assert report.regions is not None
        explained = report.regions
        if explained.shifted or explained.novel_shifted:
            named = True
            shown += [i for r in explained.regions if r.shifted and r.change > 0 for i in r.window_exemplars]
            shown += list(explained.novel_exemplars) if explained.novel_shifted else []
        if cycle >= first + 1:
            break
    return Outcome(first, named, tuple(shown), min(ratios) if ratios else float("nan"))
