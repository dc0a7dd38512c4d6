"""Checkpointing the online detectors without pickle.

Daemon checkpoints are JSON plus numpy arrays and never unpickle (monitor/storage/checkpoint_format.py: a hostile
file may fail to load but cannot run code). river's detectors are Python objects (since river 0.26
ADWIN's window is a Rust object that serialises itself to bytes), so :func:`encode_monitor` walks
an :class:`OnlineDriftMonitor` into plain values and :func:`decode_monitor` rebuilds it,
instantiating only the few classes listed here, with constructor parameters from the settings. A
state from another river version (bytes the Rust side cannot read, an unknown attribute type)
fails to decode with ``ValueError`` and the caller starts the detectors afresh.

Examples
--------
>>> import numpy as np
>>> from monitor.drift.online.detectors import OnlineDriftMonitor
>>> from monitor.drift.online.signals import SignalBaseline
>>> rng = np.random.default_rng(0)
>>> reference = rng.normal(1.0, 0.3, size=(500, 8)).astype(np.float32)
>>> monitor = OnlineDriftMonitor(SignalBaseline.from_reference(reference), aggregate=8)
>>> _ = monitor.update(rng.normal(1.0, 0.3, size=(1000, 8)).astype(np.float32), now=1.0)
>>> twin = decode_monitor(encode_monitor(monitor))
>>> drifted = rng.normal(0.7, 0.3, size=(4000, 8)).astype(np.float32)
>>> monitor.update(drifted, now=2.0) == twin.update(drifted, now=2.0)
True
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np
from river import stats as river_stats
from river._river_rust.drift import AdaptiveWindowing

from monitor.drift.online.detector_kinds import DetectorKind, is_detector_kind
from monitor.drift.online.detectors import ChangePoint, DetectorStatus, OnlineDriftMonitor, build_detector
from monitor.drift.online.signals import SignalBaseline

_VERSION = 1
# Rust classes inside river's detectors: their own byte serialisation (bincode), no pickle.
_RUST = {"AdaptiveWindowing": AdaptiveWindowing}
# Plain Python classes inside them, rebuilt from their attribute dicts.
_PLAIN = {"Mean": river_stats.Mean}
# Attributes the detector's constructor derives (a bound method): never stored.
_DERIVED = {"_test_drift"}


def _enc(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return {"ndarray": value.copy()}  # river mutates its arrays in place
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"tuple": [_enc(v) for v in value]}
    if isinstance(value, list):
        return {"list": [_enc(v) for v in value]}
    if isinstance(value, deque):
        return {"deque": [_enc(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, dict):
        return {"dict": [[_enc(k), _enc(v)] for k, v in value.items()]}
    if type(value) is random.Random:
        return {"random": _enc(value.getstate())}
    name = type(value).__name__
    if name in _RUST and type(value) is _RUST[name]:
        return {"rust": name, "state": np.frombuffer(value.__getstate__(), dtype=np.uint8).copy()}
    if name in _PLAIN and type(value) is _PLAIN[name]:
        return {"object": name, "attrs": _enc(dict(vars(value)))}
    raise TypeError(f"cannot encode a {type(value).__module__}.{name} in a detector state")


def _dec(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if not isinstance(value, dict) or len(value) == 0:
        raise ValueError(f"unexpected value in a detector state: {type(value).__name__}")
    if "ndarray" in value:
        return np.array(value["ndarray"], copy=True)
    if "tuple" in value:
        return tuple(_dec(v) for v in value["tuple"])
    if "list" in value:
        return [_dec(v) for v in value["list"]]
    if "deque" in value:
        maxlen = value.get("maxlen")
        return deque((_dec(v) for v in value["deque"]), maxlen=None if maxlen is None else int(maxlen))
    if "dict" in value:
        return {_dec(k): _dec(v) for k, v in value["dict"]}
    if "random" in value:
        rng = random.Random()  # noqa: S311 - restores a river detector's own sampler, nothing secret
        rng.setstate(_dec(value["random"]))
        return rng
    if "rust" in value:
        rust_type = _RUST[str(value["rust"])]
        obj = rust_type.__new__(rust_type)
        try:
            obj.__setstate__(np.asarray(value["state"], dtype=np.uint8).tobytes())
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - pyo3 panics are BaseExceptions; a foreign layout
            raise ValueError(f"cannot restore {value['rust']}: {exc}") from None
        return obj
    if "object" in value:
        plain_type = _PLAIN[str(value["object"])]
        plain = plain_type.__new__(plain_type)
        plain.__dict__.update(_dec(value["attrs"]))
        return plain
    raise ValueError(f"unexpected keys in a detector state: {sorted(value)}")


def encode_detector(detector: Any) -> dict[str, Any]:
    """A river detector's attributes as plain values (see the module docstring)."""
    return {name: _enc(v) for name, v in vars(detector).items() if name not in _DERIVED}


def decode_detector(kind: str, params: dict[str, Any], state: dict[str, Any]) -> Any:
    """A fresh ``kind`` detector built from ``params``, then given the stored attributes."""
    detector = build_detector(kind, params)
    expected = set(vars(detector)) - _DERIVED
    if set(state) != expected:
        raise ValueError(f"{kind} state has attributes {sorted(state)}, this river version {sorted(expected)}")
    for name, value in state.items():
        setattr(detector, name, _dec(value))
    return detector


def encode_monitor(monitor: OnlineDriftMonitor) -> dict[str, Any]:
    """Everything an :class:`OnlineDriftMonitor` needs to resume exactly, as checkpointable values."""
    state = monitor.__getstate__()
    baseline: SignalBaseline = state["baseline"]
    return {
        "version": _VERSION,
        "baseline": {
            "centroid_unit": np.asarray(baseline.centroid_unit),
            "means": dict(baseline.means),
            "stds": dict(baseline.stds),
        },
        "signals": list(monitor.signals),
        "aggregate": monitor.aggregate,
        "history": state["recent_changes"].maxlen,
        "detector_params": {kind: dict(p) for kind, p in monitor.detector_params.items()},
        "detectors": [[s, k, encode_detector(d)] for (s, k), d in state["_detectors"].items()],
        "status": [
            [s, k, st.changes, st.last_record_index, st.last_timestamp] for (s, k), st in state["_status"].items()
        ],
        "pending": np.asarray(state["_pending"], dtype=np.float64),
        "records_seen": int(state["_records_seen"]),
        "recent": [[c.signal, c.detector, c.record_index, c.timestamp] for c in state["recent_changes"]],
    }


def decode_monitor(state: dict[str, Any]) -> OnlineDriftMonitor:
    """Rebuild what :func:`encode_monitor` wrote; ``ValueError`` when it does not fit."""
    if state.get("version") != _VERSION:
        raise ValueError(f"unsupported online detector state version {state.get('version')!r}")
    b = state["baseline"]
    baseline = SignalBaseline(
        centroid_unit=np.asarray(b["centroid_unit"], dtype=np.float64),
        means={str(k): float(v) for k, v in dict(b["means"]).items()},
        stds={str(k): float(v) for k, v in dict(b["stds"]).items()},
    )
    params: dict[DetectorKind, dict[str, Any]] = {}
    for key, value in dict(state["detector_params"]).items():
        kind = str(key)
        if not is_detector_kind(kind):
            raise ValueError(f"unknown detector {kind!r} in an online detector state")
        params[kind] = dict(value)
    monitor = OnlineDriftMonitor(
        baseline, params, signals=[str(s) for s in state["signals"]], aggregate=int(state["aggregate"]),
        history=int(state["history"]) if state.get("history") is not None else 100,
    )
    inner = monitor.__getstate__()
    detectors = {}
    for signal, stored_kind, det_state in state["detectors"]:
        kind = str(stored_kind)
        key = (str(signal), kind)
        if key not in inner["_detectors"] or not is_detector_kind(kind):
            raise ValueError(f"detector {key} is not configured")
        detectors[key] = decode_detector(kind, params[kind], dict(det_state))
    if set(detectors) != set(inner["_detectors"]):
        raise ValueError("the stored detectors differ from the configured ones")
    pending = np.asarray(state["pending"], dtype=np.float64).reshape(len(monitor.signals), -1)
    inner.update(
        _detectors=detectors,
        _status={
            (str(s), str(k)): DetectorStatus(int(n), None if i is None else int(i), None if t is None else float(t))
            for s, k, n, i, t in state["status"]
        },
        _pending=pending,
        _records_seen=int(state["records_seen"]),
    )
    recent = inner["recent_changes"]
    recent.clear()
    recent.extend(ChangePoint(str(s), str(k), int(i), float(t)) for s, k, i, t in state["recent"])
    monitor.__setstate__(inner)
    return monitor


__all__ = ["decode_detector", "decode_monitor", "encode_detector", "encode_monitor"]
