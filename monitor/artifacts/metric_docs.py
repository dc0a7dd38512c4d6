"""The declaration line under each metric's heading in docs/metrics.md, kept equal to the catalog.

docs/metrics.md is written by hand: formulas, where a number comes from, healthy and unhealthy
values. The line right under each ``### embmon_…`` heading is not: it states the metric's type,
unit, labels, HELP text and the code that computes it (``module:qualname``) as :mod:`monitor.catalog`
declares them, so the page cannot disagree with what a scrape shows.
``python -m monitor.artifacts.metric_docs`` rewrites those lines; ``--check`` (and
``tests/artifacts/test_catalog.py``) fails when one differs.

A heading may cover a family of names with ``<metric>`` standing for the varying part
(``embmon_retrieval_<metric>_ci_lower``): every name it covers must then declare the same line.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from monitor.catalog import CATALOG, MetricSpec

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
MARK = "*Declared:*"
_HEADING = re.compile(r"^### (embmon_[^\n]+)\Z")
_PLACEHOLDER = "<metric>"


def declaration(spec: MetricSpec, *, pattern: tuple[str, str] | None = None) -> str:
    """``*Declared:* gauge · labels `model`, `stream` · HELP "…" · computed by `module:qualname```;
    ``pattern``: (this name's text, the heading's)."""
    help_text = spec.help if pattern is None else spec.help.replace(*pattern)
    parts = [f"{MARK} {spec.kind}"]
    if spec.unit:
        parts.append(f"unit {spec.unit}")
    parts.append("labels " + (", ".join(f"`{label}`" for label in spec.labels) if spec.labels else "none"))
    parts.append(f'HELP "{help_text}"')
    parts.append(f"computed by `{spec.code}`")
    return " · ".join(parts)


def declarations(heading: str) -> list[str]:
    """The declaration lines for one heading's names (a heading lists names separated by ", ")."""
    lines = []
    for name in heading.split(", "):
        if _PLACEHOLDER not in name:
            if name not in CATALOG:
                raise KeyError(f"docs/metrics.md documents {name}, which monitor/catalog/ does not declare")
            lines.append(declaration(CATALOG[name]))
            continue
        before, after = name.split(_PLACEHOLDER)
        covered = re.compile(re.escape(before) + r"(\w+?)" + re.escape(after) + "$")
        found = {
            declaration(spec, pattern=(before + match.group(1), before + _PLACEHOLDER))
            for spec in CATALOG.values()
            if (match := covered.match(spec.name))
        }
        if len(found) != 1:
            raise ValueError(f"docs/metrics.md heading {name}: {len(found)} different declarations match it")
        lines.extend(found)
    return lines


def sync(text: str) -> str:
    """``text`` with the declaration under every metric heading rewritten from the catalog."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        heading = _HEADING.match(line)
        if heading is None:
            continue
        j = i
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith(MARK)):  # the old ones: replaced
            j += 1
        for declared in declarations(heading.group(1)):
            out.extend(["", declared])
        out.append("")
        i = j
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a declaration differs; write nothing")
    parser.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args(argv)
    text = args.docs.read_text(encoding="utf-8")
    synced = sync(text)
    if synced == text:
        return 0
    if args.check:
        print(f"{args.docs}: metric declarations differ from monitor/catalog/; "
              "run python -m monitor.artifacts.metric_docs", file=sys.stderr)
        return 1
    args.docs.write_text(synced, encoding="utf-8")
    print(f"rewrote the metric declarations in {args.docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
