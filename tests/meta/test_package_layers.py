"""Package layers that hold: which part of ``monitor/`` may import which, checked on the real import graph.

In the spirit of import-linter's ``layers`` contract. A *unit* is a package folder of ``monitor/``
(``drift``, ``daemon``, ...) or a module at its root (``config``, ``catalog``, ...). :data:`LAYERS`
lists them from the top down: a unit may import any unit of a lower layer, never one of a higher
layer, and the units of one layer are independent of each other (siblings: neither imports the
other), except in the bottom layer, the root's shared modules, where only the module-cycle test
(``test_import_cycles.py``) applies. The graph is :func:`tests.support.imports.import_graph`: every
import, lazy ones inside functions included, except under ``if TYPE_CHECKING:`` (a type is not a
runtime dependency). docs/architecture.md, "Layers", shows the same table; a test below holds the
two equal.
"""

from __future__ import annotations

import re

from tests.support.imports import PACKAGE, import_graph
from tests.support.paths import REPO

# From the top down. The roles are chosen by name in cli/main.py, so nothing below it names them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli",),
    ("artifacts", "config"),  # the generator; the settings root, which nests every feature's settings
    ("scaleout",),  # the replica and reducer roles, built on the daemon
    ("daemon",),
    ("index", "serving"),  # probes of the index and the embedding server, built on retrieval and canary
    ("drift", "retrieval", "canary", "quality"),  # the features, independent of each other
    ("component",),  # the seam between the daemon and the features
    ("server", "sources", "state"),  # HTTP transport; record sources; streaming state
    ("decoding", "storage"),  # bytes -> records; files in the state directory
    # what every step shares and nothing owns (any order among them; no cycles)
    ("monitor", "blocking", "catalog", "deadline", "devices", "errors", "extras", "logs", "multiple_testing",
     "outbound", "redaction", "settings_base", "tally"),
)
BASE = LAYERS[-1]


def unit(module: str) -> str:
    """``monitor.drift.twosample.mmd`` -> ``drift``; ``monitor.config`` -> ``config``; ``monitor`` -> ``monitor``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(name: str) -> int:
    for depth, layer in enumerate(LAYERS):
        if name in layer:
            return depth
    raise KeyError(f"{name} is in no layer of tests/meta/test_package_layers.py: place it in LAYERS")


def unit_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(importing unit, imported unit) -> the module pairs behind it, across units only."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, imported in graph.items():
        for target in imported:
            if unit(module) != unit(target):
                edges.setdefault((unit(module), unit(target)), set()).add((module, target))
    return edges


def violations(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """The unit imports the table forbids: upward, or between siblings of one layer (outside the base)."""
    out = {}
    for (low, high), pairs in unit_graph(graph).items():
        above, below = layer_of(low), layer_of(high)
        if above > below or (above == below and LAYERS[above] is not BASE):
            out[(low, high)] = pairs
    return out


def inverted_pairs(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Unit pairs that import each other (a cycle between two units), whatever the table says."""
    edges = unit_graph(graph)
    return {frozenset(pair) for pair in edges if (pair[1], pair[0]) in edges}


def test_every_unit_has_a_layer() -> None:
    units = {unit(m) for m in import_graph()}
    assert units <= {name for layer in LAYERS for name in layer}, sorted(
        u for u in units if all(u not in layer for layer in LAYERS))
    on_disk = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert {name for layer in LAYERS for name in layer} - {"monitor"} == on_disk


def test_the_checker_finds_an_upward_import_a_sibling_import_and_an_inversion() -> None:
    graph = {
        "monitor.sources.kafka.source": {"monitor.daemon.counters"},  # upward
        "monitor.daemon.counters": {"monitor.sources.base"},
        "monitor.drift.component": {"monitor.canary.pins"},  # siblings
        "monitor.catalog": {"monitor.logs"},  # the base: free
        "monitor.cli.main": {"monitor.drift.cli"},  # downward
    }
    assert set(violations(graph)) == {("sources", "daemon"), ("drift", "canary")}
    assert inverted_pairs(graph) == {frozenset({"sources", "daemon"})}


def test_no_package_imports_a_higher_layer_or_a_sibling() -> None:
    found = violations(import_graph())
    assert found == {}, "\n".join(
        f"{low} -> {high}: " + ", ".join(f"{a} imports {b}" for a, b in sorted(pairs)[:3])
        for (low, high), pairs in sorted(found.items()))


def test_no_two_packages_import_each_other() -> None:
    assert inverted_pairs(import_graph()) == set()


def test_the_architecture_page_shows_the_same_layers() -> None:
    """docs/architecture.md, "Layers": one table row per layer, top first, each unit in backquotes."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| \d+ \|", line)]
    documented = [tuple(re.findall(r"`([\w.]+?)(?:/|\.py)?`", row.split("|")[2])) for row in rows]
    assert documented == [tuple(name for name in layer) for layer in LAYERS]
