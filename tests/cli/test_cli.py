"""The command line: inspect, bad configuration, the demo, SIGTERM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from monitor.cli.main import main
from monitor.config import load_settings
from monitor.quality.intrinsic import report_from_matrix
from tests.support import daemons
from tests.support.broker import free_port
from tests.support.paths import REPO
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

GAUGES = {
    "partition_isotropy", "effective_dimension", "effective_dimension_ratio", "top10_variance_ratio",
    "mean_cosine_similarity", "vector_norm_mean", "vector_norm_stddev", "dead_dimensions", "effective_rank",
    "stable_rank", "collapse_detected", "uniformity", "alignment", "dimension", "window_records",
}


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "monitor", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_inspect_npy_json_matches_the_metric_code(tmp_path: Path) -> None:
    matrix = np.random.default_rng(3).standard_normal((500, 24)).astype(np.float32)
    path = tmp_path / "vectors.npy"
    np.save(path, matrix)
    proc = run_cli("inspect", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert GAUGES <= set(out)
    expected = report_from_matrix(matrix, settings=load_settings().quality)
    assert out["window_records"] == 500 and out["dimension"] == 24
    assert out["effective_dimension"] == pytest.approx(expected.effective_dimension, rel=1e-9)
    assert out["mean_cosine_similarity"] == pytest.approx(expected.mean_cosine_similarity, rel=1e-9, abs=1e-12)
    assert out["collapse_detected"] == 0
    assert out["alignment"] is None  # no positive pairs declared


def test_inspect_jsonl_counts_invalid_lines_and_reports_alignment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(4)
    lines = []
    base = rng.standard_normal((100, 8))
    for i, row in enumerate(base):
        lines.append(orjson.dumps({"id": f"a{i}", "model": "m", "vector": row.tolist(), "pair_id": f"p{i}"}))
        twin = row + 0.05 * rng.standard_normal(8)
        lines.append(orjson.dumps({"id": f"b{i}", "model": "m", "vector": twin.tolist(), "pair_id": f"p{i}"}))
    lines += [b"garbage", orjson.dumps({"id": "z", "model": "m", "vector": [1.0, 2.0]})]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert main(["inspect", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["model"] == "m" and out["window_records"] == 200
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    assert out["alignment"] is not None and 0 < out["alignment"] < 0.05
    assert "bad_json=1" in captured.err and "dim_mismatch=1" in captured.err
    assert main(["inspect", str(path)]) == 0
    table = capsys.readouterr().out
    assert "model=m stream=default" in table and "effective_rank" in table
    del unit


def test_inspect_missing_or_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "nope.npy")]) == 2
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 4, 5)))
    assert main(["inspect", str(bad)]) == 2
    assert "expected a numeric (n, d) matrix" in capsys.readouterr().err


def test_inspect_empty_truncated_or_unusable_npy_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.npy"
    np.save(good, np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32))
    data = good.read_bytes()
    cases = {
        "empty.npy": (b"", "empty file, not an .npy matrix"),
        "header.npy": (data[:100], "not a readable .npy file (EOF: reading array header"),
        "rows.npy": (data[:-20], "not a readable .npy file (Failed to read all data"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert main(["inspect", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (name, err)
    zeros = tmp_path / "zeros.npy"
    rows = np.zeros((5, 4), dtype=np.float32)
    rows[0, 0] = np.nan
    np.save(zeros, rows)
    assert main(["inspect", str(zeros)]) == 2
    assert "no usable embeddings (rejected: non_finite=1, zero_vector=4)" in capsys.readouterr().err


def test_bad_config_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("window:\n  subwindows: 0\nkafka:\n  group_id: ok\n")
    proc = run_cli("run", "--config", str(config))
    assert proc.returncode == 2
    assert "window.subwindows" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("run", "--kafka-option", "no_such_setting=1")
    assert proc.returncode == 2 and "kafka.options" in proc.stderr and "no_such_setting" in proc.stderr
    proc = run_cli("run", "--metrics-port", "70000")
    assert proc.returncode == 2 and "http.port" in proc.stderr
    proc = run_cli("run", "--source", "file")
    assert proc.returncode == 2 and "file.path" in proc.stderr


def test_environment_overrides_reach_the_cli(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "run"],
        env={"EMBMON_REFRESH_SECONDS": "-3", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2 and "refresh_seconds" in proc.stderr


@pytest.mark.slow
def test_demo_shows_healthy_then_collapsed(tmp_path: Path) -> None:
    config = tmp_path / "demo.yaml"
    config.write_text(
        "synthetic:\n  rate: 2000\n  models: [{name: demo, dim: 64}]\n"
        "  phases: [{kind: healthy, seconds: 6}, {kind: collapsed, seconds: 60}]\n  loop: false\n"
        "window:\n  seconds: 3\n  subwindows: 3\n  reservoir_size: 500\n"
        "refresh_seconds: 0.5\n"
    )
    with daemons.process("--config", str(config), "--duration", "30", "--state-dir", str(tmp_path / "state"),
                         command="demo", log=tmp_path / "demo.log") as demo:
        port = demo.port
        labels = {"model": "demo", "stream": "documents"}
        wait_until(
            lambda: value(scrape(port), "embmon_collapse_detected", **labels) == 0, timeout=30, message="healthy"
        )
        healthy = scrape(port)
        wait_until(
            lambda: value(scrape(port), "embmon_collapse_detected", **labels) == 1, timeout=30, message="collapse"
        )
        collapsed = scrape(port)
        assert (
            value(collapsed, "embmon_effective_rank", **labels) < value(healthy, "embmon_effective_rank", **labels) / 3
        )
        assert value(collapsed, "embmon_mean_cosine_similarity", **labels) > value(
            healthy, "embmon_mean_cosine_similarity", **labels
        )
        # the view prints its plain lines once per refresh: one of them shows the collapse
        wait_until(lambda: "collapse YES" in demo.output(), timeout=15, message="the view showing the collapse")
        assert demo.stop(timeout=15) == 0
    out = demo.output()
    assert "phase collapsed" in out and "collapse YES" in out


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_demo_runs_in_a_fresh_temporary_state_directory_not_the_working_directory(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "demo", "--metrics-port", str(free_port()), "--duration", "2",
         "--no-summary"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("state directory: "))
    used = Path(line.removeprefix("state directory: "))
    assert used.name.startswith("embmon-demo-") and not used.exists()  # removed at exit
    assert list(tmp_path.iterdir()) == []  # nothing written where the demo was started


def test_the_default_state_directory_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert load_settings().state_dir == tmp_path / "embedding-monitor"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert load_settings().state_dir == Path.home() / ".local" / "state" / "embedding-monitor"


SECRET = "hunter2-never-printed"


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def _config_case(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str], list[str]]:
    """(run arguments, environment, what stderr must name) for one broken configuration."""
    start = ["--source", "synthetic", "--metrics-port", "0", "--state-dir", str(tmp_path / "state")]
    config = tmp_path / "config.yaml"
    if name == "infinite window":
        return ["--config", str(_write(config, "window:\n  seconds: .inf\n"))], {}, ["window.seconds", "finite"]
    if name == "nan flag":
        return ["--refresh-seconds", "nan"], {}, ["refresh_seconds", "finite"]
    if name == "config not UTF-8":
        return ["--config", str(_write(config, b"kafka:\n  group_id: \xff\xfe\n"))], {}, [str(config), "not UTF-8"]
    if name == "config nested 10,000 [":
        return ["--config", str(_write(config, "[" * 10_000))], {}, [str(config), "nested too deeply"]
    if name == "config nested 10,000 {":
        return ["--config", str(_write(config, "{a: " * 10_000))], {}, [str(config), "nested too deeply"]
    if name == "environment not JSON":
        return [], {"EMBMON_KAFKA__OPTIONS": "{not json " + SECRET}, ["EMBMON_KAFKA__OPTIONS", "not valid JSON"]
    if name.startswith("admin token file"):
        content = {"admin token file short": SECRET[:8] + "\n", "admin token file empty": "",
                   "admin token file not UTF-8": b"\xff\xfe" + SECRET.encode()}[name]
        token = _write(tmp_path / "token", content)
        return [*start], {"EMBMON_HTTP__ADMIN_TOKEN_FILE": str(token)}, ["http.admin_token_file", str(token)]
    if name == "admin token short after stripping":
        return [*start], {"EMBMON_HTTP__ADMIN_TOKEN": SECRET[:8] + " " * 12 + "\n"}, ["admin_token", "at least 16"]
    if name == "TLS certificate not PEM":
        cert = _write(tmp_path / "server.crt", "not a certificate\n")
        key = _write(tmp_path / "server.key", "not a key\n")
        env = {"EMBMON_HTTP__TLS_CERTFILE": str(cert), "EMBMON_HTTP__TLS_KEYFILE": str(key)}
        return [*start], env, ["http.tls_certfile", str(cert), "not a PEM certificate"]
    if name == "kafka option KEY:VALUE":
        return (
            [f"--kafka-option=sasl_plain_password:{SECRET}"],
            {},
            ["kafka.options", "sasl_plain_password", "KEY=VALUE"],
        )
    if name == "YAML error on the password line":
        text = f"kafka:\n  options:\n    sasl_plain_password: {SECRET}: x\n"
        return ["--config", str(_write(config, text))], {}, [str(config), "line 3, column", "not valid YAML"]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "case",
    [
        "infinite window", "nan flag", "config not UTF-8", "config nested 10,000 [", "config nested 10,000 {",
        "environment not JSON", "admin token file short", "admin token file empty", "admin token file not UTF-8",
        "admin token short after stripping", "TLS certificate not PEM", "kafka option KEY:VALUE",
        "YAML error on the password line",
    ],
)
def test_a_broken_configuration_is_one_line_naming_it_with_exit_2_and_no_secret(tmp_path: Path, case: str) -> None:
    args, env, named = _config_case(tmp_path, case)
    proc = subprocess.run(
        [sys.executable, "-m", "monitor", "run", *args], env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedding-monitor: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])
    assert SECRET not in proc.stderr + proc.stdout
    assert SECRET[:8] not in proc.stderr + proc.stdout
