"""Pinned canary vectors: what each canary id of each model looked like when it was pinned.

Stored as one JSON file in the state directory (``canary-pins.json``: model -> id -> unit vector
as floats; JSON's float repr round-trips float64 exactly), written crash-safely. Pins from the
settings' ``pins_file`` win over stored ones and are never overwritten by a first sighting.

A pin that is zero, NaN or infinite would disable its canary (its cosine is NaN, never below the
tolerance), so :meth:`PinStore.load` refuses a file holding one, a file that is not JSON, a model
whose pins differ in dimension, and a file over :data:`PINS_MAX_BYTES`: the daemon sets such a file
aside and the pins form again from the next arrivals (monitor/canary/component.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from monitor.canary.settings import pin_problem
from monitor.storage.durable_files import atomic_write, remove_stale_temporaries

PINS_FILE = "canary-pins.json"
PINS_MAX_BYTES = 64 * 2**20  # 1000 canaries of d = 1536 are about 30 MB of JSON
Pins = dict[str, dict[str, np.ndarray]]  # model -> id -> float64 unit vector


def unit(vector: np.ndarray) -> np.ndarray:
    """``vector`` scaled to norm 1 (scaled by its largest entry first, so huge entries cannot overflow)."""
    v = np.asarray(vector, dtype=np.float64)
    v = v / np.max(np.abs(v))
    return v / np.linalg.norm(v)


class PinStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / PINS_FILE

    def load(self) -> Pins:
        """The stored pins; ``ValueError`` saying why the file cannot be used (module docstring)."""
        try:
            if not self.path.exists():
                return {}
            size = self.path.stat().st_size
            if size > PINS_MAX_BYTES:
                raise ValueError(f"{size} bytes, over the limit of {PINS_MAX_BYTES}")
            raw = json.loads(self.path.read_bytes())
        except OSError as exc:
            raise ValueError(f"unreadable: {exc.strerror or exc}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(raw, dict) or not all(isinstance(ids, dict) for ids in raw.values()):
            raise ValueError("not a JSON object of model -> id -> vector")
        pins: Pins = {}
        for model, ids in raw.items():
            for ident, vector in ids.items():
                problem = pin_problem(vector)
                if problem is not None:
                    raise ValueError(f"{model}/{ident}: {problem}")
            if len({len(vector) for vector in ids.values()}) > 1:
                raise ValueError(f"the pins of model {model} differ in dimension")
            pins[str(model)] = {str(i): unit(np.asarray(v, dtype=np.float64)) for i, v in ids.items()}
        return pins

    def remove_stale_temporaries(self) -> None:
        """Remove what a killed write left (the daemon at start; never a reader beside a running daemon)."""
        remove_stale_temporaries(self.path.parent, PINS_FILE)

    def save(self, pins: Pins) -> None:
        payload = {model: {i: v.tolist() for i, v in sorted(ids.items())} for model, ids in sorted(pins.items())}
        data = json.dumps(payload).encode()
        atomic_write(self.path, lambda handle: handle.write(data))
