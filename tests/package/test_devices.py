"""The one device rule (monitor/devices.py): where heavy work runs, and when torch may be imported."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from monitor import devices
from tests.support.imports import loaded_after


@pytest.fixture(autouse=True)
def fresh_answers() -> Iterator[None]:
    """The answers are cached per process; every test starts (and leaves) without them."""
    devices.use_cuda.cache_clear()
    devices.torch_sees_cuda.cache_clear()
    yield
    devices.use_cuda.cache_clear()
    devices.torch_sees_cuda.cache_clear()


def machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, driver: bool, cuda: bool | None) -> list[int]:
    """Pretend the NVIDIA driver is (not) loaded and torch does (not) see a device; ``cuda=None``:
    asking torch fails the test. Returns the list the torch checks are counted in."""
    driver_file = tmp_path / "nvidia-version"
    if driver:
        driver_file.write_text("NVRM version: fake\n")
    monkeypatch.setattr(devices, "_NVIDIA_DRIVER", driver_file)
    asked: list[int] = []

    def torch_sees_cuda() -> bool:
        asked.append(1)
        assert cuda is not None, "torch was asked"
        return cuda

    monkeypatch.setattr(devices, "torch_sees_cuda", torch_sees_cuda)
    return asked


@pytest.mark.parametrize("driver", [False, True])
def test_cpu_never_asks_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, driver: bool) -> None:
    machine(monkeypatch, tmp_path, driver=driver, cuda=None)
    assert devices.use_cuda("cpu") is False
    assert devices.use_cuda(None) is False
    assert devices.device_type("cpu") == "cpu"


def test_auto_without_a_driver_is_the_cpu_without_asking_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    machine(monkeypatch, tmp_path, driver=False, cuda=None)
    assert devices.use_cuda("auto") is False
    assert devices.device_type("auto") == "cpu"


@pytest.mark.parametrize("cuda", [True, False])
def test_auto_with_a_driver_asks_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cuda: bool,
                                       caplog: pytest.LogCaptureFixture) -> None:
    asked = machine(monkeypatch, tmp_path, driver=True, cuda=cuda)
    with caplog.at_level(logging.WARNING, logger="monitor.devices"):
        assert devices.use_cuda("auto") is cuda
    assert devices.device_type("auto") == ("cuda" if cuda else "cpu")
    assert asked == [1]  # once: the answer is cached
    assert caplog.text == ""  # auto falling back to the CPU is the normal case, not a warning


def test_cuda_asks_torch_even_without_the_driver_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    machine(monkeypatch, tmp_path, driver=False, cuda=True)
    assert devices.use_cuda("cuda") is True
    assert devices.device_type("cuda") == "cuda"


def test_cuda_without_a_device_falls_back_to_the_cpu_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    machine(monkeypatch, tmp_path, driver=True, cuda=False)
    with caplog.at_level(logging.WARNING, logger="monitor.devices"):
        assert devices.use_cuda("cuda") is False
        assert devices.use_cuda("cuda") is False
    assert [r.getMessage() for r in caplog.records] == [
        "device 'cuda' was asked for but no CUDA device is present; using the CPU"
    ]


def test_an_unknown_device_fails_early() -> None:
    with pytest.raises(ValueError, match="device must be one of"):
        devices.use_cuda("tpu")


def test_torch_sees_cuda_is_torchs_own_answer() -> None:
    import torch

    assert devices.torch_sees_cuda() is torch.cuda.is_available()


def test_resolving_cpu_and_driverless_auto_imports_no_torch(tmp_path: Path) -> None:
    """In a fresh interpreter: the rule itself imports nothing heavy on a machine without a GPU."""
    assert loaded_after(f"""
        from monitor import devices
        devices._NVIDIA_DRIVER = devices.Path({str(tmp_path / "none")!r})
        assert [devices.device_type(d) for d in ("cpu", None, "auto")] == ["cpu", "cpu", "cpu"]
    """, ("torch", "numpy")) == []


def test_every_device_setting_goes_through_the_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The window statistics, MMD and k-NN all ask devices.use_cuda (no copies of the rule)."""
    import numpy as np

    from monitor.config import load_settings
    from monitor.drift.twosample.mmd import mmd_test
    from monitor.retrieval.probes.knn import exact_topk
    from monitor.state.registry import StateRegistry

    machine(monkeypatch, tmp_path, driver=False, cuda=None)
    settings = load_settings(overrides={"source": "synthetic", "state_dir": str(tmp_path / "state")})
    assert StateRegistry(settings)._device is None
    rows = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
    assert mmd_test(rows[:10], rows[10:], permutations=10, device="auto").extra["device"] == "cpu"
    assert exact_topk(rows, rows, 2, device="auto").indices.shape == (20, 2)

    devices.use_cuda.cache_clear()
    asked = machine(monkeypatch, tmp_path, driver=True, cuda=True)
    assert StateRegistry(settings)._device == "cuda"
    assert asked == [1]
