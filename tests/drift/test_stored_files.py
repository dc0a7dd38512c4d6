"""Crafted reference files: each is refused at load with one line, set aside (and counted) when the
daemon starts on it, listed as unreadable by ``baseline show``, and an exit 2 when pinned with
``run --reference``; the oversized ones without the memory they declare."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.cli.main import main
from monitor.drift.references.pinned import load_reference_file
from monitor.drift.references.profile import REFERENCE_MAX_BYTES, ReferenceProfile
from monitor.drift.references.store import META_KEY, ReferenceStore, StoredReference
from tests.support.drift import Harness, axis, settings_for, unit_rows
from tests.support.mounts import peak_rss_growth
from tests.support.paths import REPO

MODEL, STREAM = "m", "s"


def members(dim: int = 16) -> dict[str, np.ndarray]:
    """The members of a good stored reference of m/s."""
    profile = ReferenceProfile.from_sample(unit_rows(np.random.default_rng(0), 50, axis(0, dim)), captured_at=1.7e9,
                                           source="test")
    arrays = profile.to_arrays()
    arrays[META_KEY] = np.str_(json.dumps({"version": 1, "model": MODEL, "stream": STREAM, "origin": "captured",
                                           "pin_sha256": None, "written_at": 1.7e9}))
    return arrays


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def corrupt(path: Path) -> None:
    path.write_bytes(np.random.default_rng(1).bytes(4096))


def array_valued_version(path: Path) -> None:
    np.savez(path, **{**members(), "format_version": np.array([1, 1])})


def text_count(path: Path) -> None:
    np.savez(path, **{**members(), "count": np.str_("fifty")})


def huge_declared_shape(path: Path) -> None:
    """A header declaring 10^12 rows over 3,200 bytes of data: numpy allocates what the header says."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in members().items():
            if name != "sample":
                buffer = io.BytesIO()
                np.save(buffer, array)
                archive.writestr(f"{name}.npy", buffer.getvalue())
        archive.writestr("sample.npy", npy_header((10**12, 16)) + bytes(3200))


def zip_bomb(path: Path) -> None:
    """A sample of 1.1 GiB of zeros, deflated to about 5 MB (before: 1.9 MB inflated to 2.6 GiB, accepted)."""
    rows, dim = 300_000, 1024
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, array in members(dim).items():
            if name != "sample":
                buffer = io.BytesIO()
                np.save(buffer, array)
                archive.writestr(f"{name}.npy", buffer.getvalue())
        with archive.open("sample.npy", "w", force_zip64=True) as member:
            member.write(npy_header((rows, dim)))
            zeros, left = bytes(64 << 20), rows * dim * 4
            while left:
                member.write(zeros[: min(left, len(zeros))])
                left -= min(left, len(zeros))


CRAFTED: list[Any] = [
    (corrupt, "not a readable .npz archive: BadZipFile"),
    (array_valued_version, "member 'format_version' has shape (2,), expected a scalar"),
    (text_count, "member 'count' holds <U5 where integers are expected"),
    (huge_declared_shape, "member 'sample' declares shape (1000000000000, 16) of float32 (64000000000000 bytes) "
                          "but holds 3200"),
    pytest.param(zip_bomb, f"uncompressed, over the limit of {REFERENCE_MAX_BYTES}", marks=pytest.mark.slow),  # 3 s CPU
]
IDS = ["corrupt", "array-valued-format-version", "text-count", "huge-declared-shape", "zip-bomb"]


@pytest.mark.parametrize(("craft", "message"), CRAFTED, ids=IDS)
def test_a_crafted_stored_reference_is_set_aside_at_start_and_listed_as_unreadable(
    tmp_path: Path, craft: Callable[[Path], None], message: str, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = ReferenceStore(tmp_path)
    path = store.path(MODEL, STREAM)
    path.parent.mkdir(parents=True)
    craft(path)
    with pytest.raises(ValueError) as info:
        store.load(path)
    assert message in str(info.value) and "\n" not in str(info.value)

    assert main(["baseline", "show", "--state-dir", str(tmp_path)]) == 0
    assert f"{path}: unreadable ({info.value})" in capsys.readouterr().out
    assert main(["baseline", "show", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unreadable"] == [{"path": str(path), "unreadable": str(info.value)}]

    started: list[Harness] = []
    growth = peak_rss_growth(lambda: started.append(Harness(settings_for(tmp_path))))
    assert growth < 64 * 2**20, growth  # what the file declares is never allocated
    h = started[0]
    assert h.context.rejected_files.counts.snapshot() == {"reference": 1}
    [line] = [r.getMessage() for r in caplog.records if "is unusable" in r.getMessage()]
    assert f"reference {path} is unusable ({info.value}); moved aside to s.npz.rejected-" in line
    assert not path.exists() and len(list(path.parent.glob("s.npz.rejected-*"))) == 1
    # the stream falls back to its first records, as if nothing had been stored
    h.feed(MODEL, STREAM, unit_rows(np.random.default_rng(3), 400, axis(0)))
    assert h.component.reference(MODEL, STREAM) is not None
    h.close()
    # the next start finds nothing to set aside
    again = Harness(settings_for(tmp_path))
    assert again.context.rejected_files.counts.snapshot() == {}
    again.close()


# the CLI in a child process, reporting its peak resident memory after it returns (VmHWM: getrusage's
# maximum would start from this process's own, which Linux hands down through fork and exec)
_MEASURED_CLI = (
    "import sys\n"
    "from monitor.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "peak = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
    "print('peak', int(peak.split()[1]) * 1024, file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
@pytest.mark.parametrize(("craft", "message"), CRAFTED, ids=IDS)
def test_a_crafted_reference_file_pinned_on_the_command_line_exits_2_with_one_line(
    tmp_path: Path, craft: Callable[[Path], None], message: str
) -> None:
    reference = tmp_path / "ref.npz"
    craft(reference)
    run = subprocess.run(
        [sys.executable, "-c", _MEASURED_CLI, "run", "--source", "synthetic", "--reference", str(reference),
         "--state-dir", str(tmp_path / "state"), "--metrics-port", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = [line for line in run.stderr.splitlines() if line.startswith("embedding-monitor:")]
    assert f"{reference}: not a usable reference archive (" in line and message in line
    [peak] = [int(line.split()[1]) for line in run.stderr.splitlines() if line.startswith("peak ")]
    assert peak < 512 * 2**20, peak  # the interpreter with numpy and the drift modules; never the 1.1 GiB


def test_a_good_stored_reference_round_trips_through_the_checked_reader(tmp_path: Path) -> None:
    store = ReferenceStore(tmp_path)
    profile = ReferenceProfile.from_sample(unit_rows(np.random.default_rng(0), 50, axis(0)), captured_at=1.7e9,
                                           source="test")
    path = store.save(StoredReference(MODEL, STREAM, profile, "captured"))
    loaded = store.load(path)
    assert (loaded.model, loaded.stream, loaded.origin, loaded.profile.count) == (MODEL, STREAM, "captured", 50)
    np.testing.assert_array_equal(loaded.profile.sample, profile.sample)


@pytest.mark.parametrize(("content", "message"), [
    (b"", "not an .npy file"),
    (b"garbage", "not an .npy file"),
    (npy_header((1000, 16)) + bytes(64), "not a readable .npy matrix (mmap length is greater than file size)"),
], ids=["empty", "not-npy", "truncated"])
def test_a_bad_npy_matrix_is_one_line_where_it_is_read(
    tmp_path: Path, content: bytes, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "vectors.npy"
    path.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_reference_file(path, max_rows=100, rng=np.random.default_rng(0))
    assert str(info.value) == f"{path}: {message}"
    assert main(["baseline", "capture", "--from", str(path), "--out", str(tmp_path / "r.npz")]) == 2
    assert capsys.readouterr().err == f"embedding-monitor baseline: {path}: {message}\n"
