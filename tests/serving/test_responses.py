"""Reading embedding responses (monitor/serving/responses.py): every malformed answer is a counted
reason, never an exception of another kind; fuzzed with hypothesis."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monitor.retrieval.probes.ids_path import parse_ids_path
from monitor.serving.responses import ERROR_REASONS, INVALID_REASONS, ServingError, check_rows, parse_embeddings


def openai(*rows: object) -> bytes:
    return json.dumps({"object": "list", "data": [{"index": i, "embedding": r} for i, r in enumerate(rows)]}).encode()


def test_a_well_formed_answer_gives_one_float64_row_per_input() -> None:
    rows, invalid = parse_embeddings(openai([1, 2, 3], [0.5, -1.0, 2.0]), count=2, dim=3)
    assert [r.tolist() for r in rows if r is not None] == [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    assert rows[0].dtype == np.float64 and not invalid


@pytest.mark.parametrize(("row", "reason"), [
    ([], "empty"), ([0.0, 0.0, 0.0], "zero"), ([1.0, float("nan"), 0.0], "non_finite"),
    ([1.0, float("inf"), 0.0], "non_finite"), ([1.7e308, 1.7e308, 1.7e308], "non_finite"),
    ([1.0, 2.0], "wrong_dimension"),
])
def test_an_unusable_row_is_counted_by_reason_and_the_others_kept(row: list[float], reason: str) -> None:
    body = json.dumps({"data": [{"embedding": [1.0, 2.0, 3.0]}, {"embedding": row}]}).encode()
    if reason == "wrong_dimension":  # two lengths in one answer are ragged; alone, a wrong dimension
        body = json.dumps({"data": [{"embedding": row}]}).encode()
        rows, invalid = parse_embeddings(body, count=1, dim=3)
        assert rows == [None] and invalid == {reason: 1}
        return
    rows, invalid = parse_embeddings(body, count=2, dim=3 if row else None)
    assert rows[1] is None and rows[0] is not None and invalid == {reason: 1}


@pytest.mark.parametrize(("body", "reason"), [
    (b"<html><body>502 Bad Gateway</body></html>", "html"),
    (b"{not json", "not_json"),
    (b'{"data": [{"embedding": [1, 2]}]}', "bad_response"),  # one vector for two inputs
    (b'{"error": {"message": "overloaded"}}', "bad_response"),
    (b'{"data": [{"embedding": [1, 2]}, {"embedding": [1, 2, 3]}]}', "ragged"),
    (b'{"data": [{"embedding": ["1", 2]}, {"embedding": [1, 2]}]}', "bad_response"),
    (b'{"data": [{"embedding": "AAAA"}, {"embedding": [1, 2]}]}', "bad_response"),
])
def test_an_unusable_answer_raises_its_reason(body: bytes, reason: str) -> None:
    with pytest.raises(ServingError) as caught:
        parse_embeddings(body, count=2, dim=None)
    assert caught.value.reason == reason


def test_openai_rows_are_put_in_index_order_and_a_template_path_is_followed() -> None:
    body = json.dumps({"data": [{"index": 1, "embedding": [0, 1]}, {"index": 0, "embedding": [1, 0]}]}).encode()
    rows, _ = parse_embeddings(body, count=2, dim=2)
    assert [r.tolist() for r in rows if r is not None] == [[1.0, 0.0], [0.0, 1.0]]
    custom = json.dumps({"result": {"vectors": [[3, 4], [5, 6]]}}).encode()
    rows, _ = parse_embeddings(custom, count=2, dim=2, steps=parse_ids_path("result.vectors[*]"))
    assert [r.tolist() for r in rows if r is not None] == [[3.0, 4.0], [5.0, 6.0]]


def test_an_encoders_matrix_gets_the_same_row_checks() -> None:
    rows, invalid = check_rows(np.array([[1.0, 0.0], [0.0, 0.0], [np.nan, 1.0]]), dim=2)
    assert rows[0] is not None and rows[1] is None and rows[2] is None
    assert invalid == {"zero": 1, "non_finite": 1}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=30,
)
vectors = st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.integers(-2**70, 2**70)),
                   max_size=6)


def _outcome(raw: bytes, count: int, dim: int | None) -> None:
    try:
        rows, invalid = parse_embeddings(raw, count=count, dim=dim)
    except ServingError as exc:
        assert exc.reason in ERROR_REASONS
        return
    assert len(rows) == count and set(invalid) <= set(INVALID_REASONS)
    assert sum(invalid.values()) == sum(r is None for r in rows)
    for row in rows:
        if row is not None:
            assert np.all(np.isfinite(row)) and np.any(row != 0) and math.isfinite(float(np.linalg.norm(row)))
            assert dim is None or row.shape == (dim,)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 3), st.none() | st.integers(1, 4))
def test_fuzz_any_bytes(raw: bytes, count: int, dim: int | None) -> None:
    _outcome(raw, count, dim)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(0, 3))
def test_fuzz_any_json_document(document: object, count: int) -> None:
    _outcome(json.dumps(document).encode(), count, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({"embedding": vectors}, optional={"index": json_values}), max_size=4),
       st.none() | st.integers(1, 6))
def test_fuzz_openai_shaped_answers(data: list[dict[str, object]], dim: int | None) -> None:
    _outcome(json.dumps({"data": data}).encode(), len(data), dim)
