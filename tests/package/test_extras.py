"""The optional extras (monitor/extras.py): a configuration that needs torch or sentence-transformers
stops at start-up, in one line naming the extra, when the default install lacks them; ``auto`` never
needs them.

The test venv has both installed: the CLI runs in a child interpreter where they are not importable
(:func:`tests.support.imports.without`), as in the default install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import load_settings
from monitor.extras import installed, require_extras, wanted
from tests.support import daemons
from tests.support.imports import EXTRA_PACKAGES, without
from tests.support.paths import REPO
from tests.support.scrape import http_status, scrape, value
from tests.support.waiting import wait_until

GPU = "pip install 'embedding-monitor[gpu]'"
ENCODER = "pip install 'embedding-monitor[encoder]'"
CONFLUENT = "pip install 'embedding-monitor[confluent]'"
INDEX = "pip install 'embedding-monitor[index]'"
PG_PROBE = {"probes": [{"name": "pg", "model": "m", "engine": "pgvector",
                        "pgvector": {"dsn": "postgresql://monitor@db/search", "table": "docs"}}]}
LANCE_PROBE = {"probes": [{"name": "lance", "model": "m", "engine": "lancedb",
                           "lancedb": {"uri": "/data/lance", "table": "docs"}}]}


def golden_probe(tmp_path: Path, encoder: bool) -> dict[str, Any]:
    golden = tmp_path / "golden.jsonl"
    golden.write_text(json.dumps({"query_id": "q", "text": "how do I sort a list", "qrels": {"d": 1}}) + "\n")
    probe: dict[str, Any] = {"name": "gold", "file": str(golden), "model": "m", "retriever": {"kind": "knn"}}
    if encoder:
        (tmp_path / "minilm").mkdir(exist_ok=True)
        probe["encoder"] = {"path": str(tmp_path / "minilm")}
    return probe


def config(tmp_path: Path, settings: dict[str, Any]) -> Path:
    path = tmp_path / "embmon.yaml"
    path.write_text(yaml.safe_dump({"source": "synthetic", "state_dir": str(tmp_path / "state"), **settings}))
    return path


def run_without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(daemons.cli_argv(*args, prelude=without(*EXTRA_PACKAGES)), cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("command", "settings", "message"),
    [
        ("run", {"device": "cuda"}, f"device: cuda needs torch, which is not installed: {GPU}"),
        ("demo", {"device": "cuda"}, f"device: cuda needs torch, which is not installed: {GPU}"),
        ("run", {"device": "cpu", "drift": {"device": "cuda"}},
         f"drift.device: cuda needs torch, which is not installed: {GPU}"),
        ("run", {"device": "cpu", "probes": {"device": "cuda", "clicks": [{"name": "c", "model": "m"}]}},
         f"probes.device: cuda needs torch, which is not installed: {GPU}"),
        ("run", {"device": "cpu", "probes": {"golden": "ENCODER"}},
         f"probes.golden[0].encoder (probe 'gold': text queries) needs sentence-transformers, which is not "
         f"installed: {ENCODER}"),
        ("run", {"device": "cpu", "source": "kafka", "kafka": {"client": "confluent"}},
         f"kafka.client: confluent needs confluent-kafka, which is not installed: {CONFLUENT}"),
        ("run", {"device": "cpu", "index": PG_PROBE},
         f"index.probes[0].engine: pgvector (probe 'pg') needs psycopg, which is not installed: {INDEX}"),
        ("run", {"device": "cpu", "index": LANCE_PROBE},
         f"index.probes[0].engine: lancedb (probe 'lance') needs lancedb, which is not installed: {INDEX}"),
    ],
    ids=["device", "demo-device", "drift-device", "probes-device", "text-encoder", "confluent", "index-pgvector",
         "index-lancedb"],
)
def test_a_setting_that_needs_an_extra_not_installed_exits_2_naming_it(
    tmp_path: Path, command: str, settings: dict[str, Any], message: str
) -> None:
    if settings.get("probes", {}).get("golden") == "ENCODER":
        settings = {**settings, "probes": {"golden": [golden_probe(tmp_path, encoder=True)]}}
    done = run_without_extras(command, "--config", str(config(tmp_path, settings)))
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"embedding-monitor: {message}\n"


def test_what_asks_for_an_extra(tmp_path: Path) -> None:
    """Only a setting that is in effect: cuda for a disabled feature, auto or a golden set of vectors need nothing."""
    def needs(settings: dict[str, Any]) -> list[tuple[str, str]]:
        return wanted(load_settings(overrides={"state_dir": str(tmp_path / "state"), **settings}))

    assert needs({}) == [] and needs({"device": "auto"}) == []
    assert needs({"drift": {"enabled": False, "device": "cuda"}, "probes": {"device": "cuda"}}) == []
    assert needs({"probes": {"golden": [golden_probe(tmp_path, encoder=False)]}}) == []
    everything = needs({"device": "cuda", "drift": {"device": "cuda"},
                        "probes": {"device": "cuda", "golden": [golden_probe(tmp_path, encoder=True)]}})
    assert [extra for _, extra in everything] == ["gpu", "gpu", "gpu", "encoder"]
    assert needs({"source": "kafka", "kafka": {"client": "confluent"}}) == [("kafka.client: confluent", "confluent")]
    assert needs({"source": "synthetic", "kafka": {"client": "confluent"}}) == []
    assert [extra for _, extra in needs({"index": PG_PROBE})] == ["index"]
    assert [extra for _, extra in needs({"index": LANCE_PROBE})] == ["index"]


def test_with_the_extras_installed_nothing_is_refused(tmp_path: Path) -> None:
    """This venv has both (the test extra pulls them): the same settings pass the check."""
    assert installed("torch") and installed("sentence_transformers")
    settings = load_settings(overrides={"state_dir": str(tmp_path / "state"), "device": "cuda",
                                        "probes": {"golden": [golden_probe(tmp_path, encoder=True)]}})
    require_extras(settings)


def test_installed_looks_a_module_up_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert installed("json") and not installed("embmon_no_such_module")
    monkeypatch.setitem(sys.modules, "embmon_blocked", None)  # how Python marks a module as not importable
    assert not installed("embmon_blocked")


@pytest.mark.slow  # 2.8 s of CPU in the daemon it starts
def test_auto_without_torch_runs_on_the_cpu_without_a_warning(tmp_path: Path) -> None:
    """The default device on a machine with an NVIDIA driver but the default install: the daemon
    starts, serves metrics and stops cleanly; the log says once, at INFO, that the CPU runs everything."""
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: fake\n")
    prelude = (
        without(*EXTRA_PACKAGES)
        + f"from monitor import devices\ndevices._NVIDIA_DRIVER = devices.Path({str(driver)!r})\n"
    )
    path = config(tmp_path, {"refresh_seconds": 0.5, "http": {"host": "127.0.0.1"}})
    with daemons.process("--config", str(path), log=tmp_path / "daemon.log", prelude=prelude) as daemon:
        wait_until(lambda: http_status(daemon.port, "/readyz") == 200, timeout=90, message="ready",
                   on_timeout=lambda: daemon.output()[-3000:])
        assert (value(scrape(daemon.port), "embmon_window_records", model="demo-model", stream="documents") or 0) > 0
        assert daemon.stop() == 0
    log = daemon.output()
    assert log.count("torch is not installed: the CPU runs everything") == 1, log[-3000:]
    assert " WARNING " not in log and " ERROR " not in log and "Traceback" not in log, log[-3000:]
