"""One drift-test cycle: run the enabled tests on bounded samples, correct for multiplicity, decide.

The reference a window is compared with is a :class:`~monitor.drift.profile.ReferenceProfile`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from monitor.drift.calibration import Multiplicity, TestResult, per_test_alpha
from monitor.drift.centroid import centroid_test
from monitor.drift.classifier import classifier_test
from monitor.drift.ks import ks_test
from monitor.drift.mmd import mmd_test
from monitor.drift.profile import uniform_subsample
from monitor.drift.settings import DriftSettings
from monitor.multiple_testing import holm_reject, holm_thresholds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriftReport:
    """The outcome of one cycle: per-test results (thresholds already corrected) and the verdict.

    ``detected`` is true when any test rejected at its corrected threshold; under no drift that
    happens with probability at most ``cycle_alpha``. ``errors`` names tests that raised (they are
    left out of the correction and the verdict).
    """

    results: tuple[TestResult, ...]
    detected: bool
    cycle_alpha: float
    multiplicity: str
    window_size: int
    reference_size: int
    seconds: float
    errors: Mapping[str, str] = field(default_factory=dict)

    def result(self, test: str) -> TestResult:
        """The result of one test by name (``mmd``, ``ks``, ``centroid``, ``classifier``)."""
        for result in self.results:
            if result.test == test:
                return result
        raise KeyError(f"no result for test {test!r}; ran {[r.test for r in self.results]}")

    @property
    def detected_tests(self) -> tuple[str, ...]:
        return tuple(r.test for r in self.results if r.detected)


@contextlib.contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """Cap numpy/scipy BLAS, OpenMP and torch intra-op threads for the duration, then restore.

    torch's and OpenBLAS's thread pools spin-wait between calls; interleaved on a small machine
    (or one shared with the ingest thread) they slow each other down several-fold, worst on small
    samples. The limits are process-wide while they hold.
    """
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(previous)


def apply_multiplicity(
    results: Sequence[TestResult], alpha: float, method: Multiplicity
) -> tuple[TestResult, ...]:
    """Re-decide each test with its corrected threshold so the cycle's false-alarm rate is ≤ ``alpha``."""
    if not results:
        return ()
    p = [r.p_value for r in results]
    if method == "bonferroni":
        thresholds = np.full(len(p), per_test_alpha(alpha, len(p)))
        decisions = np.asarray(p) <= thresholds
    elif method == "holm":
        thresholds = holm_thresholds(p, alpha)
        decisions = holm_reject(p, alpha)
    else:
        raise ValueError(f"unknown multiplicity correction {method!r}; use 'bonferroni' or 'holm'")
    return tuple(
        replace(r, threshold=float(t), detected=bool(d)) for r, t, d in zip(results, thresholds, decisions)
    )


def run_drift_suite(
    window_sample: np.ndarray,
    reference_sample: np.ndarray,
    settings: DriftSettings,
    seed: int | None = None,
) -> DriftReport:
    """Run every enabled test on (sub)samples of the window and the reference; one verdict.

    Samples larger than ``settings.window_sample_size`` / ``reference_sample_size`` are
    subsampled uniformly. Each test runs at the Bonferroni threshold ``cycle_alpha / k`` and is
    then re-decided by ``settings.multiplicity`` (Holm can only add detections once one test
    rejected; the verdict is the same). ``seed`` (default ``settings.seed``) makes the cycle
    deterministic: subsampling, permutations and the classifier's split all derive from it.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> settings = DriftSettings(interval_seconds=60, false_alarm_every="1h")  # alpha = 1/60
    >>> reference = rng.normal(size=(400, 16)).astype(np.float32)
    >>> run_drift_suite(rng.normal(size=(400, 16)).astype(np.float32), reference, settings).detected
    False
    >>> shifted = rng.normal(size=(400, 16)).astype(np.float32) + 0.25
    >>> report = run_drift_suite(shifted, reference, settings)
    >>> report.detected, report.detected_tests
    (True, ('mmd', 'ks', 'centroid', 'classifier'))
    """
    started = time.perf_counter()
    window = np.asarray(window_sample, dtype=np.float32)
    reference = np.asarray(reference_sample, dtype=np.float32)
    if window.ndim != 2 or reference.ndim != 2 or window.shape[1] != reference.shape[1]:
        raise ValueError(f"samples must be 2-D with the same dimension; got {window.shape} and {reference.shape}")
    seeds = np.random.SeedSequence(settings.seed if seed is None else seed).spawn(6)
    window = uniform_subsample(window, settings.window_sample_size, np.random.default_rng(seeds[0]))
    reference = uniform_subsample(reference, settings.reference_sample_size, np.random.default_rng(seeds[1]))

    alpha = settings.test_alpha
    runners: dict[str, Callable[[], TestResult]] = {
        "mmd": lambda: mmd_test(
            window, reference, alpha=alpha, permutations=settings.permutations_for("mmd"),
            stop_after=settings.mmd.stop_after, bandwidth=settings.mmd.bandwidth, seed=seeds[2],
            device=settings.device, block_size=settings.mmd.block_size,
        ),
        "ks": lambda: ks_test(
            window, reference, alpha=alpha, basis=settings.ks.basis, components=settings.ks.components,
            seed=seeds[3],
        ),
        "centroid": lambda: centroid_test(
            window, reference, alpha=alpha, permutations=settings.permutations_for("centroid"),
            stop_after=settings.centroid.stop_after, seed=seeds[4],
        ),
        "classifier": lambda: classifier_test(
            window, reference, alpha=alpha, train_fraction=settings.classifier.train_fraction,
            regularization=settings.classifier.regularization,
            squared_components=settings.classifier.squared_components, max_iter=settings.classifier.max_iter,
            seed=seeds[5],
        ),
    }
    raw: list[TestResult] = []
    errors: dict[str, str] = {}
    with thread_limit(settings.threads):
        for name in settings.enabled_tests:
            try:
                raw.append(runners[name]())
            except Exception as error:  # one broken test must not hide the others' verdicts
                logger.exception("drift test %s failed", name)
                errors[name] = f"{type(error).__name__}: {error}"
    results = apply_multiplicity(raw, settings.cycle_alpha, settings.multiplicity)
    report = DriftReport(
        results=results,
        detected=any(r.detected for r in results),
        cycle_alpha=settings.cycle_alpha,
        multiplicity=settings.multiplicity,
        window_size=len(window),
        reference_size=len(reference),
        seconds=time.perf_counter() - started,
        errors=errors,
    )
    logger.debug("drift suite: detected=%s tests=%s in %.2fs", report.detected, report.detected_tests, report.seconds)
    return report
