"""The test tree's own rules (docs/architecture.md, "Tests"): packages that mirror monitor/, and
nothing shared between test modules except through tests/support/."""

import ast
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"


def modules_of(tests: Path) -> list[Path]:
    return sorted(tests.rglob("test_*.py"))


def imported_tests(path: Path) -> list[str]:
    """The ``tests.*`` modules ``path`` imports, other than tests/support."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names += [f"{module}.{alias.name}" for alias in node.names] if module == "tests" else [module]
    return [name for name in names if name.startswith("tests.") and not name.startswith("tests.support")]


def test_no_test_module_imports_another() -> None:
    assert {str(p.relative_to(REPO)): imported_tests(p) for p in modules_of(TESTS) if imported_tests(p)} == {}


def test_every_folder_of_tests_is_a_package_so_module_names_may_repeat() -> None:
    folders = {path.parent for path in modules_of(TESTS)}
    assert folders > {TESTS / "drift", TESTS / "daemon"}
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()) == []
    assert [p.name for p in TESTS.glob("test_*.py")] == []  # tests live in the package folders
