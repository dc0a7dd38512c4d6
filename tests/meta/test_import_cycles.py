"""No import cycles among the modules of ``monitor/``: each module can be read after the ones it imports.

A cycle makes start-up order matter (a half-initialised module hands out names it has not defined
yet), hides which module owns a concept, and pulls heavy modules in behind light ones. The graph is
read from source (:mod:`tests.support.imports`): every ``import`` and ``from … import``, lazy ones
inside functions included (a lazy import is still a dependency; it only moves the cost), except
under ``if TYPE_CHECKING:``. ``from package import name`` depends on the package and, when
``name`` is a submodule, on that submodule too.
"""

from __future__ import annotations

import ast

from tests.support.imports import _imports, cycles, import_graph


def test_the_checker_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": set()}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_from_packages_submodules_relative_and_lazy_imports() -> None:
    source = (
        "from monitor.pkg import sub\n"
        "from . import other\n"
        "from .sub import thing\n"
        "import monitor.light\n"
        "if TYPE_CHECKING:\n    import monitor.typing_only\n"
        "def later():\n    import monitor.lazy\n"
    )
    found = set(_imports(ast.parse(source), "monitor.pkg.x", is_package=False))
    assert {"monitor.pkg", "monitor.pkg.sub", "monitor.pkg.other", "monitor.light", "monitor.lazy"} <= found
    assert "monitor.typing_only" not in found


def test_the_graph_sees_real_imports() -> None:
    graph = import_graph()
    assert "monitor.drift.twosample.suite" in graph["monitor.drift.component"]
    assert "monitor.drift.twosample.mmd_torch" in graph["monitor.drift.twosample.mmd"]  # lazy, but a dependency
    assert "monitor.artifacts.generate" in graph["monitor.artifacts.command"]


def test_no_import_cycles_among_monitor_modules() -> None:
    assert cycles(import_graph()) == []
