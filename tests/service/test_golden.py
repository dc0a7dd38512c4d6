"""The same input gives the same exported numbers: a refactor must not move any of them.

An intended change of a value rewrites the fixture (``python -m tests.support.golden --write``)
in the same commit, which says why.
"""

from __future__ import annotations

import json

from tests.support import golden


def test_every_exported_value_matches_the_golden_fixture() -> None:
    expected = json.loads(golden.FIXTURE.read_text())
    diff = list(golden.differences(expected, golden.current()))
    assert not diff, "\n".join(diff[:40])


def test_the_comparison_notices_a_changed_missing_or_new_series() -> None:
    expected = {"a{}": 1.0, "b{}": 2.0}
    assert list(golden.differences(expected, {"a{}": 1.0, "b{}": 2.0 + 1e-12})) == []
    found = list(golden.differences(expected, {"a{}": 1.1, "c{}": 3.0}))
    assert found == ["missing: b{} (was 2.0)", "new: c{} = 3.0", "changed: a{}: 1.0 -> 1.1"]
