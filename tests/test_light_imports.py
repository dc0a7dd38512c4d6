"""What the probe settings and the CLI's sub-command registration import: nothing heavy; and no
import circle among the retrieval and artifacts modules.

The settings and the registration of ``evaluate`` and ``artifacts`` are loaded by every command
(``embedding-monitor --help`` included), so they must not pull in numpy, torch, the probes, YAML
or pydantic models they do not need. Each check runs in a fresh interpreter: modules that other
tests imported cannot hide a heavy import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "scipy", "sklearn", "river", "kafka", "sentence_transformers")


def imported_by(statement: str) -> set[str]:
    """Every module in ``sys.modules`` after ``statement`` runs in a new interpreter."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            check=True, timeout=120)
    return set(result.stdout.split())


def heavy(modules: set[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] in HEAVY}


def test_importing_the_probe_settings_loads_only_the_light_probe_modules() -> None:
    modules = imported_by("import monitor.retrieval.settings")
    assert not heavy(modules)
    ours = {name for name in modules if name.startswith("monitor.")}
    assert ours <= {
        "monitor.retrieval",
        "monitor.retrieval.families",
        "monitor.retrieval.settings",
        "monitor.retrieval.probes",
        "monitor.retrieval.probes.deadline",
        "monitor.retrieval.probes.ids_path",
        "monitor.retrieval.probes.request_template",
    }


def test_registering_the_evaluate_command_loads_no_engine() -> None:
    modules = imported_by("from monitor.retrieval.evaluate import add_evaluate_parser")
    assert not heavy(modules)
    assert {name for name in modules if name.startswith("monitor.")} == {
        "monitor.retrieval",
        "monitor.retrieval.evaluate",
        "monitor.retrieval.families",
    }


def test_registering_the_artifacts_command_loads_no_generator() -> None:
    modules = imported_by("from monitor.artifacts import add_artifacts_parser")
    assert not heavy(modules) and "yaml" not in modules and "pydantic" not in modules
    assert {name for name in modules if name.startswith("monitor.")} == {
        "monitor.artifacts",
        "monitor.artifacts.command",
    }


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``monitor`` modules it imports anywhere in its body (functions included)."""
    files = {}
    for path in (REPO / "monitor").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        name = todo.pop()
        if name == goal:
            return True
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return False


def test_no_retrieval_or_artifacts_module_imports_itself_through_a_circle() -> None:
    graph = import_graph()
    ours = [name for name in graph if name.startswith(("monitor.retrieval", "monitor.artifacts"))]
    assert "monitor.retrieval.settings" in ours and "monitor.retrieval.probes.component" in ours
    assert "monitor.artifacts.rules.model" in ours
    assert [name for name in ours if reaches(graph, name, name)] == []
