"""Fuzzed answers for each outbound caller's parser, through a real loopback server: whatever the
bytes, the call ends with a result or an error counted by one of its reasons, and the next
(well-formed) answer is read as before. The golden probe exports its retriever's errors by reason.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor import outbound
from monitor.config import load_settings
from monitor.deadline import Deadline
from monitor.index.connectors.base import REASONS as INDEX_REASONS
from monitor.index.connectors.base import ConnectorError
from monitor.index.connectors.qdrant import QdrantConnector
from monitor.index.settings import QdrantSettings
from monitor.retrieval.probes.component import ProbeComponent
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.http_retriever import ERROR_REASONS as RETRIEVER_REASONS
from monitor.retrieval.probes.http_retriever import HttpRetriever
from monitor.retrieval.settings import HttpRetrieverSettings
from monitor.serving.backends import HttpBackend
from monitor.serving.responses import ERROR_REASONS as SERVING_REASONS
from monitor.serving.responses import ServingError
from monitor.serving.settings import EndpointSettings
from tests.support import hostile_http as hostile
from tests.support.probes import collect, probe_context
from tests.support.scrape import value

GOOD = {
    "serving": json.dumps({"data": [{"index": 0, "embedding": [1.0, 2.0, 3.0, 4.0]}]}).encode(),
    "retriever": json.dumps({"hits": [{"id": "d1"}, {"id": "d2"}]}).encode(),
    "qdrant": json.dumps({"result": {"points": [{"id": 1, "vector": [1.0, 2.0, 3.0, 4.0]}]}}).encode(),
}


class Switchable:
    """The bytes the server answers next (a fuzzed answer, then a good one)."""

    def __init__(self) -> None:
        self.data = b""

    def __call__(self, conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(self.data)


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[hostile.HostileServer, Switchable]]:
    answers = Switchable()
    with hostile.serving(answers) as running:
        yield running, answers


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["data", "embedding", "index", "hits", "id", "result", "points", "vector", "count"]),
        inner, max_size=4),
    max_leaves=30,
)
heads = st.sampled_from([
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n",
    b"HTTP/1.0 200 OK\r\n",
    b"HTTP/1.1 500 Oops\r\nContent-Type: text/html\r\n",
    b"HTTP/1.1 429 Slow down\r\nRetry-After: nan\r\n",
    b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
    b"HTTP/9.9 200 OK\r\n",
    b"HTTP/1.1 2000 OK\r\n",
    b"HTTP/1.1 200 OK\r\nX: \x00\x01\r\n",
])
answers = st.one_of(
    st.binary(max_size=400),  # anything at all
    st.tuples(heads, st.binary(max_size=200)).map(lambda p: p[0] + b"\r\n" + p[1]),
    st.tuples(heads, json_values).map(lambda p: p[0] + b"\r\n" + json.dumps(p[1]).encode()),
    json_values.map(lambda doc: ok(json.dumps(doc).encode())),
    st.sampled_from([b"NaN", b"[1e999]", b"-Infinity", b'{"data": [{"embedding": [NaN, 1, 2, 3]}]}',
                     b"[" * 100_000, b'{"hits": [{"id": ' + b"9" * 5000 + b"}]}"]).map(ok),
)
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def check_then_answer_again(call: Any, name: str, answers: Switchable, raw: bytes,
                            reasons: tuple[str, ...]) -> None:
    answers.data = raw
    try:
        call()
    except (ServingError, ConnectorError) as exc:
        assert exc.reason in reasons, exc.reason
    except ProbeError:
        pass  # the retriever: counted in its errors (checked by the caller)
    answers.data = ok(GOOD[name])
    assert call()  # the next answer is read as before


@FUZZ
@given(raw=answers)
def test_serving_backend_survives_any_answer(server: tuple[hostile.HostileServer, Switchable], raw: bytes) -> None:
    running, switch = server
    backend = HttpBackend(EndpointSettings(model="m", url=running.url + "/v1/embeddings", dim=4))
    check_then_answer_again(lambda: backend.embed(["a"], 5.0), "serving", switch, raw, SERVING_REASONS)


@FUZZ
@given(raw=answers)
def test_qdrant_connector_survives_any_answer(server: tuple[hostile.HostileServer, Switchable], raw: bytes) -> None:
    running, switch = server
    connector = QdrantConnector(QdrantSettings(url=running.url, collection="docs", timeout_seconds=5))
    connector.dim = 4
    check_then_answer_again(lambda: connector.sample(1), "qdrant", switch, raw, INDEX_REASONS)


@FUZZ
@given(raw=answers)
def test_http_retriever_survives_any_answer(server: tuple[hostile.HostileServer, Switchable], raw: bytes) -> None:
    running, switch = server
    retriever = HttpRetriever(HttpRetrieverSettings(url=running.url + "/s", ids_path="hits[*].id",
                                                    request_template='{"k": {{k}}}', request_timeout_seconds=5))
    failed = False
    switch.data = raw
    try:
        retriever.search("q", "t", None, 10, Deadline.after(30))
    except ProbeError:
        failed = True
    assert sum(retriever.error_counts().values()) == int(failed)
    assert set(retriever.error_counts()) <= set(RETRIEVER_REASONS)
    switch.data = ok(GOOD["retriever"])
    assert retriever.search("q", "t", None, 10, Deadline.after(30)) == ["d1", "d2"]


def test_the_golden_probe_exports_its_request_errors_by_reason(tmp_path: Path) -> None:
    golden = tmp_path / "golden.jsonl"
    golden.write_text("".join(json.dumps({"query_id": f"q{i}", "vector": [1.0, float(i)], "qrels": {"d1": 1}}) + "\n"
                              for i in range(5)))
    with hostile.serving(hostile.answer(b"", 200)) as attacker, \
            hostile.serving(hostile.redirect(attacker.url + "/")) as server:
        settings_ = load_settings(overrides={"state_dir": str(tmp_path / "state"), "probes": {
            "device": "cpu", "golden": [{
                "name": "golden", "file": str(golden), "model": "m", "k": [5], "timeout_seconds": 30,
                "retriever": {"kind": "http", "url": server.url + "/s", "ids_path": "hits[*].id",
                              "request_template": '{"v": {{vector}}, "k": {{k}}}', "max_error_ratio": 0.5}}]}})
        component = ProbeComponent(probe_context(settings_))
        with pytest.raises(ProbeError):
            component.run_probe("golden")
    samples = collect(component)
    assert value(samples, "embmon_probe_request_errors_total", probe="golden", reason="redirect") == 3  # 2 allowed
    assert value(samples, "embmon_probe_request_errors_total", probe="golden", reason="timeout") == 0
    assert value(samples, "embmon_probe_runs_total", probe="golden", outcome="failure") == 1
    assert attacker.requests == []


@pytest.mark.parametrize("raw", [b"[" + b"[]," * 200_000 + b"[]]", b'{"x": "' + b"," * 500_000 + b'"}'])
def test_the_value_budget_counts_outside_strings_only(raw: bytes) -> None:
    if raw.startswith(b"[["):
        with pytest.raises(outbound.OutboundError):
            outbound.parse_json(raw, 10_000)
    else:
        assert outbound.parse_json(raw, 10)["x"].count(",") == 500_000
