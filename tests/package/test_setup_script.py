"""scripts/setup, the install step the README's test command runs first: it must say what is missing
before pip does. A pip that runs out of disk half-way prints only `OSError: [Errno 28]`."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setup(tmp_path: Path, profile: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup"), profile],
        cwd=ROOT,
        env={**os.environ, "EMBMON_VENV": str(tmp_path / "venv"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_disk_too_full_for_the_venvs_stops_before_anything_is_installed(tmp_path: Path) -> None:
    done = _setup(tmp_path, "test", EMBMON_SETUP_MIN_FREE_GB="1000000")

    assert done.returncode == 1
    assert "not enough free disk for the test profile's virtual environments" in done.stderr
    assert "MiB free on" in done.stderr and "1000000 GiB needed" in done.stderr
    assert not (tmp_path / "venv").exists()  # nothing half-made


def test_the_check_can_be_turned_off_and_the_profile_is_still_checked(tmp_path: Path) -> None:
    done = _setup(tmp_path, "no-such-profile", EMBMON_SETUP_MIN_FREE_GB="0")

    assert done.returncode == 2
    assert "usage: scripts/setup" in done.stderr
    assert not (tmp_path / "venv").exists()  # refused before anything was made
