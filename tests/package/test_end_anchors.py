"""Every validating pattern of the package ends at the end of the string, not before a final newline.

``$`` matches before a trailing ``"\\n"`` too: ``re.match(r"^[a-z]+$", "probe\\n")`` matches. So a header
value ``"key\\n"``, a filter field ``"tenant\\n"``, a table ``"items\\n"`` or an alert duration
``"30m\\n"`` passed the checks written to refuse them. They end in ``\\Z``, and no pattern in
``monitor`` may end in ``$`` again.
"""

from __future__ import annotations

import re

import pytest

from monitor.artifacts.thresholds import duration_seconds
from monitor.decoding.decoder import parse_filter
from monitor.index import settings as index_settings
from monitor.outbound import check_headers
from monitor.scaleout import partials
from monitor.serving import settings as serving_settings
from tests.support.paths import REPO


@pytest.mark.parametrize("headers", [{"X-Key": "secret\n"}, {"X-Key\n": "secret"}, {"X-Key": "a\r"}],
                         ids=["value", "name", "cr"])
def test_a_header_with_a_final_line_break_is_refused(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="header"):
        check_headers(headers)


def test_a_filter_field_with_a_final_line_break_is_refused() -> None:
    assert parse_filter({"tenant": "a"}) == (("tenant", "a"),)
    with pytest.raises(ValueError, match="plain identifiers"):
        parse_filter({"tenant\n": "a"})


def test_a_table_or_column_with_a_final_line_break_is_refused() -> None:
    assert index_settings._identifier("items", "table") == "items"
    with pytest.raises(ValueError, match="plain identifier"):
        index_settings._identifier("items\n", "table")


def test_an_alert_duration_with_a_final_line_break_is_refused() -> None:
    assert duration_seconds("30m") == 1800
    with pytest.raises(ValueError, match="invalid duration"):
        duration_seconds("30m\n")


def test_canary_text_ids_and_partials_headers_end_at_the_end() -> None:
    assert serving_settings._TEXT_ID.match("greeting") and not serving_settings._TEXT_ID.match("greeting\n")
    assert partials._DIGITS.match("12") and not partials._DIGITS.match("12\n")


def test_no_pattern_in_the_package_ends_in_a_dollar() -> None:
    found = []
    for path in sorted((REPO / "monitor").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"""re\.(compile|match|fullmatch|search)\(r?["'][^"']*\$["']""", line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == [], "end the pattern with \\Z:\n" + "\n".join(found)
