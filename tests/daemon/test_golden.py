"""The same input gives the same exported numbers: a refactor must not move any of them.

An intended change of a value rewrites the fixture (``python -m tests.support.golden --write``)
in the same commit, which says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import golden

ROOT = Path(__file__).resolve().parents[2]


def test_every_exported_value_matches_the_golden_fixture() -> None:
    expected = json.loads(golden.FIXTURE.read_text())
    diff = list(golden.differences(expected, golden.current()))
    assert not diff, "\n".join(diff[:40])


def test_the_comparison_notices_a_changed_missing_or_new_series() -> None:
    expected = {"a{}": 1.0, "b{}": 2.0}
    assert list(golden.differences(expected, {"a{}": 1.0, "b{}": 2.0 + 1e-12})) == []
    found = list(golden.differences(expected, {"a{}": 1.1, "c{}": 3.0}))
    assert found == ["missing: b{} (was 2.0)", "new: c{} = 3.0", "changed: a{}: 1.0 -> 1.1"]


def _kernels_this_cpu_runs() -> list[str]:
    """OpenBLAS kernels whose instructions this CPU has (a kernel above it would crash)."""
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    kernels = ["Prescott"]  # SSE3: every x86-64
    if "avx" in flags:
        kernels.append("Sandybridge")
    if {"avx2", "fma"} <= flags:
        kernels += ["Haswell", "Zen"]
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        kernels.append("SkylakeX")
    return kernels


def _numpy_levels() -> list[str]:
    """``NPY_DISABLE_CPU_FEATURES`` values: everything on, then each dispatch level above baseline off."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__  # type: ignore[attr-defined]

    present = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
    return [""] + [" ".join(present[i:]) for i in range(len(present) - 1, -1, -1)][:2]


@pytest.mark.slow
def test_the_golden_values_hold_under_every_blas_kernel_simd_level_and_thread_count() -> None:
    """The fixture must not be a fact about one CPU: the comparison holds under each OpenBLAS kernel
    this CPU runs, with numpy's SIMD dispatch cut back level by level, at 1 and 2 threads.

    (A contributor's AVX2 machine failed the comparison on a rank tie broken by the last bit; see
    :mod:`tests.support.golden` for the tolerance and :func:`monitor.drift.twosample.heldout.merge_rounding_ties`.)
    """
    kernels, levels = _kernels_this_cpu_runs(), _numpy_levels()
    runs = [(kernel, "", "2") for kernel in kernels] + [(kernels[-1], level, threads)
                                                        for level in levels[1:] for threads in ("1", "2")]
    failures = []
    for kernel, level, threads in runs:
        env = {**os.environ, "OPENBLAS_CORETYPE": kernel, "NPY_DISABLE_CPU_FEATURES": level,
               "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-m", "tests.support.golden"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            failures.append(f"{kernel} / numpy without [{level}] / {threads} threads:\n"
                            f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    assert len(runs) >= 3
    assert not failures, "\n\n".join(failures)
