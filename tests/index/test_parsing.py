"""Fuzzing the boundaries where outside values enter the index probes.

* what an engine returns (SQL rows, LanceDB columns, Qdrant JSON): the ``parse_*`` functions build
  a checked answer or raise ``ConnectorError`` (counted as ``bad_result``/``dimension``), never
  anything else;
* an interaction event's ``filter``: accepted as sorted pairs, or the event is rejected as
  ``bad_field``, never a crash; the decoder goes on with the next message;
* a Qdrant-shaped endpoint answering arbitrary bytes: the component counts a reason and the
  scrape still answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.config import LimitSettings, Settings
from monitor.decoding.decoder import Decoder
from monitor.index.component import IndexComponent
from monitor.index.connectors.base import (
    REASONS,
    ConnectorError,
    parse_rows,
    parse_scope_counts,
    parse_vector,
    parse_vector_rows,
)
from monitor.index.connectors.qdrant import parse_facet, parse_points, parse_search
from tests.support import vectorstores as vs
from tests.support.probes import collect, probe_context
from tests.support.qdrant_shaped import serving

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30), st.binary(max_size=10),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                      max_leaves=12)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**60), max_value=2**60),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=15)
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(rows=st.lists(values, max_size=12), k=st.integers(1, 10))
def test_search_rows_parse_or_raise_a_reason(rows: list[Any], k: int) -> None:
    try:
        answer = parse_rows(rows, k)
    except ConnectorError as exc:
        assert exc.reason in REASONS
        return
    assert len(answer.ids) <= k and len(set(answer.ids)) == len(answer.ids)
    assert np.all(np.isfinite(answer.distances)) and np.all(np.diff(answer.distances) >= 0)


@FUZZ
@given(rows=st.lists(values, max_size=12))
def test_scope_counts_parse_or_raise_a_reason(rows: list[Any]) -> None:
    try:
        counts = parse_scope_counts(rows)
    except ConnectorError as exc:
        assert exc.reason in REASONS
        return
    assert all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in counts.items())


@FUZZ
@given(rows=st.lists(values, max_size=8), dim=st.one_of(st.none(), st.integers(1, 4)))
def test_vector_rows_parse_or_raise_a_reason(rows: list[Any], dim: int | None) -> None:
    try:
        parsed = parse_vector_rows(rows, dim, 8)
    except ConnectorError as exc:
        assert exc.reason in REASONS
        return
    sizes = {v.size for _, v in parsed}
    assert len(sizes) <= 1 and (dim is None or sizes <= {dim})


@FUZZ
@given(text=st.text(max_size=40))
def test_pgvector_text_vectors(text: str) -> None:
    try:
        v = parse_vector(text, None)
    except ConnectorError as exc:
        assert exc.reason in REASONS
        return
    assert v.ndim == 1 and v.size >= 1


def test_pgvector_text_vector_round_trip() -> None:
    assert parse_vector("[1,2.5,-3e-2]", 3).tolist() == [1.0, 2.5, -0.03]


@FUZZ
@given(doc=values, k=st.integers(1, 5))
def test_qdrant_answers_parse_or_raise_a_reason(doc: Any, k: int) -> None:
    for parse in (lambda: parse_search(doc, "cosine", k), lambda: parse_points(doc, None, k),
                  lambda: parse_points(doc, 3, k, nested=True), lambda: parse_facet(doc)):
        try:
            parse()
        except ConnectorError as exc:
            assert exc.reason in REASONS


@FUZZ
@given(filter_=values)
def test_an_events_filter_is_taken_or_the_event_rejected_as_bad_field(filter_: Any) -> None:
    decoder = Decoder(LimitSettings(), declared_dims={"m": 2})
    try:
        event = orjson.dumps({"model": "m", "query_vector": [0.1, 0.2], "filter": filter_})
    except (TypeError, orjson.JSONEncodeError):
        return  # not JSON-representable (bytes, a huge integer): cannot arrive as an event
    ok = orjson.dumps({"model": "m", "query_vector": [0.3, 0.4], "filter": {"tenant": "acme"}})
    result = decoder.decode_interactions([(event, ()), (ok, ())])
    assert result.interactions[-1].filter == (("tenant", "acme"),)
    rejected = [reason for _, reason in result.rejected]
    if len(result.interactions) == 2:
        got = result.interactions[0].filter
        assert list(got) == sorted(got) and all(isinstance(k, str) for k, _ in got)
        assert all(not isinstance(v, float) or math.isfinite(v) for _, v in got)
    else:
        assert rejected == ["bad_field"]


@pytest.fixture(scope="module")
def garbage_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    table = vs.load_lance(tmp_path_factory.mktemp("lance"), "docs", [f"d{i}" for i in range(50)], vs.unit_rows(50, 4))
    with serving(table) as server:
        yield server


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(body=st.one_of(st.binary(max_size=200), json_values.map(lambda v: orjson.dumps({"result": v}))))
def test_a_garbage_answering_engine_is_counted_and_the_scrape_answers(
    garbage_server: Any, tmp_path: Path, body: bytes
) -> None:
    server = garbage_server
    server.body = body
    settings_ = Settings(state_dir=tmp_path, index={"probes": [{
        "name": "q", "model": "m", "engine": "qdrant", "budget": {"exact_searches": 4},
        "qdrant": {"url": server.url, "collection": "docs", "timeout_seconds": 5}}]})
    component = IndexComponent(probe_context(settings_))
    probe = component.probes["q"]
    probe.buffer.add(_query(), component.context.clock())
    probe.sketch.add(["1"], np.ones((1, 4), np.float32), now=0.0)
    component.run_probe("q")
    runs = component.snapshot.runs
    assert runs[("q", "success")] + runs[("q", "failure")] == 1
    assert all(reason in REASONS for _, reason in component.snapshot.errors)
    assert collect(component)  # the scrape answers


def _query() -> Any:
    from monitor.index.sampling import ProbeQuery

    return ProbeQuery(np.ones(4, np.float32) / 2)
