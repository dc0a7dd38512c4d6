"""One probe cycle against one endpoint, and the conformance checks computed from it.

A cycle makes the requests of :class:`~monitor.serving.settings.CyclePlan`, in this order:

1. each canary text alone (its canary vector, ``serving:<id>``; the reference of the checks below);
2. all texts in one batch (``batch``: 1 - cos to the text alone);
3. the long neighbour then all texts, one batch (``neighbour``: padding to a long batch-mate);
4. one text (a different one each cycle) sent alone ``repeats`` more times (``repeat``: 1 - cos to its first answer);
5. the texts upper-cased, with doubled spaces, and (with a ``prefix``) without it, one batch each:
   canaries ``serving:<id>:upper``, ``:space``, ``:noprefix``.

The sensitivity checks (``case``, ``whitespace``, ``prefix``) compare 1 - cos(text, variant) now with
the same quantity between the two pins, so a model that is meant to be case-sensitive is not
flagged, and a server that starts lower-casing its input is. ``norm`` compares each canary's norm
with its pinned norm (a dropped normalisation leaves every cosine unchanged). ``collision`` counts
pairs of distinct texts (and of their upper-cased forms) whose vectors coincide.

A request that fails ends the cycle (the caller backs off); an unusable row is counted and skipped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from monitor.serving.backends import Backend
from monitor.serving.responses import ServingError
from monitor.serving.settings import CANARY_PREFIX, EndpointSettings, Tolerances

CHECKS = ("repeat", "batch", "neighbour", "case", "whitespace", "prefix", "norm", "drift", "collision")
JITTER = ("repeat", "batch", "neighbour")  # the server's own nondeterminism within a cycle
VARIANTS = {"upper": "case", "space": "whitespace", "noprefix": "prefix"}


def upper(text: str) -> str:
    return text.upper()


def doubled_spaces(text: str) -> str:
    return text.replace(" ", "  ") + " "


@dataclass
class CycleResult:
    """What one cycle saw. ``canaries``: canary id -> vector (as returned, float64); ``ready``:
    check or canary id -> the 1-based request after which it was known (the benchmark's detection
    latency); ``error``: the request failure that ended the cycle early, if any."""

    calls: int = 0
    latencies: list[float] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)
    canaries: dict[str, np.ndarray] = field(default_factory=dict)
    deviations: dict[str, float] = field(default_factory=dict)
    ready: dict[str, int] = field(default_factory=dict)
    invalid: Counter[str] = field(default_factory=Counter)
    collisions: int = 0
    error: ServingError | None = None


def cos_distance(a: np.ndarray, b: np.ndarray) -> float:
    """1 - cosine, in float64, of two non-zero vectors."""
    a = a / np.max(np.abs(a))
    b = b / np.max(np.abs(b))
    return float(1.0 - np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def run_cycle(
    backend: Backend, endpoint: EndpointSettings, texts: Mapping[str, str], neighbour: str, cycle: int,
    timeout: float, collision_tolerance: float = 1e-6, clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] = lambda: False,
) -> CycleResult:
    """One cycle (module docstring). Never raises for the endpoint's faults: see ``result.error``."""
    result = CycleResult()
    ids = list(texts)
    prefixed = {i: endpoint.prefix + texts[i] for i in ids}

    def call(batch: Sequence[str]) -> list[np.ndarray | None]:
        if stop():
            raise ServingError("timeout", "the cycle ran out of time")
        started = clock()
        try:
            rows, invalid = backend.embed(batch, timeout)
        finally:
            result.calls += 1
            result.latencies.append(clock() - started)
            result.call_times.append(clock())
        result.invalid.update(invalid)
        return rows

    alone: dict[str, np.ndarray] = {}
    try:
        for ident in ids:
            (row,) = call([prefixed[ident]])
            if row is not None:
                alone[ident] = row
                result.canaries[f"{CANARY_PREFIX}{ident}"] = row
                result.ready[f"{CANARY_PREFIX}{ident}"] = result.calls
        _against(result, "batch", alone, dict(zip(ids, call([prefixed[i] for i in ids]), strict=True)))
        neighboured = call([neighbour] + [prefixed[i] for i in ids])[1:]
        _against(result, "neighbour", alone, dict(zip(ids, neighboured, strict=True)))
        repeated = ids[cycle % len(ids)]
        again = {f"{repeated}#{n}": call([prefixed[repeated]])[0] for n in range(endpoint.repeats)}
        _against(result, "repeat", {k: alone[repeated] for k in again if repeated in alone}, again)
        variants = {"upper": [endpoint.prefix + upper(texts[i]) for i in ids],
                    "space": [endpoint.prefix + doubled_spaces(texts[i]) for i in ids]}
        if endpoint.prefix:
            variants["noprefix"] = [texts[i] for i in ids]
        for suffix, batch in variants.items():
            for ident, row in zip(ids, call(batch), strict=True):
                if row is not None:
                    result.canaries[f"{CANARY_PREFIX}{ident}:{suffix}"] = row
                    result.ready[f"{CANARY_PREFIX}{ident}:{suffix}"] = result.calls
    except ServingError as exc:
        result.error = exc
    uppers = {i: result.canaries.get(f"{CANARY_PREFIX}{i}:upper") for i in ids}
    result.collisions = (collisions(alone, collision_tolerance)
                         + collisions({i: v for i, v in uppers.items() if v is not None}, collision_tolerance))
    if result.error is None:
        result.ready["collision"] = result.calls
    return result


def _against(result: CycleResult, check: str, reference: Mapping[str, np.ndarray],
             rows: Mapping[str, np.ndarray | None]) -> None:
    """The largest 1 - cos between each usable row and the reference of the same key."""
    worst = [cos_distance(reference[key], row) for key, row in rows.items() if row is not None and key in reference]
    if worst:
        result.deviations[check] = max(worst)
        result.ready[check] = result.calls


def collisions(vectors: Mapping[str, np.ndarray], tolerance: float = 1e-6) -> int:
    """Pairs of distinct keys whose vectors are closer than ``tolerance`` in 1 - cos."""
    keys = sorted(vectors)
    return sum(1 for a in range(len(keys)) for b in range(a + 1, len(keys))
               if cos_distance(vectors[keys[a]], vectors[keys[b]]) < tolerance)


def pinned_checks(
    result: CycleResult, pins: Mapping[str, np.ndarray], norm_pins: Mapping[str, float], texts: Sequence[str],
) -> dict[str, float]:
    """The checks that compare with pins: ``case``, ``whitespace``, ``prefix`` (the change of
    1 - cos(text, variant) from the same quantity between the pins) and ``norm`` (relative)."""
    out: dict[str, float] = {}
    for suffix, check in VARIANTS.items():
        shifts = []
        for ident in texts:
            base, variant = f"{CANARY_PREFIX}{ident}", f"{CANARY_PREFIX}{ident}:{suffix}"
            if base in result.canaries and variant in result.canaries and base in pins and variant in pins:
                now = cos_distance(result.canaries[base], result.canaries[variant])
                shifts.append(abs(now - cos_distance(pins[base], pins[variant])))
        if shifts:
            out[check] = max(shifts)
    norms = [abs(float(np.linalg.norm(v)) - norm_pins[k]) / norm_pins[k]
             for k, v in result.canaries.items() if k in norm_pins]
    if norms:
        out["norm"] = max(norms)
    moved = [cos_distance(result.canaries[k], pins[k]) for k in (f"{CANARY_PREFIX}{i}" for i in texts)
             if k in result.canaries and k in pins]
    if moved and all(check in result.deviations for check in JITTER):
        out["drift"] = float(np.median(moved))
    return out


def tolerance(check: str, tolerances: Tolerances, deviations: Mapping[str, float]) -> float:
    """The tolerance ``check`` is held to this cycle (``drift``'s depends on the cycle's jitter)."""
    if check == "drift":
        jitter = max((deviations.get(c, 0.0) for c in JITTER), default=0.0)
        return max(tolerances.drift, tolerances.drift_jitter_ratio * jitter)
    return float(getattr(tolerances, check))


def violations(deviations: Mapping[str, float], collisions_seen: int, tolerances: Tolerances) -> list[str]:
    """The checks that fail: a statistic above its tolerance, or any collision."""
    failed = [check for check, value in deviations.items() if value > tolerance(check, tolerances, deviations)]
    if collisions_seen:
        failed.append("collision")
    return sorted(failed)
