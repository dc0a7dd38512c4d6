"""Index-probe settings that would fail every cycle are refused at start-up: exit 2, the field named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor.config import ConfigError, load_settings

EXPRESSION = "({col})::halfvec(4) <=> ({q})::halfvec(4)"


def config(tmp_path: Path, pgvector: dict[str, Any]) -> Path:
    path = tmp_path / "embmon.yaml"
    path.write_text(yaml.safe_dump({
        "source": "synthetic", "state_dir": str(tmp_path / "state"),
        "index": {"probes": [{"name": "pg", "model": "m", "engine": "pgvector",
                              "pgvector": {"table": "docs", **pgvector}}]},
    }))
    return path


@pytest.mark.parametrize(("pgvector", "field", "says"), [
    ({"dsn_file": "/nonexistent/dsn"}, "index.probes.0.pgvector.dsn_file", "cannot read"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} % 2"}, "order_expression", "'%'"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} + {q}"}, "order_expression", "{q} exactly once"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} --"}, "order_expression", "'--'"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} /* x */"}, "order_expression", "'/*'"),
    ({"dsn": "x", "order_expression": "{col} <=> {q}; DROP TABLE docs"}, "order_expression", "';'"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} || 'x'"}, "order_expression", "\"'\""),
    ({"dsn": "x", "order_expression": "{col} <=> ({q}"}, "order_expression", "unbalanced"),
    ({"dsn": "x", "order_expression": "{col} <=> {q} {x}"}, "order_expression", "braces"),
])
def test_a_bad_index_setting_is_refused_naming_the_field(
    tmp_path: Path, pgvector: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(config(tmp_path, pgvector))
    assert field in str(caught.value) and says in str(caught.value), caught.value


def test_the_daemon_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = config(tmp_path, {"dsn_file": str(tmp_path / "missing")})
    done = subprocess.run([sys.executable, "-m", "monitor", "run", "--config", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "index.probes.0.pgvector.dsn_file" in done.stderr, done.stderr


def test_an_empty_dsn_file_is_refused_and_a_good_one_taken(tmp_path: Path) -> None:
    empty = tmp_path / "dsn"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="dsn_file"):
        load_settings(config(tmp_path, {"dsn_file": str(empty)}))
    empty.write_text("postgresql://u@db/x\n")
    settings = load_settings(config(tmp_path, {"dsn_file": str(empty), "order_expression": EXPRESSION}))
    pg = settings.index.probes[0].pgvector
    assert pg is not None and pg.connection_string() == "postgresql://u@db/x"


def test_a_pgvector_timeout_too_short_to_ever_connect_is_refused(tmp_path: Path) -> None:
    """libpq waits at least 2 s to connect and the cycle cuts its calls at 85 % of timeout_seconds:
    at 2 s the probe could never connect to a healthy database (every cycle a ``timeout``)."""
    path = config(tmp_path, {"dsn": "x"})
    data = yaml.safe_load(path.read_text())
    data["index"]["probes"][0]["timeout_seconds"] = 2
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert "timeout_seconds" in str(caught.value) and "at least 2.5" in str(caught.value), caught.value
    data["index"]["probes"][0]["timeout_seconds"] = 2.5
    path.write_text(yaml.safe_dump(data))
    assert load_settings(path).index.probes[0].timeout_seconds == 2.5
