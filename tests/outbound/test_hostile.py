"""Every outbound caller against hostile servers on loopback (tests/support/hostile_http.py): the
serving probe's HTTP backend, the golden probe's HTTP retriever and the Qdrant-shaped connector.

Each finding is asserted through the caller, with the reason it counts: a drip ends at the total
deadline (``timeout``), a bloated answer stops at what was asked (``oversized``) without the memory
its bytes would cost parsed, a redirect is not followed (``redirect``) and the other host never
sees a request, let alone a key.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monitor import outbound
from monitor.deadline import Deadline
from monitor.index.connectors.base import ConnectorError
from monitor.index.connectors.qdrant import QdrantConnector
from monitor.index.settings import QdrantSettings
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.http_retriever import HttpRetriever
from monitor.retrieval.settings import HttpRetrieverSettings
from monitor.serving.backends import HttpBackend
from monitor.serving.responses import ServingError
from monitor.serving.settings import EndpointSettings
from tests.support import hostile_http as hostile

ROOT = Path(__file__).resolve().parents[2]
OK_EMBEDDINGS = json.dumps({"data": [{"index": 0, "embedding": [1.0, 2.0, 3.0, 4.0]}]}).encode()


def serving_call(url: str, timeout: float = 5.0, key: str | None = None) -> Callable[[], Any]:
    endpoint = EndpointSettings(model="m", url=url + "/v1/embeddings", dim=4)
    backend = HttpBackend(endpoint)
    backend._key = key
    return lambda: backend.embed(["a"], timeout)


def retriever_call(url: str, timeout: float = 5.0) -> Callable[[], Any]:
    retriever = HttpRetriever(HttpRetrieverSettings(
        url=url + "/search", ids_path="hits[*].id", request_template={"q": "{{text}}", "k": "{{k}}"},
        request_timeout_seconds=timeout))
    return lambda: retriever.search("q1", "text", None, 10, Deadline.after(60))


def qdrant_call(url: str, timeout: float = 5.0) -> Callable[[], Any]:
    connector = QdrantConnector(QdrantSettings(url=url, collection="docs", timeout_seconds=timeout))
    connector.dim = 4
    return lambda: connector.sample(2)


CALLERS = {"serving": serving_call, "retriever": retriever_call, "qdrant": qdrant_call}


def reason_of(name: str, call: Callable[[], Any]) -> str:
    """The reason the caller counts for a call that fails (the retriever counts in ``errors``)."""
    if name == "retriever":
        retriever: HttpRetriever = call.__closure__[0].cell_contents  # type: ignore[index]
        before = sum(retriever.errors.values())
        with pytest.raises(ProbeError):
            call()
        (reason,) = [r for r, n in retriever.errors.items() if n]
        assert sum(retriever.errors.values()) == before + 1
        return reason
    with pytest.raises((ServingError, ConnectorError)) as caught:
        call()
    return caught.value.reason  # type: ignore[union-attr]


def timed(call: Callable[[], Any], bound: float) -> tuple[float, BaseException | None, bool]:
    """Run ``call`` in a worker thread; (seconds it took, what it raised, whether it came back within ``bound``)."""
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(bound)
    return time.monotonic() - start, outcome[0] if outcome else None, not worker.is_alive()


# -- 1. a drip ends at the deadline ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CALLERS))
def test_a_dripping_answer_ends_at_the_total_deadline(name: str) -> None:
    """A byte every 0.4 s under a 1 s timeout: each read is in time, the whole call is not. The
    standard library's per-read timeout would read the 40 bytes for 16 s."""
    with hostile.serving(hostile.drip(b"x" * 40, every=0.4)) as server:
        call = CALLERS[name](server.url, timeout=1.0)
        took, raised, back = timed(call, bound=8.0)
    assert back, f"{name}: the call was still running after 8 s"
    assert took < 1.0 + 1.5, took  # the deadline, and slack for a busy machine
    assert raised is not None
    assert getattr(raised, "reason", None) == "timeout" or "timeout" in str(raised)


@pytest.mark.parametrize("name", sorted(CALLERS))
def test_slowloris_headers_end_at_the_total_deadline(name: str) -> None:
    with hostile.serving(hostile.slowloris_headers(every=0.2)) as server:
        took, raised, back = timed(CALLERS[name](server.url, timeout=1.0), bound=8.0)
    assert back and took < 2.5, took
    assert raised is not None


def test_the_retriever_counts_a_drip_as_timeout() -> None:
    with hostile.serving(hostile.drip(b"x" * 40, every=0.4)) as server:
        assert reason_of("retriever", retriever_call(server.url, timeout=1.0)) == "timeout"


# -- 2. answers capped by what was asked ----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CALLERS))
@pytest.mark.parametrize("behaviour", [
    lambda: hostile.bloat(8 << 20), lambda: hostile.bloat(8 << 20, declare=False),
    lambda: hostile.endless_chunked(), lambda: hostile.huge_headers(),
], ids=["bloat", "bloat-close-delimited", "endless-chunked", "huge-headers"])
def test_a_bloated_answer_is_oversized(name: str, behaviour: Callable[[], hostile.Behaviour]) -> None:
    with hostile.serving(behaviour()) as server:
        reason = reason_of(name, CALLERS[name](server.url))
    assert reason == "oversized"


PEAK_RSS_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    from monitor.serving.backends import HttpBackend
    from monitor.serving.responses import ServingError
    from monitor.serving.settings import EndpointSettings
    backend = HttpBackend(EndpointSettings(model="m", url=sys.argv[1] + "/v1/embeddings", dim=8))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        backend.embed(["a", "b"], 60.0)
        reason = None
    except ServingError as exc:
        reason = exc.reason
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_kib": before, "after_kib": after, "reason": reason}))
""")


@pytest.mark.slow
def test_a_60_mib_answer_costs_under_50_mb_of_peak_rss() -> None:
    """The finding: 60 MiB of ``[],`` from the embedding endpoint took a process from 47 to 1,711 MiB
    peak RSS in one call. Two texts of dimension 8 can need a few KiB: the call stops there."""
    with hostile.serving(hostile.bloat(60 << 20)) as server:
        done = subprocess.run([sys.executable, "-c", PEAK_RSS_SCRIPT, server.url], capture_output=True,
                              text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    print("peak RSS before/after the call (KiB):", measured)
    assert measured["reason"] == "oversized"
    assert (measured["after_kib"] - measured["before_kib"]) * 1024 < 50e6, measured


def test_the_json_budget_stops_what_the_bytes_cap_lets_by() -> None:
    """An answer inside the byte cap that is all values (``[],`` costs about 26 times its size parsed)."""
    raw = b"[" + b"[]," * 10_000 + b"[]]"
    with pytest.raises(outbound.OutboundError) as caught:
        outbound.parse_json(raw, 5000)
    assert caught.value.reason == "oversized"
    assert outbound.parse_json(b'{"a": "[[[,,,{{{", "b": [1, 2]}', 4) == {"a": "[[[,,,{{{", "b": [1, 2]}


# -- 3. no redirects; credentials stay home -------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("name", sorted(CALLERS))
def test_a_redirect_is_not_followed_and_the_other_host_hears_nothing(name: str, status: int) -> None:
    with hostile.serving(hostile.answer(OK_EMBEDDINGS)) as attacker:
        with hostile.serving(hostile.redirect(attacker.url + "/steal", status)) as server:
            if name == "serving":
                call = serving_call(server.url, key="sk-secret")
            elif name == "qdrant":
                connector = QdrantConnector(QdrantSettings(url=server.url, collection="docs"))
                connector._key = "qdrant-secret"
                connector.dim = 4
                call = lambda: connector.sample(2)  # noqa: E731
            else:
                call = CALLERS[name](server.url)
            reason = reason_of(name, call)
            assert len(server.requests) == 1
            if name == "serving":
                assert server.requests[0].header("Authorization") == "Bearer sk-secret"
            if name == "qdrant":
                assert server.requests[0].header("api-key") == "qdrant-secret"
    assert reason == "redirect"
    assert attacker.requests == []


# -- 5. lies -----------------------------------------------------------------------------------


LIES = {
    "long-content-length": (lambda: hostile.lie_length(b'{"data": []}', 1000), {"bad_response", "bad_result",
                                                                                  "protocol"}),
    "close-mid-body": (lambda: hostile.close_mid_body(OK_EMBEDDINGS), {"bad_response", "bad_result", "protocol"}),
    "invalid-json": (lambda: hostile.answer(b'{"data": [1, 2'), {"not_json", "bad_result"}),
    "wrong-shape": (lambda: hostile.answer(b'{"result": {"points": 3}, "data": 3, "hits": 3}'),
                    {"bad_response", "bad_result"}),
    "nan": (lambda: hostile.answer(b'{"data": [{"embedding": [NaN, 1, 2, 3]}], "hits": [{"id": NaN}], '
                                   b'"result": {"points": [{"id": 1, "vector": [NaN, 1, 2, 3]}]}}'),
            {"bad_result", "bad_response", None}),
    "garbage-status-line": (lambda: hostile.raw(b"SSH-2.0-OpenSSH\r\n\r\n"), {"bad_response", "bad_result",
                                                                             "protocol"}),
}


@pytest.mark.parametrize("name", sorted(CALLERS))
@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lying_answer_is_counted_by_reason(name: str, lie: str) -> None:
    behaviour, expected = LIES[lie]
    with hostile.serving(behaviour()) as server:
        call = CALLERS[name](server.url)
        try:
            result = call()
        except (ServingError, ConnectorError) as exc:
            assert exc.reason in expected, exc.reason
        except ProbeError:
            retriever: HttpRetriever = call.__closure__[0].cell_contents  # type: ignore[attr-defined]
            assert set(retriever.errors) <= expected | {"http_error"}, retriever.errors
        else:  # only a NaN row may pass: served as an unusable row, counted by the serving probe
            assert None in expected, result
            if name == "serving":
                rows, invalid = result
                assert rows == [None] and invalid == {"non_finite": 1}
