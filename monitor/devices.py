"""Where heavy linear algebra runs: a CUDA device when one is asked for and present, else the CPU.

The one rule every ``device`` setting goes through (daemon, drift, probes):

* ``cpu`` (and None): the CPU, in numpy. torch is never imported.
* ``auto`` (the default): CUDA when an NVIDIA driver is loaded (``/proc/driver/nvidia/version``
  exists), torch is installed and ``torch.cuda.is_available()``. The driver is looked for
  *before* torch is imported, so on a machine without a GPU ``auto`` costs one ``stat`` and the
  daemon never loads torch (≈ 180 MB resident, a second of start-up).
* ``cuda``: the same, except that torch is asked even without the driver file (the user asked
  for a GPU; some platforms expose CUDA without it). Without a device it falls back to the CPU
  with one warning.

torch is an extra (``embedding-monitor[gpu]``): without it ``auto`` is the CPU, and a ``cuda``
setting stops the daemon at start-up (monitor/extras.py).

Only the CUDA implementations (``drift/twosample/mmd_torch.py``, ``retrieval/probes/knn_torch.py``, the
device paths of ``state/stats.py`` and ``quality/intrinsic.py``) import torch, and only after
:func:`use_cuda` said yes. The answer is computed once per setting value.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from monitor.extras import install_hint, installed

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def nvidia_driver_loaded() -> bool:
    """The kernel has an NVIDIA driver loaded (a file check: no torch)."""
    return _NVIDIA_DRIVER.exists()


@functools.lru_cache(maxsize=1)
def torch_sees_cuda() -> bool:
    """torch is installed and sees a CUDA device (imports torch; checked once). Without torch (the
    default install) the answer is no, quietly: a driver alone is no reason to stop the daemon."""
    if not installed("torch"):
        logger.info("torch is not installed: the CPU runs everything (%s for CUDA)", install_hint("gpu"))
        return False
    import torch

    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=8)
def use_cuda(device: str | None) -> bool:
    """Whether work configured with ``device`` runs on CUDA (module docstring). ValueError for an
    unknown device."""
    if device is None or device == "cpu":
        return False
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "auto" and not nvidia_driver_loaded():
        return False
    if torch_sees_cuda():
        return True
    if device == "cuda":
        logger.warning("device 'cuda' was asked for but no CUDA device is present; using the CPU")
    return False


def device_type(device: str | None) -> Literal["cuda", "cpu"]:
    """``"cuda"`` or ``"cpu"``: where work configured with ``device`` runs (torch-free)."""
    return "cuda" if use_cuda(device) else "cpu"


def torch_device(device: str | None) -> torch.device:
    """The torch device for ``device`` (imports torch: for the CUDA implementations)."""
    import torch

    return torch.device(device_type(device))
