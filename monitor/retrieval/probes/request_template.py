"""Request templates: a search request's JSON body and URL with ``{{placeholders}}`` for a query.

The placeholders are ``{{text}}``, ``{{vector}}``, ``{{k}}`` and ``{{query_id}}``. The body is
rendered by building JSON, never by pasting text, so no value can break out of its place; the URL's
placeholders are URL-encoded. Standard library only: the settings check a template at start-up
without loading the probes.

Examples
--------
>>> template = RequestTemplate('{"query": {"match": {"body": "{{text}}"}}, "knn": {"vector": {{vector}}, "k": {{k}}}}')
>>> template.render({"text": 'say "hi"', "vector": [0.5, 1.0], "k": 3, "query_id": "q1"})
b'{"query":{"match":{"body":"say \\\\"hi\\\\""}},"knn":{"vector":[0.5,1.0],"k":3}}'
>>> fill_url("http://search/q?text={{text}}&k={{k}}", {"text": "a b/c", "k": 5})
'http://search/q?text=a%20b%2Fc&k=5'
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

PLACEHOLDERS = ("text", "vector", "k", "query_id")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


class RequestTemplate:
    """A JSON request body with ``{{placeholders}}``, rendered by building JSON, never by pasting text.

    Accepts JSON text in which placeholders may stand bare where a value goes (``"k": {{k}}``),
    or an already-parsed mapping. A string that is exactly one placeholder becomes the value
    itself (a list, a number, a string); a placeholder inside a longer string is interpolated.
    """

    def __init__(self, template: str | Mapping[str, Any], placeholders: tuple[str, ...] = PLACEHOLDERS):
        if isinstance(template, str):
            try:
                parsed = json.loads(_quote_bare_placeholders(template))
            except ValueError as exc:
                raise ValueError(f"request_template is not JSON (placeholders aside): {exc}") from None
        else:
            parsed = template
        self.template = parsed
        self.names = frozenset(_names_in(parsed))
        unknown = self.names - set(placeholders)
        if unknown:
            raise ValueError(
                f"request_template uses unknown placeholders {sorted(unknown)}; known: {list(placeholders)}"
            )

    def render(self, values: Mapping[str, Any]) -> bytes:
        body = _substitute(self.template, values)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def fill_url(url: str, values: Mapping[str, Any]) -> str:
    """``url`` with each placeholder replaced by its value as text, URL-encoded."""
    return _PLACEHOLDER.sub(lambda m: urllib.parse.quote(_as_text(values[m.group(1)]), safe=""), url)


def _quote_bare_placeholders(text: str) -> str:
    """Wrap placeholders that stand outside JSON strings in quotes, so the text parses as JSON."""
    out: list[str] = []
    in_string = escaped = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            out.append(ch)
            i += 1
            continue
        match = _PLACEHOLDER.match(text, i)
        if match:
            out.append(f'"{{{{{match.group(1)}}}}}"')
            i = match.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _names_in(node: Any) -> set[str]:
    if isinstance(node, str):
        return set(_PLACEHOLDER.findall(node))
    if isinstance(node, Mapping):
        return set().union(*(_names_in(k) | _names_in(v) for k, v in node.items()))
    if isinstance(node, list):
        return set().union(*(_names_in(v) for v in node))
    return set()


def _substitute(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: _as_text(values[m.group(1)]), node)
    if isinstance(node, Mapping):
        return {_substitute(k, values): _substitute(v, values) for k, v in node.items()}
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    return node


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
