"""Ids paths: where a search endpoint's JSON response keeps the ranked document ids.

A dotted path with ``[*]`` (every element) and ``[n]`` (one element), e.g. ``hits.hits[*]._id``,
as Elasticsearch's rank-eval templates write it. Standard library only: the settings check a path
at start-up without loading the probes.

Examples
--------
>>> extract_ids({"hits": {"hits": [{"_id": "d2"}, {"_id": 7}]}}, parse_ids_path("hits.hits[*]._id"))
['d2', '7']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from monitor.retrieval.probes.deadline import ProbeError

_STEP = re.compile(r"([^.\[\]]+)|\[(\*|[0-9]+)\]")


def parse_ids_path(path: str) -> list[tuple[str, str]]:
    """``hits.hits[*]._id`` -> [("key", "hits"), ("key", "hits"), ("all", ""), ("key", "_id")]."""
    steps: list[tuple[str, str]] = []
    position = 0
    text = path.strip()
    if not text:
        raise ValueError("ids_path is empty")
    while position < len(text):
        if text[position] == "." and steps:
            position += 1
        match = _STEP.match(text, position)
        if not match:
            raise ValueError(f"ids_path {path!r}: cannot parse at {text[position:]!r}")
        if match.group(1) is not None:
            steps.append(("key", match.group(1)))
        elif match.group(2) == "*":
            steps.append(("all", ""))
        else:
            steps.append(("index", match.group(2)))
        position = match.end()
    return steps


def extract_ids(document: Any, steps: Sequence[tuple[str, str]]) -> list[str]:
    """Follow a parsed path through a JSON response; raise ``ProbeError`` when it does not fit."""
    ids = []
    for node in follow_path(document, steps):
        if isinstance(node, bool) or not isinstance(node, (str, int)):
            raise ProbeError(f"an id in the response is {type(node).__name__}, not a string or integer")
        ids.append(str(node))
    return ids


def follow_path(document: Any, steps: Sequence[tuple[str, str]]) -> list[Any]:
    """The nodes a parsed path reaches in a JSON document; raise ``ProbeError`` when it does not fit."""
    nodes = [document]
    for kind, arg in steps:
        following: list[Any] = []
        for node in nodes:
            if kind == "key":
                if not isinstance(node, dict) or arg not in node:
                    raise ProbeError(f"response has no field {arg!r} where the ids path expects one")
                following.append(node[arg])
            elif kind == "all":
                if not isinstance(node, list):
                    raise ProbeError("response has no list where the ids path has [*]")
                following.extend(node)
            else:
                if not isinstance(node, list) or int(arg) >= len(node):
                    raise ProbeError(f"response has no element [{arg}] where the ids path expects one")
                following.append(node[int(arg)])
        nodes = following
    return nodes
