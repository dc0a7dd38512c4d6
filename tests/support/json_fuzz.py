"""Raw JSON text for every field of both event types, as the field fuzz draws it
(tests/decoding/test_fuzz_fields.py, whose docstring says why the values are written as text), shared
with the fuzz of unreadable Kafka records (tests/sources/test_unreadable_records.py)."""

from __future__ import annotations

import json
from typing import TypeVar

from hypothesis import strategies as st

from monitor.decoding.labels import LABEL_VALUE_RE
from monitor.decoding.settings import LimitSettings

LIMITS = LimitSettings(max_message_bytes=256 * 1024, max_dimension=64, max_rows_per_message=50)
DIMS = {"m1": 4, "m2": 3}
T = TypeVar("T")

# -- raw JSON text --------------------------------------------------------------------------------


def weighted(*options: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """One of ``options``, each ``weight`` times as likely (the first shrinks best: put the plain case first)."""
    total = sum(weight for weight, _ in options)

    def pick(n: int) -> st.SearchStrategy[T]:
        for weight, strategy in options:
            if n < weight:
                return strategy
            n -= weight
        raise AssertionError(n)

    return st.integers(0, total - 1).flatmap(pick)


def _digits(n: int, sign: str) -> str:
    return sign + "1" + "0" * n


def _array(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


def _object(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


def _nested(depth: int, inner: str) -> str:
    return "[" * depth + inner + "]" * depth


EDGE_NUMBERS = [
    "0", "-0", "0.0", "-0.0", "1", "-1", "1.5", "1763700000.5", "9007199254740993", "-9007199254740993",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "1.7976931348623157e308", "-1.7976931348623157e308", "1.7976931348623159e308",
    "2.2250738585072014e-308", "5e-324", "4.9e-324", "1e-400", "1e308", "1e309", "-1e309", "1e999", "-1e999",
    "3.4028235e38", "3.5e38", "1E+2", "NaN", "Infinity", "-Infinity", str(2**1024), str(2**1024 - 2**970),
    str(2**1024 - 2**970 - 1), "1" + "0" * 4300, "1" + "0" * 5000,  # past Python's int parsing limit: not JSON to it
]  # fmt: skip
numbers = st.one_of(
    st.sampled_from(EDGE_NUMBERS),
    st.builds(_digits, st.integers(15, 420), st.sampled_from(["", "-"])),  # beyond int64 and float64
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
)
strings = st.one_of(
    st.text(max_size=20).map(json.dumps),  # ASCII escapes, lone surrogates included
    st.text(max_size=20).map(lambda t: json.dumps(t, ensure_ascii=False)),  # raw UTF-8 (or invalid bytes)
    st.sampled_from(['"m1"', '"m2"', '"docs"', '"é"', '"𝔪"', '"\\u0000"', '"a\\nb"', '"' + "x" * 65 + '"',
                     '"\\ud800"', '"m1\\n"']),  # fmt: skip
)
scalars = st.one_of(numbers, strings, st.sampled_from(["true", "false", "null"]))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5).map(_array),
        st.lists(st.tuples(st.text(max_size=6), inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)
# nesting around the fallback parser's 512, orjson's 1024 and the stdlib's recursion limit
deep = st.builds(_nested, st.sampled_from([2, 60, 511, 513, 1023, 1025, 3000]), scalars)
anything = weighted((6, values), (1, deep))

not_label_texts = st.text(max_size=70).filter(lambda t: LABEL_VALUE_RE.match(t) is None).map(json.dumps)
valid_labels = st.sampled_from(['"docs"', '"s-1"', '"head"', '"default"', '"a.b:c/d@e+f_g"', '"' + "x" * 64 + '"'])
labels = weighted((6, valid_labels), (1, not_label_texts), (1, anything))
models = weighted(
    (12, st.sampled_from(['"m1"', '"m2"'])),
    (1, not_label_texts),
    (1, anything.filter(lambda raw: not raw.lstrip().startswith('"'))),  # no string: the only valid labels are m1, m2
)
plain_floats = st.floats(-10, 10, allow_nan=False).map(repr)
vectors = weighted(
    (8, st.lists(plain_floats, min_size=3, max_size=4).map(_array)),  # mostly valid (m1 has 4 components, m2 3)
    (2, st.lists(st.one_of(plain_floats, numbers), min_size=3, max_size=4).map(_array)),  # some edge components
    (1, st.lists(numbers, min_size=3, max_size=4).map(_array)),
    (1, st.lists(scalars, max_size=5).map(_array)),
    (1, st.sampled_from(["[]", "[0, 0, 0, 0]", "[0, 0, 0]", "[[1, 2], [3, 4]]", '"0.1,0.2"', "[NaN, 1, 1]"])),
    (1, anything),
)
ids = weighted((6, strings), (2, st.integers().map(str)), (1, numbers), (1, anything))
timestamps = weighted((4, st.floats(0, 2e9, allow_nan=False).map(repr)), (4, numbers), (1, anything))
id_lists = weighted((6, st.lists(st.one_of(strings, numbers), max_size=4).map(_array)), (1, anything))
grades = st.lists(st.tuples(st.text(max_size=6), weighted((4, numbers), (1, scalars))), max_size=3).map(_object)

EMBEDDING_FIELDS: dict[str, st.SearchStrategy[str]] = {
    "id": ids, "model": models, "vector": vectors, "ts": timestamps, "stream": labels,
    "slice": labels, "pair_id": ids, "extra": anything,
}  # fmt: skip
INTERACTION_FIELDS: dict[str, st.SearchStrategy[str]] = {
    "query_id": ids, "model": models, "query_vector": vectors, "results": id_lists, "clicks": id_lists,
    "relevance": weighted((4, grades), (1, anything)), "slice": labels, "ts": timestamps, "extra": anything,
}  # fmt: skip


@st.composite
def events(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[str]], required: tuple[str, ...]) -> str:
    """One event as JSON text: the required fields usually present, the others sometimes, in any
    order, now and then a key twice (the general parser keeps the last, the fast path refuses)."""
    pairs = []
    for name, strategy in fields.items():
        if draw(st.integers(0, 19)) < (19 if name in required else 8):
            pairs.append((name, draw(strategy)))
    pairs = draw(st.permutations(pairs))
    if draw(st.integers(0, 19)) == 0:
        name = draw(st.sampled_from(list(fields)))
        pairs.append((name, draw(fields[name])))
    return _object(pairs)


def messages(kind: str) -> st.SearchStrategy[bytes]:
    if kind == "embeddings":
        event = events(EMBEDDING_FIELDS, ("id", "model", "vector"))
    else:
        event = events(INTERACTION_FIELDS, ("model",))
    text = weighted(
        (8, event),
        (1, st.lists(event, max_size=3).map(_array)),  # several events in one message
        (1, anything),  # not an event at all
    )
    raw = text.map(lambda t: t.encode("utf-8", "surrogatepass"))
    return weighted((12, raw), (1, st.binary(max_size=40)))  # or no text at all
