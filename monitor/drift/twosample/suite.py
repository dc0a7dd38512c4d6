"""One drift-test cycle: run the enabled tests on bounded samples, correct for multiplicity, decide.

The reference a window is compared with is a :class:`~monitor.drift.references.profile.ReferenceProfile`.

Within a time budget. Tests run cheapest first (KS, centroid, classifier, MMD) and none starts
after the cycle's deadline; a permutation test stops drawing at it (:mod:`monitor.deadline`).
Staged: the costly two (classifier, MMD) run only when a cheap one, or the scale screen, has a
p-value at most ``drift.screen_level`` (:mod:`monitor.drift.twosample.screen`); screened, they
count as ``p = 1`` like a skipped test, which can only lower the false-alarm rate.
The correction is always over the *planned* family, every enabled test, with a test that was
skipped or raised counted as ``p = 1``: which tests finish depends on the clock, and the clock
on the data (a drifted window keeps a permutation test busy), so shrinking the family to the
tests that finished would not keep the cycle's false-alarm rate at alpha; padding it does,
under any dependence.

With the reference's regions, the cycle also says *where* the window moved
(:mod:`monitor.drift.attribution.region_shares`); that explanation is not part of the verdict.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from threadpoolctl import ThreadpoolController

from monitor.deadline import Deadline
from monitor.drift.attribution.region_shares import RegionReport, compare_regions
from monitor.drift.attribution.regions import Regions
from monitor.drift.references.profile import subsample_ids, subsample_index, uniform_subsample
from monitor.drift.settings import DriftSettings
from monitor.drift.twosample.calibration import Multiplicity, TestResult, largest_passing, per_test_alpha
from monitor.drift.twosample.centroid import centroid_test
from monitor.drift.twosample.classifier import classifier_test
from monitor.drift.twosample.ks import ks_test
from monitor.drift.twosample.mmd import mmd_test
from monitor.drift.twosample.reference_cache import reference_cache
from monitor.drift.twosample.screen import COSTLY_TESTS, SCREENING_TESTS, screen_level, screen_p_value
from monitor.drift.twosample.spectrum import PooledScatter
from monitor.multiple_testing import (
    holm_reject,
    holm_thresholds,
    weighted_bonferroni_p_value,
    weighted_bonferroni_reject,
)

logger = logging.getLogger(__name__)

# The explanation's children are tested at fdr_q / 2: Yekutieli's (2008) bound for a hierarchy is q times a
# factor up to 2, and the children share the window sample that made the verdict (docs/drift.md, "What moved").
HIERARCHY_FACTOR = 2

RUN_ORDER = ("ks", "centroid", "classifier", "mmd")  # cheapest first: a deadline cuts the costly ones


@dataclass(frozen=True)
class DriftReport:
    """The outcome of one cycle: per-test results (thresholds already corrected) and the verdict.

    ``detected`` is true when any test rejected at its corrected threshold; under no drift that
    happens with probability at most ``cycle_alpha``. ``planned`` are the enabled tests, the
    family the correction is over. ``errors`` names tests that raised and ``cut`` tests the
    deadline cut short (``skipped``: never started; ``truncated``: a permutation test that
    stopped drawing, its result is in ``results``); ``screened`` the costly tests the staged
    cycle's screen left out (``screen_p_value``: the smallest cheap p-value it read, None when
    no screen ran); tests without a result count as ``p = 1``. ``weights``: each planned test's
    weight in the correction (empty: equal weights).
    ``regions``: where the window moved, when the reference has regions.
    """

    results: tuple[TestResult, ...]
    detected: bool
    cycle_alpha: float
    multiplicity: str
    window_size: int
    reference_size: int
    seconds: float
    errors: Mapping[str, str] = field(default_factory=dict)
    planned: tuple[str, ...] = ()
    cut: Mapping[str, str] = field(default_factory=dict)
    regions: RegionReport | None = None
    screened: tuple[str, ...] = ()
    screen_p_value: float | None = None
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def family_size(self) -> int:
        """Tests the correction is over: the planned ones (at least those with a result)."""
        return max(len(self.planned), len(self.results))

    @property
    def adjusted_p_value(self) -> float | None:
        """The cycle's p-value: ``min(1, min_i p_i · W / w_i)`` (weighted Bonferroni; ``W`` the planned
        tests' total weight, ``k · min p`` with equal weights), a test without a result counting as
        ``p = 1``. At most ``cycle_alpha`` exactly when the cycle detects. None when no test was planned."""
        if not self.family_size:
            return None
        if self.weights and all(r.test in self.weights for r in self.results):
            tested = {r.test: r.p_value for r in self.results}
            weights = list(self.weights.values())
            if len(set(weights)) > 1:  # decided in this arithmetic (weighted_bonferroni_reject)
                return weighted_bonferroni_p_value([tested.get(name, 1.0) for name in self.weights], weights)
        smallest = min((r.p_value for r in self.results), default=1.0)
        value = min(1.0, self.family_size * smallest)
        # equal weights decide p <= alpha / k (plain Holm, bit for bit); where k is not a power of two,
        # k · p can round to the other side of alpha by an ulp: the value then steps to the verdict's side
        first = smallest <= per_test_alpha(self.cycle_alpha, self.family_size)
        if first and value > self.cycle_alpha:
            return self.cycle_alpha
        if not first and value <= self.cycle_alpha:
            return min(1.0, math.nextafter(self.cycle_alpha, math.inf))
        return value

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
    """Cap numpy/scipy BLAS, OpenMP and (when loaded) torch intra-op threads for the duration, then restore.

    torch's and OpenBLAS's thread pools spin-wait between calls; interleaved on a small machine
    (or one shared with the ingest thread) they slow each other down several-fold, worst on small
    samples. The limits are process-wide while they hold. torch is capped only if something
    already imported it (a CUDA path): the CPU tests run in numpy, and importing torch here would
    cost every daemon its memory.
    """
    if threads is None:
        yield
        return
    torch = sys.modules.get("torch")
    previous = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        with _controller().limit(limits=threads):
            yield
    finally:
        if torch is not None and previous is not None:
            torch.set_num_threads(previous)


_controllers: dict[int, ThreadpoolController] = {}


def _controller() -> ThreadpoolController:
    """The thread pools of the libraries loaded so far. Finding them scans the process's shared
    objects (about 1 ms); a library is loaded only by an import, so the scan is redone only when
    the set of imported modules grew."""
    loaded = len(sys.modules)
    found = _controllers.get(loaded)
    if found is None:
        _controllers.clear()
        found = _controllers[loaded] = ThreadpoolController()
    return found


def apply_multiplicity(
    results: Sequence[TestResult], alpha: float, method: Multiplicity, family: int | None = None,
    weights: Mapping[str, float] | None = None,
) -> tuple[TestResult, ...]:
    """Re-decide each test with its corrected threshold so the cycle's false-alarm rate is ≤ ``alpha``.

    ``family``: how many tests were planned (default: those in ``results``); the missing ones
    count as ``p = 1``, so the thresholds are those of the whole family. ``weights``: each planned
    test's weight by name (the family is then every test named; default: equal weights): weighted
    Bonferroni (``alpha · w / Σ w``) or weighted Holm (:func:`monitor.multiple_testing.holm_thresholds`).
    """
    if not results:
        return ()
    if weights is not None:
        unknown = [r.test for r in results if r.test not in weights]
        if unknown:
            raise ValueError(f"no weight for the tests {unknown}; weights name {sorted(weights)}")
        absent = [name for name in weights if name not in {r.test for r in results}]
        w = [float(weights[r.test]) for r in results] + [float(weights[name]) for name in absent]
        missing = len(absent)
    else:
        missing = max(0, (family or len(results)) - len(results))
        w = [1.0] * (len(results) + missing)
    p = [r.p_value for r in results] + [1.0] * missing
    if method == "bonferroni":
        if len(set(w)) <= 1:  # equal weights: alpha / k, as before the weights
            thresholds = np.full(len(p), per_test_alpha(alpha, len(p)))
            decisions = np.asarray(p) <= thresholds
        else:  # decided in weighted_bonferroni_p_value's arithmetic, so the cycle's p-value agrees
            thresholds = np.array([largest_passing(alpha, math.fsum(w), weight) for weight in w])
            decisions = weighted_bonferroni_reject(p, alpha, w)
    elif method == "holm":
        thresholds = holm_thresholds(p, alpha, w, threshold=largest_passing)
        decisions = holm_reject(p, alpha, w)
    else:
        raise ValueError(f"unknown multiplicity correction {method!r}; use 'bonferroni' or 'holm'")
    return tuple(  # the missing tests' thresholds and decisions (the tail of both) are dropped
        replace(r, threshold=float(t), detected=bool(d))
        for r, t, d in zip(results, thresholds, decisions, strict=False)
    )


def run_drift_suite(
    window_sample: np.ndarray,
    reference_sample: np.ndarray,
    settings: DriftSettings,
    seed: int | None = None,
    *,
    deadline: Deadline | None = None,
    window_ids: tuple[str | None, ...] | None = None,
    regions: Regions | None = None,
) -> DriftReport:
    """Run every enabled test on (sub)samples of the window and the reference; one verdict.

    Samples larger than ``settings.window_sample_size`` / ``reference_sample_size`` are
    subsampled uniformly. Each test runs at its weighted Bonferroni threshold
    (``settings.alpha_for``: ``cycle_alpha · w / Σ w``, the weights ``<test>.weight``) and is then
    re-decided by ``settings.multiplicity`` (weighted Holm can only add detections once one test
    rejected; the verdict is the same). ``seed`` (default ``settings.seed``) makes the cycle
    deterministic: subsampling, permutations and the classifier's split all derive from it.
    ``deadline``: no test starts after it, permutation tests stop drawing at it (module
    docstring). ``regions`` (and the window rows' ``window_ids``, for exemplars): the
    explanation of where the window moved, tested behind the verdict at ``regions.fdr_q``.

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
    seeds = np.random.SeedSequence(settings.seed if seed is None else seed).spawn(7)
    kept = subsample_index(len(window), settings.window_sample_size, np.random.default_rng(seeds[0]))
    window, window_ids = window[kept], subsample_ids(window_ids, kept)
    whole = len(reference) <= settings.reference_sample_size
    reference = uniform_subsample(reference, settings.reference_sample_size, np.random.default_rng(seeds[1]))
    # the same reference object every cycle unless it is subsampled anew: only then are its pieces worth keeping
    cached = reference_cache(reference) if whole else None
    deadline = deadline or Deadline.never()
    # one pooled scatter a cycle: the KS basis, the classifier's squared components and the centroid's
    # analytic null share its top eigenpairs
    shared: list[PooledScatter] = []
    doubles: list[tuple[np.ndarray, np.ndarray]] = []

    def wide() -> tuple[np.ndarray, np.ndarray]:  # float64 copies, made once, for the tests that compute in float64
        if not doubles:
            doubles.append((window.astype(np.float64), reference.astype(np.float64)))
        return doubles[0]

    def pooled() -> PooledScatter:
        if not shared:
            shared.append(PooledScatter(*wide(), cached))
        return shared[0]

    # each test at its own share of the budget (weighted Holm's first step); the settings' derived
    # values are read once a cycle (each reading parses the budget and resolves the weights again)
    planned = settings.enabled_tests
    alpha = {name: settings.alpha_for(name) for name in planned}.__getitem__
    mmd_null, centroid_null = settings.null_for("mmd"), settings.null_for("centroid")
    runners: dict[str, Callable[[], TestResult]] = {
        "mmd": lambda: mmd_test(
            window, reference, alpha=alpha("mmd"), permutations=settings.permutations_for("mmd"),
            stop_after=settings.mmd.stop_after, bandwidth=settings.mmd.bandwidth, seed=seeds[2],
            device=settings.device, block_size=settings.mmd.block_size, null=mmd_null,
            deadline=deadline, reference=cached,
        ),
        "ks": lambda: ks_test(
            *wide(), alpha=alpha("ks"), basis=settings.ks.basis, components=settings.ks.components,
            seed=seeds[3], reference=cached, pooled=pooled() if settings.ks.basis == "pca_pooled" else None,
        ),
        "centroid": lambda: centroid_test(
            *wide(), alpha=alpha("centroid"), permutations=settings.permutations_for("centroid"),
            stop_after=settings.centroid.stop_after, seed=seeds[4], null=centroid_null,
            deadline=deadline, reference=cached,
            pooled=pooled() if centroid_null == "analytic" else None,
            spectrum_components=settings.ks.components,
        ),
        "classifier": lambda: classifier_test(
            *wide(), alpha=alpha("classifier"), train_fraction=settings.classifier.train_fraction,
            regularization=settings.classifier.regularization,
            squared_components=settings.classifier.squared_components, max_iter=settings.classifier.max_iter,
            seed=seeds[5], pooled=pooled(),
        ),
    }
    raw: dict[str, TestResult] = {}
    errors: dict[str, str] = {}
    cut: dict[str, str] = {}
    screened: tuple[str, ...] = ()
    screen_p: float | None = None
    # at least MARGIN times the alpha of a costly test: one near rejecting gets to run
    level = screen_level(settings.screen_level, max((alpha(t) for t in planned if t in COSTLY_TESTS), default=0.0))
    staged = level < 1 and all(t in planned for t in SCREENING_TESTS)
    explained = None
    with thread_limit(settings.threads):
        for name in sorted(planned, key=RUN_ORDER.index):
            if deadline.expired():
                cut[name] = "skipped"
                continue
            if name in COSTLY_TESTS and staged:
                staged = False  # the screen runs once, before the first costly test
                try:
                    screen_p = screen_p_value(raw, *wide(), pooled, settings.ks.components)
                except Exception:  # a broken screen must not hide a shift: everything runs
                    logger.exception("drift screen failed; running every test")
                if screen_p is not None and screen_p > level:
                    screened = tuple(t for t in planned if t in COSTLY_TESTS)
            if name in screened:
                continue
            try:
                raw[name] = runners[name]()
            except Exception as error:  # one broken test must not hide the others' verdicts
                logger.exception("drift test %s failed", name)
                errors[name] = f"{type(error).__name__}: {error}"
                continue
            if raw[name].extra.get("truncated"):
                cut[name] = "truncated"
        # the explanation comes after the verdict's tests: on a starved machine the time it takes
        # must not run the cycle past the deadline before the tests begin (it once cut all four)
        if regions is not None:
            explained = compare_regions(
                regions, window, window_ids, reference, settings.regions.fdr_q / HIERARCHY_FACTOR,
                settings.regions.exemplars,
                seed=seeds[6],
            )
    in_order = [raw[name] for name in planned if name in raw]
    weights = settings.test_weights
    results = apply_multiplicity(in_order, settings.cycle_alpha, settings.multiplicity,
                                 weights={name: weights[name] for name in planned})
    if cut:
        logger.info("drift suite: the deadline cut %s", ", ".join(f"{t} ({how})" for t, how in sorted(cut.items())))
    detected = any(r.detected for r in results)
    if explained is not None:  # hierarchical: the explanation's tests count only behind a verdict
        explained = explained.gated(detected)
    report = DriftReport(
        results=results,
        detected=detected,
        cycle_alpha=settings.cycle_alpha,
        multiplicity=settings.multiplicity,
        window_size=len(window),
        reference_size=len(reference),
        seconds=time.perf_counter() - started,
        errors=errors,
        planned=planned,
        cut=cut,
        regions=explained,
        screened=screened,
        screen_p_value=screen_p,
        weights={name: weights[name] for name in planned},
    )
    logger.debug("drift suite: detected=%s tests=%s in %.2fs", report.detected, report.detected_tests, report.seconds)
    return report
