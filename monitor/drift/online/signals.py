"""The cheap per-record signals the online detectors watch, and their reference baseline.

- ``cosine``: cosine similarity of the record to the reference centroid (a new topic mix or a new
  model moves it);
- ``norm``: the record's L2 norm (a normalisation bug, a quantisation change, a new model).

Signals are standardised with the reference's own mean and spread of that signal, so detector
parameters are in units of standard deviations whatever the model. numpy only: the reference
profile uses this module without loading river. (The signal names, for the settings:
``monitor.drift.online.detector_kinds.SIGNALS``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


def record_signals(
    vectors: np.ndarray, centroid_unit: np.ndarray, norms: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Per-record ``cosine`` (to the unit reference centroid) and ``norm``, vectorised, float64 (n,).

    ``norms`` are the rows' L2 norms when the caller already has them.
    """
    if norms is None:
        norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64))
    projections = vectors @ centroid_unit.astype(vectors.dtype, copy=False)
    return {"cosine": projections / norms, "norm": norms}


@dataclass(frozen=True)
class SignalBaseline:
    """The reference's centroid direction and each signal's mean and standard deviation."""

    centroid_unit: np.ndarray
    means: Mapping[str, float]
    stds: Mapping[str, float]

    @classmethod
    def from_reference(cls, sample: np.ndarray, centroid: np.ndarray | None = None) -> SignalBaseline:
        """Baseline from a reference sample (n, d); ``centroid`` defaults to the sample mean.

        A signal that is constant on the reference (every vector unit-norm: ``norm``'s spread is
        float noise) gets a spread floor of 1e-3 of its mean, so a later jump is still measured
        in sensible units instead of in units of rounding error.
        """
        sample = np.asarray(sample, dtype=np.float32)
        if sample.ndim != 2 or len(sample) < 2:
            raise ValueError(f"the reference sample must be (n >= 2, d); got shape {sample.shape}")
        center = sample.mean(axis=0, dtype=np.float64) if centroid is None else np.asarray(centroid, np.float64)
        length = np.linalg.norm(center)
        if not length > 0:
            raise ValueError("the reference centroid is the zero vector; cosine to it is undefined")
        unit = center / length
        signals = record_signals(sample, unit)
        means = {name: float(values.mean()) for name, values in signals.items()}
        stds = {
            name: max(float(values.std(ddof=1)), 1e-3 * abs(means[name]), 1e-12)
            for name, values in signals.items()
        }
        return cls(centroid_unit=unit, means=means, stds=stds)
