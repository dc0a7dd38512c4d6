"""Where heavy linear algebra runs: a CUDA device when one is asked for and present, else the CPU.

``auto`` (the default) uses CUDA only when an NVIDIA driver is loaded and torch sees a device;
the check looks for the driver before it imports torch, so a CPU-only machine never pays for
importing torch just to learn it has no GPU. ``cuda`` without a device falls back to the CPU
with one warning.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")
_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


@functools.lru_cache(maxsize=1)
def cuda_present() -> bool:
    """An NVIDIA driver is loaded, torch is installed and sees a CUDA device (checked once)."""
    if not _NVIDIA_DRIVER.exists() or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@functools.lru_cache(maxsize=8)
def use_cuda(device: str | None) -> bool:
    """Whether work configured with ``device`` runs on CUDA. Raises ValueError for an unknown device."""
    if device is None or device == "cpu":
        return False
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if cuda_present():
        return True
    if device == "cuda":
        logger.warning("device 'cuda' was asked for but no CUDA device is present; using the CPU")
    return False


def torch_device(device: str | None) -> torch.device:
    """The torch device for ``device`` (imports torch)."""
    import torch

    return torch.device("cuda" if use_cuda(device) else "cpu")
