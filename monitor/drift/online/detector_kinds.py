"""The online detectors' vocabulary, without river or numpy: the signals they can watch, the detector
kinds (river's), the parameters each takes and our defaults.

Settings check detector parameters against these names when they load, so a typo fails at
start-up, and loading settings never imports river (it pulls in scikit-learn and scipy: seconds).
:func:`monitor.drift.online.detectors.build_detector` builds the detectors themselves, and river's
constructors check the values. ``tests/drift/test_detectors.py`` asserts that
:data:`DETECTOR_PARAMETERS` matches river's constructor signatures, so an upgrade that renames a
parameter is noticed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypeGuard

Signal = Literal["cosine", "norm"]
SIGNALS: tuple[Signal, ...] = ("cosine", "norm")  # computed in monitor.drift.online.signals

DetectorKind = Literal["adwin", "page_hinkley", "kswin"]

DETECTOR_PARAMETERS: dict[str, frozenset[str]] = {
    "adwin": frozenset({"delta", "clock", "max_buckets", "min_window_length", "grace_period"}),
    "page_hinkley": frozenset({"min_instances", "delta", "threshold", "alpha", "mode"}),
    "kswin": frozenset({"alpha", "window_size", "stat_size", "seed", "window"}),
}

# Parameters for unit-variance inputs (standardised mini-batch means), chosen so that none of them
# raised a false alarm in 10⁶ null updates (10⁵ for KSWIN) — about 20 minutes at 50k records/s and
# aggregate=64 — while still catching a 1-sd shift of the mini-batch mean within ~50-70 updates;
# see docs/drift.md. Page-Hinkley runs without fading (alpha=1): river's default fading factor
# turns its cumulative sum into an AR(1) whose own noise (sd ~ 70 at 0.9999) crosses any
# reasonable threshold, 58 false alarms per 10⁶ updates in our measurement.
DEFAULT_DETECTOR_PARAMS: dict[str, dict[str, Any]] = {
    "adwin": {"delta": 1e-4},
    "page_hinkley": {"min_instances": 30, "delta": 0.5, "threshold": 25.0, "alpha": 1.0},
    "kswin": {"alpha": 1e-6, "window_size": 300, "stat_size": 60, "seed": 0},
}
# KSWIN runs a scipy KS test per update (~0.3 ms); it is opt-in.
DEFAULT_DETECTORS: tuple[DetectorKind, ...] = ("adwin", "page_hinkley")


def is_detector_kind(name: str) -> TypeGuard[DetectorKind]:
    """Whether ``name`` is a detector kind we build (for names read from a stored state)."""
    return name in DETECTOR_PARAMETERS


def check_detector_params(kind: str, params: Mapping[str, Any]) -> None:
    """ValueError naming the valid choices when ``kind`` is unknown or a parameter name is not its own.

    >>> check_detector_params("adwin", {"threshold": 3})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: adwin does not take ['threshold']; its parameters are ['clock', 'delta', ...]
    """
    if kind not in DETECTOR_PARAMETERS:
        raise ValueError(f"unknown detector {kind!r}; choose from {sorted(DETECTOR_PARAMETERS)}")
    allowed = DETECTOR_PARAMETERS[kind]
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"{kind} does not take {sorted(unknown)}; its parameters are {sorted(allowed)}")
    for name, value in params.items():  # river checks ranges, but takes delta=inf or threshold=nan
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{kind}.{name} must be a finite number, not {value}")


def check_detectors(detectors: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    """:func:`check_detector_params` for every (kind, parameters) of a settings' ``detectors``; returns them."""
    for kind, params in detectors.items():
        check_detector_params(kind, params)
    return detectors
