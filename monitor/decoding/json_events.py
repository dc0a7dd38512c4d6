"""The fast path for JSON embedding events: simdjson parses, vectors come out as float64 arrays.

Parsing a 384-float event with orjson builds 384 Python floats that numpy then converts back,
about 50 µs of interpreter time per event that competes with kafka-python for the GIL. simdjson
parses in C and hands the vector over as one buffer (≈ 10 µs per event on the development machine).

The fast path only takes messages whose meaning it can reproduce exactly: an object (or an array
of objects) with unique keys, scalar fields, and a flat array of numbers as ``vector``. Anything
else (a parse error, NaN tokens, nested or mixed arrays, big integers, duplicate keys) returns
``None`` and the caller uses the general parser, which decides the rejection reason as before.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import simdjson

__all__ = ["fast_events"]

_FIELDS = frozenset(("id", "model", "vector", "ts", "stream", "slice", "pair_id"))
_EXACT_INTEGER = float(2**53)
"""Vectors with a component this large go the general way: an integer that large can round
differently through float64 than through numpy's integer conversion."""

_local = threading.local()


def fast_events(value: bytes) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The event (or list of events) in ``value`` as plain dicts whose ``vector`` is a float64
    array, or ``None`` when the message needs the general parser."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = simdjson.Parser()
    try:
        doc = parser.parse(value)
    except RuntimeError:  # a proxy of an earlier document is still alive (an exception held it)
        parser = _local.parser = simdjson.Parser()
        try:
            doc = parser.parse(value)
        except (ValueError, RuntimeError):
            return None
    except ValueError:
        return None
    try:
        if isinstance(doc, simdjson.Object):
            event = _plain_event(doc)
            # One '[' per vector and none elsewhere: no nested arrays anywhere (as_buffer would
            # flatten them), and no brackets in strings that could hide one.
            return event if event is not None and _brackets_exactly(value, 1) else None
        if isinstance(doc, simdjson.Array):
            events = []
            for item in doc:
                if not isinstance(item, simdjson.Object):
                    return None
                event = _plain_event(item)
                if event is None:
                    return None
                events.append(event)
            return events if _brackets_exactly(value, len(events) + 1) else None
        return None
    finally:
        del doc  # the parser refuses to parse again while a proxy of this document lives


def _plain_event(obj: Any) -> dict[str, Any] | None:
    keys = list(obj.keys())
    if len(keys) != len(set(keys)):
        return None  # duplicate keys: the general parser keeps the last one, simdjson the first
    event: dict[str, Any] = {}
    # Only the message's own keys are looked up: ``key in obj`` on a simdjson Object costs
    # ≈ 1.5 µs (it walks the object), so testing all seven field names cost ≈ 10 µs per event.
    for key in keys:
        if key not in _FIELDS:
            continue
        item = obj[key]
        if key == "vector":
            if not isinstance(item, simdjson.Array):
                return None
            try:
                vector = np.frombuffer(item.as_buffer(of_type="d"), dtype=np.float64)
            except TypeError:  # not all numbers (strings, booleans, nulls)
                return None
            if vector.size and (vector.max() >= _EXACT_INTEGER or vector.min() <= -_EXACT_INTEGER):
                return None
            event[key] = vector
        elif isinstance(item, (simdjson.Object, simdjson.Array)):
            return None
        else:
            event[key] = item
    return event


def _brackets_exactly(value: bytes, expected: int) -> bool:
    """Whether ``value`` holds exactly ``expected`` '[' bytes (``find`` is a memchr, 20x faster
    than ``bytes.count`` on a 7 kB event)."""
    position = -1
    for _ in range(expected):
        position = value.find(b"[", position + 1)
        if position < 0:
            return False
    return value.find(b"[", position + 1) < 0
