"""Every exported number on one fixed input: the daemon's behaviour, pinned.

A deterministic scenario (injected clock, seeded vectors, JSON and binary embeddings, malformed
messages, interactions, a golden set, a drift reference and a shifted window) is fed through the
real daemon, every scheduled job runs once, and ``/metrics`` is rendered. Values that measure
time (timestamps, durations, ages) or the process (``process_*``, ``python_*``) are dropped; the
rest must not change unless a change means to change them.

``python -m tests.support.golden --write`` rewrites ``tests/fixtures/golden-metrics.json`` after
an intended change (say why in the commit); ``tests/daemon/test_golden.py`` compares against it.

Tolerance: values are compared at ``rtol`` 1e-6 (``atol`` 1e-9 near zero). Every value is a
deterministic function of the input, but not of the bits: BLAS kernels (``OPENBLAS_CORETYPE``),
numpy's SIMD paths and thread counts change summation order and FMA use, which moves float32
sums by about 1e-7 relative and float64 ones by far less. Nothing in the scenario amplifies that
past 1e-6: rank statistics merge scores equal up to rounding into ties
(:func:`monitor.drift.twosample.heldout.merge_rounding_ties`), the one place where last-bit noise used to
flip a result. ``tests/daemon/test_golden.py`` runs the comparison under every OpenBLAS kernel,
numpy SIMD level and thread count this CPU can run. ``--write`` keeps a stored value that the new
one matches within the tolerance, so a rewrite's diff shows only what really changed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.support.drift import BASE_DRIFT

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "golden-metrics.json"
START = 1_000_000.0
# Names (or name fragments) whose values depend on wall time or the machine, not on the input.
_VOLATILE = ("timestamp", "duration", "_age_seconds", "_created", "process_", "python_", "build_info",
             "checkpoint_size_bytes", "backpressure_seconds")


class Clock:
    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def scenario(tmp: Path) -> tuple[dict[str, Any], list[list[Any]]]:
    """The settings overrides and the polls (lists of source messages) of the fixed scenario."""
    from monitor.decoding.records import SourcePosition
    from monitor.sources.base import SourceMessage

    rng = np.random.default_rng(20261122)
    d_alpha, d_beta = 24, 12
    catalog = _unit(rng.standard_normal((300, d_beta)) + 0.3)
    rotation, _ = np.linalg.qr(rng.standard_normal((d_beta, d_beta)))
    gamma_catalog = _unit(catalog @ rotation + 0.05 * rng.standard_normal(catalog.shape))
    golden = tmp / "golden.jsonl"
    with golden.open("w") as out:
        for q in range(12):
            vector = catalog[q * 7] + 0.1 * rng.standard_normal(d_beta)
            qrels = {f"doc-{q * 7}": 3, f"doc-{q * 7 + 1}": 1}
            out.write(json.dumps({"query_id": f"g{q}", "vector": vector.tolist(), "qrels": qrels,
                                  "slice": "head" if q % 2 else "tail"}) + "\n")
    overrides: dict[str, Any] = {
        "source": "kafka",
        "checkpoint": {"enabled": True},
        "http": {"host": "127.0.0.1", "port": 0},
        "state_dir": str(tmp / "state"),
        "window": {"seconds": 300, "subwindows": 6, "reservoir_size": 400},
        "drift": {**BASE_DRIFT, "interval_seconds": 60.0},
        "canaries": {"ids": {"beta": ["doc-0", "doc-1"]}},
        "probes": {
            "statistics": {"resamples": 100},
            "golden": [{"name": "gold", "file": str(golden), "model": "beta", "k": [5, 10],
                        "retriever": {"kind": "knn", "stream": "catalog"}}],
            "ann_recall": [{"name": "ann", "model": "beta", "stream": "catalog", "k": [10]}],
            "clicks": [{"name": "clicks", "k": [5, 10], "catalog_stream": "catalog"}],
            "agreement": [{"name": "agree", "reference": {"model": "beta", "stream": "catalog"},
                           "candidate": {"model": "gamma", "stream": "catalog"}, "queries": 50, "pairs": 500}],
        },
    }
    polls: list[list[Any]] = []
    offsets = {"embeddings": 0, "interactions": 0}

    def message(value: bytes, headers: tuple[tuple[str, bytes], ...] = (), kind: str = "embeddings") -> Any:
        topic = "embeddings" if kind == "embeddings" else "interactions"
        offsets[kind] += 1
        return SourceMessage(value, headers, kind, SourcePosition(topic, 0, offsets[kind] - 1))  # type: ignore[arg-type]

    def binary(rows: np.ndarray, stream: str = "documents") -> Any:
        headers = (("model", b"alpha"), ("dim", str(rows.shape[1]).encode()), ("stream", stream.encode()))
        return message(rows.astype("<f4").tobytes(), headers)

    def event(model: str, ident: str, vector: np.ndarray, **extra: Any) -> Any:
        return message(orjson.dumps({"id": ident, "model": model, "vector": vector.tolist(), **extra}))

    # alpha: a healthy reference (its first 300 records), long before a shifted window.
    base = rng.standard_normal((600, d_alpha))
    base[:, :3] *= 4.0
    for chunk in np.array_split(base[:300], 6):
        polls.append([binary(chunk)])
    polls.append([])  # a gap: the reference leaves the window
    shifted = base[300:] + 1.5 * np.eye(d_alpha)[0]
    for chunk in np.array_split(shifted, 6):
        polls.append([binary(chunk)])
    # Catalogs with ids (two models, the same documents): k-NN, ANN recall, clicks, agreement.
    for start in range(0, 300, 100):
        polls.append([event("beta", f"doc-{i}", catalog[i], stream="catalog") for i in range(start, start + 100)]
                     + [event("gamma", f"doc-{i}", gamma_catalog[i], stream="catalog")
                        for i in range(start, start + 100)])
    # Queries with positive pairs and slices (alignment, uniformity) plus malformed input.
    queries = _unit(rng.standard_normal((80, d_beta)))
    polls.append([event("beta", f"q-{i}", queries[i], stream="queries", pair_id=f"p{i // 2}",
                        slice="head" if i % 3 else "tail") for i in range(80)])
    polls.append([
        message(b"{not json"),
        message(orjson.dumps([1, 2])),
        message(orjson.dumps({"id": "x", "model": "beta"})),
        message(orjson.dumps({"id": "x", "model": "beta", "vector": [0.0] * d_beta})),
        message(orjson.dumps({"id": "x", "model": "beta", "vector": [1.0, 2.0]})),
        message(orjson.dumps({"id": "x", "model": "bad label!", "vector": [1.0]})),
        message(b"\x00\x00\x80\x7f" * d_alpha, (("model", b"alpha"), ("dim", str(d_alpha).encode()))),
        message(b"\x00" * 7, (("model", b"alpha"), ("dim", b"nope"))),
    ])
    # Interactions: served top-10 with a known share of ANN misses, position-biased clicks.
    sims = catalog @ catalog.T
    events = []
    for q in range(60):
        query = catalog[q] + 0.05 * rng.standard_normal(d_beta)
        order = np.argsort(-(catalog @ query), kind="stable")[:10].tolist()
        if q % 4 == 0:
            order[-1] = int(np.argmin(sims[q]))
        results = [f"doc-{i}" for i in order]
        clicks = [results[int(rng.integers(0, 3))]] if q % 5 else []
        events.append(message(orjson.dumps({
            "query_id": f"iq-{q}", "model": "beta", "query_vector": query.tolist(), "results": results,
            "clicks": clicks, "slice": "head" if q % 2 else "tail"}), kind="interactions"))
    events.append(message(b"[]", kind="interactions"))
    polls.append(events)
    # Canaries re-sent: doc-0 unchanged, doc-1 from a changed model (a mismatch).
    polls.append([event("beta", "doc-0", catalog[0], stream="canaries"),
                  event("beta", "doc-1", gamma_catalog[1], stream="canaries")])
    return overrides, polls


def run_scenario(tmp: Path) -> str:
    """Feed the scenario through a real daemon, run every job once, return the /metrics text."""
    from prometheus_client import generate_latest

    from monitor.config import load_settings
    from monitor.daemon.service import Monitor
    from monitor.sources.base import Source
    from tests.support import daemons

    class _Idle(Source):
        name = "kafka"

        def poll(self, timeout: float) -> list[Any]:
            return []

    overrides, polls = scenario(tmp)
    clock = Clock()
    with daemons.stopped_after(Monitor(load_settings(overrides=overrides), source=_Idle(), clock=clock)) as monitor:
        for poll in polls:
            clock.now += 10.0 if poll else 400.0
            if poll:
                monitor.pipeline.apply_messages(poll)
        clock.now += 30.0
        monitor.refresh()
        for component in monitor.components:
            for job in component.jobs():
                job.func()
        monitor.refresh()
        return generate_latest(monitor.metrics_registry).decode()


def stable_values(text: str) -> dict[str, float | str]:
    """``name{labels}`` -> value for every sample that does not measure time or the process."""
    out: dict[str, float | str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if any(part in sample.name for part in _VOLATILE):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            value = float(sample.value)
            out[f"{sample.name}{{{labels}}}"] = "NaN" if math.isnan(value) else value
    return dict(sorted(out.items()))


@functools.lru_cache(maxsize=1)
def exposition() -> str:
    """The /metrics text of the scenario (run once per process)."""
    with tempfile.TemporaryDirectory(prefix="embmon-golden-") as tmp:
        return run_scenario(Path(tmp))


def current() -> dict[str, float | str]:
    return stable_values(exposition())


RTOL, ATOL = 1e-6, 1e-9


def same_value(a: float | str, b: float | str, rtol: float = RTOL, atol: float = ATOL) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return abs(a - b) <= atol + rtol * abs(a)


def differences(expected: dict[str, Any], actual: dict[str, Any], rtol: float = RTOL,
                atol: float = ATOL) -> Iterator[str]:
    """Human-readable differences: missing, extra and changed series."""
    for key in sorted(expected.keys() - actual.keys()):
        yield f"missing: {key} (was {expected[key]})"
    for key in sorted(actual.keys() - expected.keys()):
        yield f"new: {key} = {actual[key]}"
    for key in sorted(expected.keys() & actual.keys()):
        a, b = expected[key], actual[key]
        if not same_value(a, b, rtol, atol):
            yield f"changed: {key}: {a!r} -> {b!r}" if not isinstance(a, str) else f"changed: {key}: {a} -> {b}"


def kept_within_tolerance(stored: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values``, except where the stored value already matches: rounding noise is not a change."""
    return {key: stored[key] if key in stored and same_value(stored[key], value) else value
            for key, value in values.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {FIXTURE.name} from this code")
    parser.add_argument("--against", type=Path, default=FIXTURE, help="compare with this file")
    args = parser.parse_args(argv)
    values = current()
    if args.write:
        if FIXTURE.exists():
            values = kept_within_tolerance(json.loads(FIXTURE.read_text()), values)
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(values, indent=1) + "\n")
        print(f"wrote {len(values)} series to {FIXTURE}")
        return 0
    diff = list(differences(json.loads(args.against.read_text()), values))
    print("\n".join(diff) or f"identical: {len(values)} series")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
