"""One drift-test cycle: run the enabled tests on bounded samples, correct for multiplicity, decide.

Also the reference a window is compared with (:class:`ReferenceProfile`), in a form the daemon
can persist in its state directory and reload after a restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from monitor.drift.calibration import TestResult, apply_multiplicity
from monitor.drift.centroid import centroid_test
from monitor.drift.classifier import classifier_test
from monitor.drift.detectors import SignalBaseline
from monitor.drift.ks import ks_test
from monitor.drift.mmd import mmd_test
from monitor.drift.settings import DriftSettings
from monitor.files import atomic_savez

logger = logging.getLogger(__name__)

_NPZ_FORMAT_VERSION = 1


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


def uniform_subsample(sample: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``size`` rows, uniformly without replacement, in their original order."""
    if len(sample) <= size:
        return sample
    return sample[np.sort(rng.choice(len(sample), size=size, replace=False))]


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


@dataclass(frozen=True)
class ReferenceProfile:
    """What a window is compared with: a uniform sample of the reference records and their centroid.

    ``centroid`` is the mean over all ``count`` reference records (exact, from the running sums),
    not only over ``sample``. ``captured_at`` is unix seconds; ``source`` says where it came from
    (e.g. ``"first 5000 records"``, ``"pinned /etc/embmon/ref.npz"``, ``"lagged 86400s"``).

    Examples
    --------
    >>> import io
    >>> rng = np.random.default_rng(0)
    >>> profile = ReferenceProfile.from_sample(rng.normal(size=(50, 4)), captured_at=1.7e9, source="test")
    >>> buffer = io.BytesIO()
    >>> profile.to_npz(buffer)
    >>> _ = buffer.seek(0)
    >>> restored = ReferenceProfile.from_npz(buffer)
    >>> restored.count, restored.source, restored.sample.dtype, bool(np.all(restored.sample == profile.sample))
    (50, 'test', dtype('float32'), True)
    """

    sample: np.ndarray
    centroid: np.ndarray
    count: int
    captured_at: float
    source: str

    def __post_init__(self) -> None:
        sample = np.ascontiguousarray(self.sample, dtype=np.float32)
        centroid = np.asarray(self.centroid, dtype=np.float64)
        if sample.ndim != 2 or len(sample) < 2:
            raise ValueError(f"the reference sample must be (n >= 2, d); got shape {sample.shape}")
        if centroid.shape != (sample.shape[1],):
            raise ValueError(f"the centroid must have shape ({sample.shape[1]},); got {centroid.shape}")
        if not np.all(np.isfinite(sample)) or not np.all(np.isfinite(centroid)):
            raise ValueError("the reference contains non-finite values")
        if self.count < len(sample):
            raise ValueError(f"count ({self.count}) is smaller than the sample ({len(sample)} rows)")
        object.__setattr__(self, "sample", sample)
        object.__setattr__(self, "centroid", centroid)
        object.__setattr__(self, "count", int(self.count))
        object.__setattr__(self, "captured_at", float(self.captured_at))

    @classmethod
    def from_sample(
        cls,
        sample: np.ndarray,
        *,
        captured_at: float,
        source: str,
        centroid: np.ndarray | None = None,
        count: int | None = None,
    ) -> ReferenceProfile:
        """A profile whose centroid and count default to the sample's own."""
        sample = np.asarray(sample, dtype=np.float32)
        return cls(
            sample=sample,
            centroid=sample.mean(axis=0, dtype=np.float64) if centroid is None else centroid,
            count=len(sample) if count is None else count,
            captured_at=captured_at,
            source=source,
        )

    @property
    def dim(self) -> int:
        return int(self.sample.shape[1])

    def signal_baseline(self) -> SignalBaseline:
        """The online detectors' baseline (centroid direction and signal scales) from this reference."""
        return SignalBaseline.from_reference(self.sample, self.centroid)

    def to_npz(self, target: str | os.PathLike[str] | Any) -> None:
        """Write to a path (atomically: temporary file, then rename) or to a binary file object."""
        arrays: dict[str, Any] = {
            "format_version": np.int64(_NPZ_FORMAT_VERSION),
            "sample": self.sample,
            "centroid": self.centroid,
            "count": np.int64(self.count),
            "captured_at": np.float64(self.captured_at),
            "source": np.str_(self.source),
        }
        if not isinstance(target, (str, os.PathLike)):
            np.savez(target, **arrays)
            return
        atomic_savez(Path(target), arrays)

    @classmethod
    def from_npz(cls, source: str | os.PathLike[str] | Any) -> ReferenceProfile:
        """Read what :meth:`to_npz` wrote; a file from another format version is refused."""
        with np.load(source, allow_pickle=False) as data:
            version = int(data["format_version"]) if "format_version" in data else None
            if version != _NPZ_FORMAT_VERSION:
                raise ValueError(f"unsupported reference format version {version}; expected {_NPZ_FORMAT_VERSION}")
            return cls(
                sample=data["sample"],
                centroid=data["centroid"],
                count=int(data["count"]),
                captured_at=float(data["captured_at"]),
                source=str(data["source"]),
            )
