"""Collection rules for the whole repository (tests/conftest.py holds the fixtures).

``--doctest-modules`` imports every module of ``monitor`` to look for examples. A module that imports
torch at its top and holds no example is left out of that search: torch's import costs each pytest
worker about 3 s of CPU, and the module's tests import it themselves when they need it.
"""

from __future__ import annotations

import re
from pathlib import Path

_TORCH_AT_TOP = re.compile(r"^(import torch|from torch[ .])", re.MULTILINE)
_PACKAGE = Path(__file__).resolve().parent / "monitor"


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.resolve().is_relative_to(_PACKAGE):
        return None
    try:
        source = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    if _TORCH_AT_TOP.search(source) and ">>>" not in source:
        return True
    return None
