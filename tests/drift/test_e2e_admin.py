"""The baseline admin endpoint and ``baseline capture --url`` against a running daemon (synthetic source).

``POST /admin/baseline`` needs ``Authorization: Bearer <http.admin_token>`` (401 otherwise); with no
token configured every ``/admin/*`` route answers 403. A capture makes the current window the
reference, written to the state directory before the response.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monitor.cli.main import main
from monitor.config import load_settings
from monitor.daemon.service import Monitor
from monitor.drift.references.store import ReferenceStore
from tests.support import daemons
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

TOKEN = "s3cret-admin-token-0123456789"
MODEL, STREAM = "m", "docs"
LABELS = {"model": MODEL, "stream": STREAM}


def synthetic_settings(state_dir: Path, **http: Any) -> Any:
    return load_settings(
        overrides={
            "source": "synthetic",
            "synthetic": {
                "models": [{"name": MODEL, "dim": 16}], "stream": STREAM, "rate": 500.0, "batch_size": 25,
                "phases": [{"kind": "healthy", "seconds": 600.0}],
            },
            "window": {"seconds": 3.0, "subwindows": 3, "reservoir_size": 300},
            "refresh_seconds": 0.5,
            "state_dir": str(state_dir),
            "http": {"host": "127.0.0.1", "port": 0, **http},
            "drift": {"interval_seconds": 60.0, "reference": {"records": 200}, "reference_sample_size": 200},
        }
    )


def post(port: int, query: str, token: str | None) -> tuple[int, dict[str, Any] | str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/baseline{query}", data=b"", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        return exc.code, json.loads(body) if body.startswith("{") else body


@pytest.fixture
def daemon(state_dir: Path) -> Iterator[Monitor]:
    with daemons.monitor(synthetic_settings(state_dir, admin_token=TOKEN)) as monitor:
        yield monitor


def test_admin_endpoint_pins_the_current_window(daemon: Monitor, state_dir: Path) -> None:
    port = daemon.http.port
    wait_until(lambda: value(scrape(port), "embmon_reference_records", **LABELS) == 200, timeout=20,
               message="first-records reference")
    first_ts = value(scrape(port), "embmon_reference_timestamp_seconds", **LABELS)
    assert post(port, f"?model={MODEL}", None)[0] == 401
    assert post(port, f"?model={MODEL}", TOKEN + "x")[0] == 401
    assert post(port, f"?model={MODEL}", "Basic " + TOKEN)[0] == 401
    assert value(scrape(port), "embmon_http_auth_failures_total", endpoint="admin") == 3
    assert value(scrape(port), "embmon_reference_timestamp_seconds", **LABELS) == first_ts  # unchanged
    status, body = post(port, "", TOKEN)
    assert status == 400 and "model" in body["error"]  # type: ignore[index]
    status, body = post(port, "?model=unknown", TOKEN)
    assert status == 404 and "unknown" in body["error"]  # type: ignore[index]

    wait_until(lambda: (value(scrape(port), "embmon_window_records", **LABELS) or 0) >= 1000, timeout=10,
               message="a full window")
    before = time.time()
    status, body = post(port, f"?model={MODEL}&stream={STREAM}", TOKEN)
    assert status == 200, body
    [ref] = body["references"]  # type: ignore[index]
    assert (ref["model"], ref["stream"], ref["origin"]) == (MODEL, STREAM, "captured")
    assert ref["records"] >= 1000 and ref["sample_rows"] <= 400
    assert before <= ref["captured_at"] <= time.time()
    s = scrape(port)
    assert value(s, "embmon_reference_records", **LABELS) == ref["records"]
    assert value(s, "embmon_reference_timestamp_seconds", **LABELS) == ref["captured_at"] > first_ts
    # on disk before the response
    stored = ReferenceStore(state_dir).load_all()[(MODEL, STREAM)]
    assert stored.origin == "captured" and stored.profile.count == ref["records"]
    assert stored.profile.captured_at == ref["captured_at"] and str(stored.path) == ref["path"]


def test_baseline_capture_cli_calls_the_daemon(
    daemon: Monitor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = daemon.http.port
    wait_until(lambda: value(scrape(port), "embmon_reference_records", **LABELS) == 200, timeout=20,
               message="first-records reference")
    first_ts = value(scrape(port), "embmon_reference_timestamp_seconds", **LABELS)
    # a window larger than the first-records reference, so the capture is told apart by its count
    wait_until(lambda: (value(scrape(port), "embmon_window_records", **LABELS) or 0) >= 1000, timeout=10,
               message="a full window")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    url = f"http://127.0.0.1:{port}"
    assert main(["baseline", "capture", "--url", url, "--token-file", str(token_file), "--model", MODEL]) == 0
    out = capsys.readouterr().out
    assert f"{MODEL}/{STREAM}: captured reference" in out
    s = scrape(port)
    assert value(s, "embmon_reference_timestamp_seconds", **LABELS) > first_ts
    assert value(s, "embmon_reference_records", **LABELS) != 200
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-admin-token-at-all")
    assert main(["baseline", "capture", "--url", url, "--token-file", str(wrong), "--model", MODEL]) == 1
    assert "answered 401" in capsys.readouterr().err
    assert main(["baseline", "capture", "--url", url, "--model", MODEL]) == 2  # no token file
    assert main(["baseline", "capture", "--url", "http://127.0.0.1:1", "--token-file", str(token_file),
                 "--model", MODEL, "--timeout", "2"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_admin_endpoint_is_disabled_without_a_token(state_dir: Path) -> None:
    with daemons.monitor(synthetic_settings(state_dir)) as monitor:
        status, body = post(monitor.http.port, f"?model={MODEL}", TOKEN)
        assert status == 403 and "admin_token" in body
