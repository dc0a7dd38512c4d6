"""Measure the drift explanation on real MiniLM sentence embeddings.

Cases, each over ``--replicates`` replicates (default 10), with the default 2,000-row window and
reference samples and the cycle alpha of a 5 s and a 60 s cycle (a fresh false alarm a month):

- ``quarter``: a quarter of the window sample from topics absent from the reference;
- ``tenth``: a tenth of it;
- ``swap``: the same traffic through a rotated copy of the model (every vector rotated);
- ``null``: an unchanged window (the explanation must name nothing without a verdict);
- ``replay``: a replay in time of the ``tenth`` case (``tests/support/replay.py``). From the shift
  on, a tenth of the arrivals come from the new topics, so the window's new share climbs from 0 to
  a tenth over one window length (24 cycles) and stays there; a cycle (at the 5 s or 60 s cycle's
  alpha) on a fresh uniform sample of the window, with a fresh seed, for two window lengths. Per
  replicate: the cycle at which the verdict first fires, and whether a region or the novel share is
  named at that cycle or the next (the target: by the verdict's second cycle).

- ``unseen`` (not in the default ``--cases``): ``bench/detection``'s WordNet corpus, cycles on
  windows a tenth (then a fifth) of which come from classes the reference never had: at the first
  cycle a region is named, how many of its window exemplars are new items (:func:`run_unseen`);
- ``naming`` (not in the default ``--cases`` either): other partitions and rankings against the
  detection bench's δ = 10% windows, for the classes 32 regions do not name (:func:`run_naming`);
- ``rules`` (nor this): the exemplar rules side by side on the detection bench's windows (:func:`run_rules`).

Each replicate of the first four is ONE cycle on a window whose composition is the case's share (the window sample
of a reservoir over a window holding that share is Binomial(sample, share) new rows); this is not
a replay in time, so "named at the first verdict" means "named at a cycle whose window holds that
share". Per case it prints: verdicts, explanations that name a region or the novel share, the
novel share, and the share of named exemplars that are new items. It also compares two exemplar
rules on the ``quarter`` windows: today's "least like any reference row" (largest distance to the
nearest reference row) and the MMD witness (Gretton et al. 2012; Gaussian kernel, median
bandwidth): witness(x) = mean k(x, window) - mean k(x, reference), both taking the top 10 rows;
and two rules for ranking the regions: the size of the share change, and the region's part of
the MMD statistic (``witness_shares``, what the explanation ranks by), by the share of new items
in the region each puts first.
And the cost of a cycle with and without the explanation (same machine, same run).

Run: ``python bench/drift_explain.py`` (``--replicates 3`` for a smoke run; ``--cases replay`` for the
replay alone; ``--cases unseen`` for the WordNet replay, whose embeddings ``bench/detection/corpus.py``
computes once and caches).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitor.drift.attribution.region_shares import nearest_distance, neighbour_shares
from monitor.drift.attribution.regions import fit_regions
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.heldout import kernel_witness
from monitor.drift.twosample.mmd import median_bandwidth
from monitor.drift.twosample.suite import run_drift_suite
from tests.support import replay, topics
from tests.support.realdata import random_rotation

ROWS = 2000
TOP = 10
UNSEEN_SHARE = 0.10


def witness(window: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """The MMD witness at the window's rows: mean kernel to the window minus to the reference (the
    suite's RBF kernel and median bandwidth)."""
    sigma = median_bandwidth(np.concatenate([window, reference]), np.random.default_rng(0))
    return kernel_witness(sigma)(window, reference)(window)


def new_fraction(ids: list[str]) -> float:
    return float(np.mean([topics.topic_of(i) in topics.NEW_TOPICS for i in ids])) if ids else float("nan")


def run_case(case: str, interval: int, replicates: int, compare: bool) -> None:
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=ROWS,
                             reference_sample_size=ROWS, threads=1)
    vectors = topics.embeddings()
    share = {"quarter": 0.25, "tenth": 0.10, "swap": 0.0, "null": 0.0}[case]
    rotation = random_rotation(vectors.shape[1], seed=7).astype(np.float32)
    verdicts = named = named_without = 0
    novel, shown_new, shown = [], 0, 0
    least_like, by_witness = [], []
    top_by_change, top_by_mass, witness_seconds = [], [], []
    with_regions, without = [], []
    for seed in range(replicates):
        rng = np.random.default_rng(1000 + seed)
        reference = vectors[topics.draw(rng, 2 * ROWS)]
        records = topics.draw(rng, ROWS, new_share=share)
        window = vectors[records] @ rotation.T if case == "swap" else vectors[records]
        ids = topics.ids_of(records)
        regions = fit_regions(reference, seed=seed)
        start = time.perf_counter()
        report = run_drift_suite(window, reference, settings, seed=seed, regions=regions, window_ids=ids)
        with_regions.append(time.perf_counter() - start)
        start = time.perf_counter()
        run_drift_suite(window, reference, settings, seed=seed)
        without.append(time.perf_counter() - start)
        assert report.regions is not None
        explained = report.regions
        said = bool(explained.shifted) or explained.novel_shifted
        verdicts += report.detected
        named += said and report.detected
        named_without += said and not report.detected
        novel.append(explained.novel_share)
        gained = [i for r in explained.regions if r.shifted and r.change > 0 for i in r.window_exemplars]
        gained += list(explained.novel_exemplars) if explained.novel_shifted else []
        shown += len(gained)
        shown_new += sum(topics.topic_of(i) in topics.NEW_TOPICS for i in gained)
        if compare:
            w, ref = window.astype(np.float64), reference[:ROWS].astype(np.float64)
            far = np.argsort(-nearest_distance(w, ref))[:TOP]
            least_like.append(new_fraction([ids[i] for i in far]))
            start = time.perf_counter()
            scores = witness(w, ref)
            witness_seconds.append(time.perf_counter() - start)
            by_witness.append(new_fraction([ids[i] for i in np.argsort(-scores)[:TOP]]))
            labels, _ = regions.assign(w)
            new_rows = np.array([topics.topic_of(i) in topics.NEW_TOPICS for i in ids])
            first = max(explained.regions, key=lambda r: abs(r.change)).region
            top_by_change.append(float(new_rows[labels == first].mean()))
            top_by_mass.append(float(new_rows[labels == explained.ranked()[0].region].mean()))
    line = (f"{case:8s} {interval:3d}s: verdict {verdicts}/{replicates}, named behind it {named}/{verdicts}, "
            f"named without a verdict {named_without}, novel share {np.mean(novel):.3f} "
            f"[{np.min(novel):.3f}, {np.max(novel):.3f}]")
    if share and case != "swap":
        line += f", named exemplars of arrivals new {shown_new}/{shown}"
    print(line)
    print(f"          cycle {np.median(with_regions):.2f} s with the explanation, {np.median(without):.2f} s without "
          f"(median; ratio {np.median(with_regions) / np.median(without):.2f})")
    if compare:
        print(f"          top-{TOP} exemplars that are new items: least like any reference row "
              f"{np.mean(least_like):.3f}, MMD witness {np.mean(by_witness):.3f}")
        print(f"          new items in the region ranked first: by share change {np.mean(top_by_change):.3f}, "
              f"by its part of the MMD (the explanation's ranking) {np.mean(top_by_mass):.3f}; the bench's "
              f"witness at the window rows: {np.median(witness_seconds):.2f} s")


def run_replay(interval: int, replicates: int, rows: int = ROWS, share: float = 0.10) -> None:
    """The ``replay`` case (``tests.support.replay``): successive cycles over a window that fills with
    a ``share`` of new items. Besides the verdicts it prints how far the verdict was from firing:
    the smallest ratio of a test's p-value to its corrected threshold once the window is full (< 1 fires)."""
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=rows,
                             reference_sample_size=rows, threads=1)
    outcomes = []
    for seed in range(replicates):
        outcome = replay.replicate_outcome(settings, seed, share)
        outcomes.append(outcome)
        first = outcome.first_verdict
        filled = min(first, replay.CYCLES_PER_WINDOW) * share / replay.CYCLES_PER_WINDOW if first else 0.0
        shown = "none" if first is None else f"cycle {first} (new share of the window {filled:.3f})"
        print(f"          replicate {seed}: first verdict at {shown}, named by its second cycle: "
              f"{outcome.named_by_second}, smallest p / threshold {outcome.closest:.3g}")
    fired = [o.first_verdict for o in outcomes if o.first_verdict is not None]
    shown = [i for o in outcomes for i in o.exemplars]
    closest = [o.closest for o in outcomes]
    print(f"replay   {interval:3d}s, {rows} rows: verdict within two windows {len(fired)}/{replicates}, "
          f"named by the verdict's second cycle {sum(o.named_by_second for o in outcomes)}/{replicates}, first "
          f"verdict at cycle {np.median(fired) if fired else float('nan'):.0f} after the shift (median; "
          f"{replay.CYCLES_PER_WINDOW} cycles fill the window), named exemplars new "
          f"{sum(topics.topic_of(i) in topics.NEW_TOPICS for i in shown)}/{len(shown)}; smallest p / threshold "
          f"once the window is full: median {np.nanmedian(closest):.3g} [{np.nanmin(closest):.3g}, "
          f"{np.nanmax(closest):.3g}]")


def run_unseen(replicates: int, share: float = UNSEEN_SHARE, cycles: int = 12, interval: int = 60) -> None:
    """The ``unseen`` case: WordNet glosses (``bench/detection``'s corpus, MiniLM), a 4,000-row reference of
    the 16 seen classes, then cycles on windows long after the shift, a ``share`` of whose records come
    from the 4 unseen classes (a fresh 2,000-row window sample and seed each cycle), the suite at the
    daemon's default sizes and a 60 s cycle with a false alarm a week (the detection benchmark's
    budget). At the first cycle where the explanation names a region that gained share (behind the
    verdict): the share of new items among the window exemplars of the first such region in the
    ranking, and of every such region; and the cost the exemplars' ranking adds (:func:`neighbour_shares`)."""
    from bench.detection import corpus
    from bench.detection.streams import Traffic

    texts = corpus.load()
    vectors = corpus.embeddings(texts, ("mean",))["mean"]
    traffic = Traffic(texts)
    unseen = np.isin(texts.labels, [texts.classes.index(c) for c in corpus.UNSEEN])
    settings = DriftSettings(interval_seconds=interval, false_alarm_every="7d", threads=1)
    first_new = first_shown = all_new = all_shown = 0
    named_at: list[int] = []
    costs = []
    for seed in range(replicates):
        rng = np.random.default_rng(7000 + seed)
        reference = vectors[traffic.base(rng, 2 * settings.reference_sample_size)]
        regions = fit_regions(reference, seed=seed)
        outcome = f"not named in {cycles} cycles"
        for cycle in range(1, cycles + 1):
            records = traffic.base(rng, settings.window_sample_size)
            new = rng.random(len(records)) < share
            records[new] = traffic.unseen[rng.integers(0, len(traffic.unseen), int(new.sum()))]
            window = vectors[records]
            report = run_drift_suite(window, reference, settings, seed=cycle + 100 * seed, regions=regions,
                                     window_ids=tuple(str(i) for i in records))
            start = time.process_time()  # CPU time: the machine may be shared
            neighbour_shares(window.astype(np.float64), reference[: len(window)].astype(np.float64),
                             np.random.default_rng(seed))
            costs.append(time.process_time() - start)
            assert report.regions is not None
            gained = [r for r in report.regions.ranked() if r.shifted and r.change > 0]
            if not gained:
                continue
            first = [int(i) for i in gained[0].window_exemplars]
            every = [int(i) for r in gained for i in r.window_exemplars]
            first_new += int(unseen[first].sum())
            first_shown += len(first)
            all_new += int(unseen[every].sum())
            all_shown += len(every)
            named_at.append(cycle)
            outcome = (f"named at cycle {cycle} ({new.mean():.3f} of the window new), first region's exemplars "
                       f"new {int(unseen[first].sum())}/{len(first)}, every named region's "
                       f"{int(unseen[every].sum())}/{len(every)}")
            break
        print(f"          replicate {seed}: {outcome}", flush=True)
    print(f"unseen   {interval:3d}s, {share:.0%} of the window new: a region named within {cycles} cycles in "
          f"{len(named_at)}/{replicates} (cycle {np.median(named_at) if named_at else float('nan'):.0f}, median); "
          f"at the first named cycle, new items among the first named region's window exemplars {first_new}/"
          f"{first_shown}, among every named region's {all_new}/{all_shown}; the exemplars' ranking "
          f"{np.median(costs) * 1000:.0f} ms of CPU a cycle (median)")


def run_naming(seeds: tuple[int, ...] = (32, 33, 34), purity: float = 0.6) -> None:
    """The ``naming`` case: does a finer partition or another ranking name the class whose share rose
    by 10%, where 32 regions ranked by their part of the MMD miss the abstract WordNet classes?
    ``bench/detection``'s δ = 10% case at its default sizes (4,000-row reference, 2,000-row window
    wholly after the change, one replicate per seen class) for each seed; a partition names the class
    when the cell ranked first, or one Benjamini–Hochberg names (at ``q``/2, whatever the verdict),
    holds at least ``purity`` of it among its window rows (the bench's rule). Partitions: the 32
    regions, each split in 4 by k-means on its fitted rows, and 64 cells; rankings: the cell's part of
    the MMD, the mean witness of its window rows (at least 10), Fisher's p-value of a gain."""
    from bench.detection import corpus
    from bench.detection.streams import Traffic
    from monitor.drift.attribution.region_shares import share_p_values
    from monitor.drift.attribution.regions import kmeans, nearest
    from monitor.multiple_testing import benjamini_hochberg

    texts = corpus.load()
    vectors = corpus.embeddings(texts, ("mean",))["mean"].astype(np.float64)
    traffic = Traffic(texts)
    hits: dict[str, int] = {}
    windows = 0
    for seed in seeds:
        rng = np.random.default_rng(seed)
        for r in range(len(corpus.SEEN)):
            reference = vectors[traffic.base(rng, 4000)]
            records = traffic.shifted(rng, 2000, "share10", r)
            window, injected = vectors[records], texts.labels[records] == texts.classes.index(corpus.SEEN[r])
            fit_rng = np.random.default_rng(r)  # fit_regions' own split and k-means
            order = fit_rng.permutation(len(reference))
            fitted, held = reference[order[:2000]], reference[order[2000:]]
            coarse = kmeans(fitted, 32, fit_rng)
            sample = reference[np.random.default_rng(1000 + r).choice(len(reference), 2000, replace=False)]
            witness_rng = np.random.default_rng(r)
            fit = kernel_witness(median_bandwidth(np.concatenate([window, sample]), witness_rng))(
                window[witness_rng.choice(2000, 1000, replace=False)],
                sample[witness_rng.choice(2000, 1000, replace=False)])
            at_window, at_sample = fit(window), fit(sample)
            members, _ = nearest(fitted, coarse)
            partitions = {
                "32 regions": coarse,
                "32 regions split in 4": np.concatenate([
                    kmeans(fitted[members == j], 4, np.random.default_rng(j)) if (members == j).sum() > 40
                    else coarse[j : j + 1] for j in range(32)]),
                "64 cells": kmeans(fitted, 64, np.random.default_rng(r)),
            }
            for name, centres in partitions.items():
                k = len(centres)
                in_window, in_held, in_sample = (nearest(x, centres)[0] for x in (window, held, sample))
                window_counts, held_counts = np.bincount(in_window, minlength=k), np.bincount(in_held, minlength=k)
                pure = np.array([injected[in_window == j].mean() >= purity if window_counts[j] else False
                                 for j in range(k)])
                p = share_p_values(window_counts, held_counts)
                gain = window_counts / window_counts.sum() > held_counts / held_counts.sum()
                named = bool(pure[gain & (benjamini_hochberg(p) <= 0.025)].any())
                part = (np.bincount(in_window, weights=at_window, minlength=k) / len(window)
                        - np.bincount(in_sample, weights=at_sample, minlength=k) / len(sample))
                mean_witness = np.array([at_window[in_window == j].mean() if window_counts[j] >= 10 else -np.inf
                                         for j in range(k)])
                firsts = {"part of the MMD": int(np.argmax(part)), "mean witness": int(np.argmax(mean_witness)),
                          "Fisher p": int(np.argmin(np.where(gain, p, 2.0)))}
                hits[f"{name}, named by BH"] = hits.get(f"{name}, named by BH", 0) + named
                for rule, first in firsts.items():
                    key = f"{name}, first by {rule} or named"
                    hits[key] = hits.get(key, 0) + (bool(pure[first]) or named)
            windows += 1
        print(f"          seed {seed} done", flush=True)
    for key, count in hits.items():
        print(f"naming   {key}: {count}/{windows}")


def run_rules(seeds: tuple[int, ...] = (31, 32)) -> None:
    """The ``rules`` case: exemplar rules side by side on ``bench/detection``'s windows at its default
    sizes (4,000-row reference, 2,000-row window wholly after the change, one replicate per seen class
    and seed), for the ``unseen`` case (a tenth from classes the reference never had) and δ = 10%
    (a seen class raised). Each window's regions are named by Benjamini–Hochberg at ``q``/2 whatever
    the verdict (so every window counts); per rule, the items of what arrived among the 3 window
    exemplars of the first named region that gained share, and of every such region."""
    from bench.detection import corpus
    from bench.detection.streams import Traffic
    from monitor.drift.attribution.region_shares import compare_regions, exemplar_order, witness_parts
    from monitor.drift.attribution.regions import ranked_ids

    texts = corpus.load()
    vectors = corpus.embeddings(texts, ("mean",))["mean"].astype(np.float64)
    traffic = Traffic(texts)
    for case in ("unseen", "share10"):
        tally: dict[str, list[int]] = {}
        for seed in seeds:
            rng = np.random.default_rng(seed)
            for r in range(len(corpus.SEEN)):
                reference = vectors[traffic.base(rng, 4000)]
                records = traffic.shifted(rng, 2000, case, r)
                window = vectors[records]
                arrived = (np.isin(texts.labels[records], [texts.classes.index(c) for c in corpus.UNSEEN])
                           if case == "unseen" else texts.labels[records] == texts.classes.index(corpus.SEEN[r]))
                regions = fit_regions(reference, seed=r)
                assert regions is not None
                sample = reference[np.random.default_rng(1000 + r).choice(len(reference), 2000, replace=False)]
                ids = [str(i) for i in range(len(window))]
                report = compare_regions(regions, window, ids, sample, 0.025, exemplars=3, seed=r)
                gained = [g.region for g in report.ranked() if g.shifted and g.change > 0]
                if not gained:
                    continue
                labels = regions.assign(window)[0]
                # the kernel witness as compare_regions computes it (its rng from the same seed)
                at_window = witness_parts(window, labels, sample, regions.assign(sample)[0], regions.k,
                                          np.random.default_rng(r))[1]
                scores = {
                    "neighbours' share, 20 (the rule)": exemplar_order(
                        neighbour_shares(window, sample, np.random.default_rng(r)), at_window),
                    "neighbours' share, 10": exemplar_order(
                        neighbour_shares(window, sample, np.random.default_rng(r), neighbours=10), at_window),
                    "neighbours' share, 40": exemplar_order(
                        neighbour_shares(window, sample, np.random.default_rng(r), neighbours=40), at_window),
                    "neighbours' share, 20, 1,000 rows a side": exemplar_order(
                        neighbour_shares(window, sample, np.random.default_rng(r), points=1000), at_window),
                    "kernel witness (the previous rule)": -at_window,
                    "least like any reference row": -nearest_distance(window, sample),
                }
                for rule, score in scores.items():
                    chosen = ranked_ids(labels, score, ids, regions.k, 3)
                    first = [int(i) for i in chosen[gained[0]]]
                    every = [int(i) for j in gained for i in chosen[j]]
                    counts = tally.setdefault(rule, [0, 0, 0, 0])
                    counts[0] += int(arrived[first].sum())
                    counts[1] += len(first)
                    counts[2] += int(arrived[every].sum())
                    counts[3] += len(every)
        for rule, (first_hit, first_all, every_hit, every_all) in tally.items():
            print(f"rules    {case}: {rule}: first named region's exemplars arrived {first_hit}/{first_all}, "
                  f"every named region's {every_hit}/{every_all}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicates", type=int, default=10)
    parser.add_argument("--cases", default="quarter,tenth,swap,null,replay")
    parser.add_argument("--replay-rows", type=int, nargs="*", default=[],
                        help="also replay at a 5 s cycle with these window and reference sample sizes")
    args = parser.parse_args()
    for case in args.cases.split(","):
        if case == "naming":
            run_naming()
            continue
        if case == "rules":
            run_rules()
            continue
        if case == "unseen":
            for share in (UNSEEN_SHARE, 2 * UNSEEN_SHARE) if args.replicates > 3 else (UNSEEN_SHARE,):
                run_unseen(args.replicates, share)
            continue
        if case == "replay":
            for interval in (5, 60):
                run_replay(interval, args.replicates)
            for rows in args.replay_rows:
                run_replay(5, args.replicates, rows=rows)
            continue
        for interval in (5, 60) if case in ("quarter", "tenth") else (5,):
            run_case(case, interval, args.replicates, compare=case == "quarter" and interval == 5)


if __name__ == "__main__":
    main()
