"""Pinned canary vectors: what each canary id of each model looked like when it was pinned.

Stored as one JSON file in the state directory (``canary-pins.json``: model -> id -> unit vector
as floats; JSON's float repr round-trips float64 exactly), written crash-safely. Pins from the
settings' ``pins_file`` win over stored ones and are never overwritten by a first sighting.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from monitor.files import atomic_write

PINS_FILE = "canary-pins.json"
Pins = dict[str, dict[str, np.ndarray]]  # model -> id -> float64 unit vector


def unit(vector: np.ndarray) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    return v / np.linalg.norm(v)


class PinStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / PINS_FILE

    def load(self) -> Pins:
        """The stored pins; an unreadable file is reported and treated as empty (pins re-form)."""
        if not self.path.exists():
            return {}
        try:
            raw = json.loads(self.path.read_text())
            return {
                str(model): {str(i): unit(np.asarray(v, dtype=np.float64)) for i, v in ids.items()}
                for model, ids in raw.items()
            }
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ValueError(f"canary pins {self.path} are unreadable: {exc}") from None

    def save(self, pins: Pins) -> None:
        payload = {model: {i: v.tolist() for i, v in sorted(ids.items())} for model, ids in sorted(pins.items())}
        data = json.dumps(payload).encode()
        atomic_write(self.path, lambda handle: handle.write(data))
