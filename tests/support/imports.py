"""What the package imports: its import graph read from source, and what a fresh interpreter loads.

In the graph every import counts, module-level or inside a function (a lazy import is still a
dependency); only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO

PACKAGE = REPO / "monitor"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []  # never runs
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """monitor module -> the monitor modules it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {name for name in _imports(tree, module, path.name == "__init__.py") if name in files}
        graph[module] = targets - {module}
    return graph


def _parse(path: Path) -> ast.Module:
    """``ast.parse`` of the file, once more if CPython 3.11's parser trips on its own recursion count.

    3.11 keeps the AST constructor's recursion depth in interpreter state that another thread's
    parse or compile can move (``SystemError: AST constructor recursion depth mismatch``, seen once
    beside a Kafka client's I/O thread): the file is fine, the second parse succeeds."""
    try:
        return ast.parse(path.read_text(), str(path))
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
        return ast.parse(path.read_text(), str(path))


def importers(package: str) -> set[str]:
    """The monitor modules that import ``package`` or one of its submodules, anywhere in their code."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        names = _imports(_parse(path), module, path.name == "__init__.py")
        if any(name == package or name.startswith(f"{package}.") for name in names):
            found.add(module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


HEAVY = ("torch", "river", "sklearn", "scipy", "kafka")

# the optional extras' packages (monitor/extras.py): the default install has neither
EXTRA_PACKAGES = ("torch", "sentence_transformers", "confluent_kafka", "psycopg", "lancedb")


def without(*packages: str) -> str:
    """Python source that, run first in a fresh interpreter, makes ``packages`` (and their
    submodules) unimportable as if they were not installed: a finder at the head of
    ``sys.meta_path`` answers ModuleNotFoundError for them. The test venv has them installed; this
    is how a test sees the default install (``import torch`` fails, ``find_spec`` finds nothing)."""
    return textwrap.dedent(f"""
        import sys as _sys

        class _NotInstalled:
            blocked = frozenset({sorted(packages)!r})

            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in self.blocked:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        _sys.meta_path.insert(0, _NotInstalled())
    """)


def loaded_after(code: str, packages: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``packages`` are in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps(sorted({{name.partition(".")[0] for name in sys.modules}} & set({list(packages)!r}))))
    """)
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
