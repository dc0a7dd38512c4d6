"""``embedding-monitor baseline`` offline: prepare a reference, list and clear stored ones, refuse bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from monitor.cli.main import main
from monitor.drift.references.lagged import LaggedRing
from monitor.drift.references.profile import ReferenceProfile
from monitor.drift.references.store import ReferenceStore
from tests.support.drift import Harness, axis, settings_for, unit_rows


@pytest.fixture
def vectors(tmp_path: Path) -> tuple[Path, np.ndarray]:
    matrix = unit_rows(np.random.default_rng(2), 500, axis(0))
    path = tmp_path / "vectors.npy"
    np.save(path, matrix)
    return path, matrix


def test_capture_from_vectors_into_a_state_dir_is_used_by_the_daemon(
    tmp_path: Path, vectors: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]
) -> None:
    path, matrix = vectors
    state = tmp_path / "state"
    code = main(["baseline", "capture", "--from", str(path), "--model", "m", "--stream", "s", "--state-dir", str(state),
                 "--max-rows", "300"])
    assert code == 0
    assert "m/s: file reference, 500 records (300 sampled, d=16)" in capsys.readouterr().out
    assert main(["baseline", "show", "--state-dir", str(state)]) == 0
    assert "m/s: file reference, 500 records" in capsys.readouterr().out
    assert main(["baseline", "show", "--state-dir", str(state), "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["references"]
    assert (listed["model"], listed["stream"], listed["origin"], listed["records"]) == ("m", "s", "file", 500)
    # a daemon on that state directory compares with it: no first-records capture
    h = Harness(settings_for(state))
    h.feed("m", "s", unit_rows(np.random.default_rng(3), 400, axis(0)))
    ref = h.component.reference("m", "s")
    assert ref is not None and ref.count == 500 and ref.source == "file vectors.npy"
    np.testing.assert_allclose(ref.centroid, matrix.mean(axis=0, dtype=np.float64))
    h.close()
    assert main(["baseline", "clear", "--state-dir", str(state), "--model", "m"]) == 0
    assert "deleted the reference of m/s" in capsys.readouterr().out
    assert ReferenceStore(state).load_all() == {}
    assert main(["baseline", "clear", "--state-dir", str(state), "--model", "m"]) == 1
    assert main(["baseline", "show", "--state-dir", str(state)]) == 0
    assert "no references stored" in capsys.readouterr().out


def test_capture_to_a_reference_file(tmp_path: Path, vectors: tuple[Path, np.ndarray]) -> None:
    path, matrix = vectors
    out = tmp_path / "ref.npz"
    assert main(["baseline", "capture", "--from", str(path), "--out", str(out), "--max-rows", "100"]) == 0
    profile = ReferenceProfile.from_npz(out)
    assert profile.count == 500 and profile.sample.shape == (100, 16)
    np.testing.assert_allclose(profile.centroid, matrix.mean(axis=0, dtype=np.float64))
    rows = {tuple(r) for r in matrix}
    assert all(tuple(r) in rows for r in profile.sample)


def test_show_lists_lagged_snapshots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ring = LaggedRing(tmp_path, lag_seconds=3600, interval_seconds=60)
    profile = ReferenceProfile.from_sample(unit_rows(np.random.default_rng(1), 20, axis(0)), captured_at=0, source="w")
    for t in (1_700_000_000.0, 1_700_000_100.0):
        ring.add(("m", "s/x"), profile, t)
    assert main(["baseline", "show", "--state-dir", str(tmp_path)]) == 0
    assert "m/s/x: 2 lagged snapshots from 2023-11-14T22:13:20Z to 2023-11-14T22:15:00Z" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "http://x", "--token-file", "t"], "--model is required"),
        (["--url", "http://x", "--model", "m"], "--token-file is required"),
        (["--url", "file:///etc/passwd", "--model", "m", "--token-file", "t"], "--url must be the daemon's http://"),
        (["--from", "{npy}"], "needs --state-dir DIR or --out FILE"),
        (["--from", "{npy}", "--state-dir", "{tmp}"], "needs --model and --stream"),
        (["--from", "{tmp}/v.txt", "--out", "{tmp}/r.npz"], "takes an .npy"),
        (["--from", "{nan}", "--out", "{tmp}/r.npz"], "1 rows contain NaN"),
        (["--from", "{npy}", "--out", "{tmp}/r.npy"], "must end in .npz"),
        (["--from", "{tmp}/missing.npy", "--out", "{tmp}/r.npz"], "No such file"),
    ],
)
def test_bad_usage_exits_2(
    tmp_path: Path, vectors: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    nan = tmp_path / "nan.npy"
    bad = np.ones((4, 3), dtype=np.float32)
    bad[2, 1] = np.nan
    np.save(nan, bad)
    filled = [a.format(npy=vectors[0], tmp=tmp_path, nan=nan) for a in args]
    assert main(["baseline", "capture", *filled]) == 2
    assert message in capsys.readouterr().err
