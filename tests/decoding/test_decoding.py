"""Decoding: valid events become batches; every malformed record is counted by reason, never raised."""

from __future__ import annotations

import json
import math

import numpy as np
import orjson
import pytest

from monitor.decoding.decoder import REASONS, Decoder
from monitor.decoding.settings import LimitSettings


def event(model: str = "m", dim: int = 4, rid: str = "a", **extra: object) -> bytes:
    vec = extra.pop("vector", [0.5] * dim)
    return orjson.dumps({"id": rid, "model": model, "vector": vec, **extra})


EVENT_WITH_TS = b'{"id": "t", "model": "m", "vector": [0.5, 0.5, 0.5, 0.5], "ts": %s}'


def with_ts(raw: str, template: bytes = EVENT_WITH_TS) -> bytes:
    """An event whose ``ts`` is the raw JSON text ``raw`` (orjson writes no NaN, Infinity or 400-digit integers)."""
    return template % raw.encode()


HUGE = "1" + "0" * 400  # a poison pill: float() of it raises OverflowError
# 2**1024 - 2**970 is where an integer's float() rounds to infinity (OverflowError)
NOT_FINITE_TS = [HUGE, "-" + HUGE, "NaN", "Infinity", "-Infinity", "1e999", "-1e400", str(2**1024 - 2**970)]


def decode(*values: bytes, decoder: Decoder | None = None, headers: tuple = ()) -> tuple[Decoder, object]:
    decoder = decoder or Decoder(LimitSettings())
    return decoder, decoder.decode_embeddings([(v, headers) for v in values])


def reasons(result) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out: dict[str, int] = {}
    for (_stream, reason), count in result.rejected.items():
        out[reason] = out.get(reason, 0) + count
    return out


def test_json_events_of_one_model_become_one_batch() -> None:
    _, result = decode(
        event(rid="a", vector=[1, 0, 0, 0], ts=1763700000.5, slice="tail", stream="docs"),
        event(rid="b", vector=[0, 1.5, 0, 0], stream="docs", pair_id="p1"),
        event(rid="c", vector=[0, 0, 1, 0]),
    )
    assert not result.rejected
    by_key = {(b.model, b.stream): b for b in result.batches}
    docs = by_key[("m", "docs")]
    np.testing.assert_array_equal(docs.vectors, np.array([[1, 0, 0, 0], [0, 1.5, 0, 0]], dtype=np.float32))
    assert docs.vectors.dtype == np.float32 and docs.vectors.flags.c_contiguous
    assert docs.ids == ("a", "b")
    assert docs.timestamps is not None and docs.timestamps[0] == 1763700000.5 and math.isnan(docs.timestamps[1])
    assert docs.slices == ("tail", None)
    assert docs.pair_ids == (None, "p1")
    assert by_key[("m", "default")].ids == ("c",)


def test_json_array_of_events_in_one_message() -> None:
    payload = orjson.dumps([{"id": i, "model": "m", "vector": [i + 1.0, 1.0]} for i in range(5)])
    _, result = decode(payload)
    assert [b.size for b in result.batches] == [5] and result.batches[0].ids == tuple(str(i) for i in range(5))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "bad_json"),
        (b"\xff\xfe\x00garbage", "bad_json"),
        (b"[1]", "not_object"),
        (b'"a string"', "not_object"),
        (orjson.dumps({"id": "a", "model": "m"}), "missing_field"),
        (orjson.dumps({"model": "m", "vector": [1.0]}), "missing_field"),
        (event(model="bad model name!"), "bad_label"),
        (event(model="x" * 65), "bad_label"),
        (event(model="m1\n"), "bad_label"),  # "$" would have let a trailing newline through
        (event(stream="a/b c"), "bad_label"),
        (event(slice={"nested": 1}), "bad_label"),
        (event(rid=["list"]), "bad_field"),
        (event(ts="yesterday"), "bad_field"),
        (event(ts=True), "bad_field"),
        (event(ts=[1.5]), "bad_field"),
        *[(with_ts(raw), "bad_timestamp") for raw in NOT_FINITE_TS],
        (event(vector="0.1,0.2"), "bad_vector"),
        (event(vector=["0.1", "0.2", "0.3", "0.4"]), "bad_vector"),
        (event(vector=[[0.1, 0.2], [0.3, 0.4]]), "bad_vector"),
        (event(vector=[0.1, None, 0.3, 0.4]), "bad_vector"),
        (event(vector=[]), "empty_vector"),
        (event(vector=[0.0] * 4), "zero_vector"),
        (json.dumps({"id": "a", "model": "m", "vector": [0.1, float("nan"), 0.2, 0.3]}).encode(), "non_finite"),
        (json.dumps({"id": "a", "model": "m", "vector": [float("inf"), 0.1, 0.2, 0.3]}).encode(), "non_finite"),
        (event(vector=[1e39, 1.0, 1.0, 1.0]), "non_finite"),  # overflows float32
        (event(vector=[0.1] * 9000), "dim_too_large"),
        (b"[" * 100_000 + b"]" * 100_000, "bad_json"),  # deeply nested
    ],
)
def test_each_malformed_record_is_counted_by_reason(value: bytes, reason: str) -> None:
    assert reason in REASONS
    _, result = decode(value, event(rid="ok"))
    assert reasons(result) == {reason: 1}
    # the valid record next to it still goes through
    assert sum(b.size for b in result.batches) == 1


@pytest.mark.parametrize(("raw", "kept"), [("-5", -5.0), ("0", 0.0), ("1.7976931348623157e308", 1.7976931348623157e308),
                                           ("9007199254740993", 9007199254740992.0), ("1e-400", 0.0),
                                           (str(2**1024 - 2**970 - 1), 1.7976931348623157e308)])  # fmt: skip
def test_any_finite_timestamp_is_kept_as_given(raw: str, kept: float) -> None:
    _, result = decode(with_ts(raw))
    assert not result.rejected and result.batches[0].timestamps is not None
    assert result.batches[0].timestamps.tolist() == [kept]


def test_every_reason_is_documented_in_the_usage_manual() -> None:
    from tests.support.paths import REPO

    text = (REPO / "docs" / "usage.md").read_text()
    section = text[text.index("### Malformed input") :]
    section = section[: section.index("\n#")]
    assert all(f"`{reason}`" in section for reason in REASONS), [r for r in REASONS if f"`{r}`" not in section]


def test_oversize_message_is_rejected_before_parsing() -> None:
    decoder = Decoder(LimitSettings(max_message_bytes=1024))
    _, result = decode(event(vector=[0.1] * 1000), decoder=decoder)
    assert reasons(result) == {"oversize": 1} and not result.batches


def test_dimension_is_fixed_per_model_by_first_record_or_declaration() -> None:
    decoder, result = decode(event(dim=4), event(dim=3, rid="b"), event(dim=4, model="other", rid="c"))
    assert reasons(result) == {"dim_mismatch": 1}
    assert decoder.dims == {"m": 4, "other": 4}
    _, later = decode(event(dim=5), decoder=decoder)
    assert reasons(later) == {"dim_mismatch": 1}
    declared = Decoder(LimitSettings(), declared_dims={"m": 8})
    _, result = decode(event(dim=4), decoder=declared)
    assert reasons(result) == {"dim_mismatch": 1}


def test_unknown_fields_are_ignored() -> None:
    _, result = decode(event(extra_field={"deep": [1, 2]}, another="x"))
    assert not result.rejected and result.batches[0].size == 1


def binary(rows: np.ndarray, model: str = "bin", stream: str | None = "docs", dim: int | None = None) -> tuple:
    headers = [("model", model.encode()), ("dim", str(dim if dim is not None else rows.shape[1]).encode())]
    if stream:
        headers.append(("stream", stream.encode()))
    return rows.astype("<f4").tobytes(), tuple(headers)


def test_binary_batch_fast_path() -> None:
    rows = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    value, headers = binary(rows)
    result = Decoder(LimitSettings()).decode_embeddings([(value, headers)])
    assert not result.rejected
    (batch,) = result.batches
    assert (batch.model, batch.stream) == ("bin", "docs") and batch.ids is None
    np.testing.assert_array_equal(batch.vectors, rows)


def test_binary_batch_rejects_only_bad_rows() -> None:
    rows = np.ones((10, 4), dtype=np.float32)
    rows[2, 1] = np.nan
    rows[5] = 0.0
    rows[7, 3] = np.inf
    result = Decoder(LimitSettings()).decode_embeddings([binary(rows)])
    assert reasons(result) == {"non_finite": 2, "zero_vector": 1}
    assert result.batches[0].size == 7


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"\x00" * 16, (("dim", b"4"),), "bad_header"),  # no model
        (b"\x00" * 16, (("model", b"m"), ("dim", b"four")), "bad_header"),
        (b"\x00" * 16, (("model", b"m"), ("dim", b"0")), "bad_header"),
        (b"\x00" * 15, (("model", b"m"), ("dim", b"4")), "bad_binary"),
        (b"", (("model", b"m"), ("dim", b"4")), "bad_binary"),
        (b"\x00" * 16, (("model", b"m m"), ("dim", b"4")), "bad_label"),
        (b"\x00" * 16, (("model", b"m"), ("dim", b"99999")), "dim_too_large"),
    ],
)
def test_binary_batch_header_problems(value: bytes, headers: tuple, reason: str) -> None:
    result = Decoder(LimitSettings()).decode_embeddings([(value, headers)])
    assert reasons(result) == {reason: 1} and not result.batches


def test_label_budget_is_enforced_per_record() -> None:
    admitted: set[str] = set()

    def admit(model: str, stream: str) -> bool:
        if model in admitted or len(admitted) < 2:
            admitted.add(model)
            return True
        return False

    decoder = Decoder(LimitSettings(), admit=admit)
    values = [event(model=f"m{i}", rid=str(i)) for i in range(5)]
    result = decoder.decode_embeddings([(v, ()) for v in values])
    assert reasons(result) == {"label_limit": 3}
    assert sorted(b.model for b in result.batches) == ["m0", "m1"]


def test_interactions() -> None:
    decoder = Decoder(LimitSettings(), declared_dims={"m": 3})
    good = orjson.dumps(
        {
            "query_id": "q1",
            "model": "m",
            "query_vector": [0.1, 0.2, 0.3],
            "results": ["d1", "d2", 3],
            "clicks": ["d2"],
            "relevance": {"d1": 2, "d2": 0},
            "slice": "head",
            "ts": 1.5,
            "unknown": True,
        }
    )
    bad = [
        b"nope",
        orjson.dumps({"query_id": "q"}),
        orjson.dumps({"model": "m", "results": "d1"}),
        orjson.dumps({"model": "m", "relevance": {"d1": "high"}}),
        orjson.dumps({"model": "m", "query_vector": [0.1, 0.2]}),
        orjson.dumps({"model": "m", "results": ["x"] * 5000}),
    ]
    result = decoder.decode_interactions([(good, ())] + [(b, ()) for b in bad])
    assert len(result.interactions) == 1
    ev = result.interactions[0]
    assert ev.query_id == "q1" and ev.results == ("d1", "d2", "3") and ev.clicks == ("d2",)
    assert ev.relevance == {"d1": 2.0, "d2": 0.0} and ev.slice == "head" and ev.ts == 1.5
    np.testing.assert_allclose(ev.query_vector, [0.1, 0.2, 0.3], rtol=1e-6)
    assert reasons(result) == {"bad_json": 1, "missing_field": 1, "bad_field": 3, "dim_mismatch": 1}
    assert all(stream == "interactions" for stream, _ in result.rejected)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        *[(with_ts(raw, b'{"model": "m", "results": ["a"], "ts": %s}'), "bad_timestamp") for raw in NOT_FINITE_TS],
        (orjson.dumps({"model": "m", "ts": "now"}), "bad_field"),
        (orjson.dumps({"model": "m", "ts": False}), "bad_field"),
        (b'{"model": "m", "relevance": {"a": %s}}' % HUGE.encode(), "bad_field"),  # float() would overflow
        (b'{"model": "m", "relevance": {"a": NaN}}', "bad_field"),
        (b'{"model": "m", "query_vector": [%s, 1, 1]}' % HUGE.encode(), "bad_vector"),
        (b'{"model": "m", "query_vector": [1e999, 1, 1]}', "non_finite"),
    ],
)
def test_each_malformed_interaction_is_counted_by_reason(value: bytes, reason: str) -> None:
    decoder = Decoder(LimitSettings(), declared_dims={"m": 3})
    ok = orjson.dumps({"model": "m", "query_id": 7, "results": ["a"], "ts": 1.5})
    result = decoder.decode_interactions([(value, ()), (ok, ())])
    assert reasons(result) == {reason: 1}
    assert [(e.query_id, e.ts) for e in result.interactions] == [("7", 1.5)]


# -- the simdjson fast path ----------------------------------------------------------------------

_EDGE_EVENTS = [
    b'{"id": "a", "model": "m", "vector": [1, 2.5, -3e-7, 0]}',
    b'{"id": "b", "model": "m", "vector": [[1], [2], [3], [4]]}',  # simdjson would flatten this
    b'{"id": "c", "model": "m", "vector": [1, 2, 3, 4], "vector": [5, 6, 7, "x"]}',  # duplicate key
    b'{"id": "d[", "model": "m", "vector": [1, 2, 3, 4]}',  # a bracket in a string
    b'{"id": "e", "model": "m", "vector": [9007199254740993, 1, 2, 3]}',  # beyond 2**53
    b'{"id": "f", "model": "m", "vector": [18446744073709551615, 1, 2, 3]}',  # uint64
    b'{"id": "g", "model": "m", "vector": [1e39, 1, 2, 3]}',  # float32 overflow
    b'{"id": "h", "model": "m", "vector": [true, 1, 2, 3]}',
    b'{"id": "i", "model": "m", "vector": [1, 2, 3, 4], "tags": ["x"]}',
    b'[{"id": "j", "model": "m", "vector": [1, 2, 3, 4]}, {"id": "k", "model": "m", "vector": [0, 0, 0, 0]}]',
    b'[{"id": "l", "model": "m", "vector": [1, 2, 3, 4]}, 7]',
    b'{"id": "m", "model": "m", "vector": [], "stream": "s2"}',
    b'{"id": {"x": 1}, "model": "m", "vector": [1, 2, 3, 4]}',
    b'{"id": "n", "model": "m", "vector": [1, 2, 3, 4], "ts": 1.5, "slice": "head", "pair_id": 3}',
    # fields in another order, unknown keys between them (the fast path looks up only the message's keys)
    b'{"pair_id": "p", "x": 1, "vector": [4, 3, 2, 1], "note": "n", "slice": "tail", "model": "m", "id": "o"}',
    b'{"id": "p", "model": "m", "vector": [-9007199254740993, 1, 2, 3]}',  # below -2**53
]


def test_the_fast_path_decodes_exactly_as_the_general_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.decoding import json_decoding

    messages = [(m, ()) for m in _EDGE_EVENTS * 3]
    fast = Decoder(LimitSettings()).decode_embeddings(messages)
    monkeypatch.setattr(json_decoding, "fast_events", lambda value: None)
    general = Decoder(LimitSettings()).decode_embeddings(messages)
    assert fast.rejected == general.rejected
    assert [(b.model, b.stream, b.ids, b.timestamps is None, b.slices, b.pair_ids) for b in fast.batches] == [
        (b.model, b.stream, b.ids, b.timestamps is None, b.slices, b.pair_ids) for b in general.batches
    ]
    for a, b in zip(fast.batches, general.batches, strict=True):
        np.testing.assert_array_equal(a.vectors, b.vectors)


def test_the_fast_path_takes_plain_events_and_leaves_the_rest() -> None:
    from monitor.decoding.json_events import fast_events

    plain = fast_events(_EDGE_EVENTS[0])
    assert isinstance(plain, dict) and plain["vector"].dtype == np.float64
    assert isinstance(fast_events(_EDGE_EVENTS[9]), list)
    assert fast_events(_EDGE_EVENTS[14]) == {
        "pair_id": "p", "vector": pytest.approx(np.array([4.0, 3, 2, 1])), "slice": "tail", "model": "m", "id": "o"
    }
    for general_only in (1, 2, 3, 4, 7, 8, 10, 12, 15):
        assert fast_events(_EDGE_EVENTS[general_only]) is None, _EDGE_EVENTS[general_only]
    assert fast_events(b"{not json") is None and fast_events(b'{"vector": [NaN]}') is None
