"""What the outbound callers are configured with is checked when the settings load: a header that
would break the request (CR/LF, a control character, a name that is no token), a URL without a host,
with a bad port or another scheme. Each is a ConfigError naming the field, and ``run`` exits 2
before it starts anything (it used to start, and fail every cycle)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitor import outbound
from monitor.config import ConfigError, load_settings

BAD_URLS = ["ftp://h/x", "http:///path", "http://h:99999/x", "http://h:port/x", "http://h:0/x", "file:///etc/passwd",
            "http://h /x", "http://h/x\r\nX: y", "http://user:secret@h/x", "h/x"]
BAD_HEADERS = [{"X-Team": "a\r\nInjected: 1"}, {"X-Team": "a\nb"}, {"X-Team": "nul\x00"}, {"X Team": "a"},
               {"X-Team:": "a"}, {"": "a"}, {"X-Team": " padded"}, {"Host": "elsewhere"}, {"X-Team": "a\x7f"}]


def serving(url: str = "http://127.0.0.1:8080/v1/embeddings", headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"serving": {"endpoints": [{"model": "m", "url": url, "headers": headers or {}}]}}


def retriever(url: str = "http://127.0.0.1:8080/search", headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"probes": {"golden": [{"name": "g", "file": __file__, "model": "m", "retriever": {
        "kind": "http", "url": url, "headers": headers or {}, "request_template": "{}", "ids_path": "ids[*]"}}]}}


def qdrant(url: str) -> dict[str, Any]:
    return {"index": {"probes": [{"name": "q", "model": "m", "engine": "qdrant",
                                  "qdrant": {"url": url, "collection": "docs"}}]}}


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize(("make", "field"), [(serving, "serving.endpoints.0.url"),
                                             (retriever, "probes.golden.0.retriever.http.url"),
                                             (qdrant, "index.probes.0.qdrant.url")],
                         ids=["serving", "retriever", "qdrant"])
def test_a_bad_url_stops_start_up_naming_the_field(make: Any, field: str, url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides=make(url))
    message = str(caught.value)
    assert "URL" in message, message
    assert field.split(".")[0] in message and field.split(".")[-1] in message, message
    assert "secret" not in message  # a URL's credentials are never echoed


@pytest.mark.parametrize("headers", BAD_HEADERS, ids=repr)
@pytest.mark.parametrize("make", [serving, retriever], ids=["serving", "retriever"])
def test_a_bad_header_stops_start_up_naming_the_field(make: Any, headers: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(overrides=make(headers=headers))
    assert "headers" in str(caught.value) and "header" in str(caught.value)


def test_good_urls_and_headers_still_load() -> None:
    for url in ("http://127.0.0.1:8080/v1/embeddings", "https://[::1]:443/x?a=b", "http://embed.svc/x"):
        load_settings(overrides=serving(url, {"X-Team": "search; v=1", "X-Token": "abc\tdef"}))
    load_settings(overrides=retriever("http://h/search/{{text}}?k={{k}}"))
    assert outbound.check_url("https://h:8443/x") == "https://h:8443/x"


def test_run_exits_2_on_a_header_with_crlf(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"source": "synthetic", "state_dir": str(tmp_path / "state"),
                                      **serving(headers={"X-Team": "a\r\nInjected: 1"})}))
    proc = subprocess.run([sys.executable, "-m", "monitor", "run", "--config", str(config)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "serving.endpoints.0.headers" in proc.stderr and "Traceback" not in proc.stderr
    assert "Injected" not in proc.stderr  # never the value
