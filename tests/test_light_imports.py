"""Settings and the CLI's parser stay light: no torch, river, scikit-learn, scipy or kafka (nor numpy).

Those take seconds to import; ``--help``, config validation and a daemon with the heavy features
switched off should not pay for them. Each check runs in a fresh interpreter (``-c``), so what
this test process already imported cannot hide an import, and reads ``sys.modules`` afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEAVY = ("torch", "river", "sklearn", "scipy", "kafka")
ROOT = Path(__file__).resolve().parents[1]


def loaded_after(code: str, packages: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``packages`` are in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps(sorted({{name.partition(".")[0] for name in sys.modules}} & set({list(packages)!r}))))
    """)
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import monitor.config",
        "import monitor.drift.settings, monitor.quality.settings, monitor.retrieval.settings",
        "import monitor.drift.profile, monitor.drift.store, monitor.drift.lagged, monitor.drift.pinned",
        "import monitor.baseline",
    ],
)
def test_importing_settings_loads_no_heavy_package(code: str) -> None:
    assert loaded_after(code) == []


def test_building_default_settings_loads_no_heavy_package() -> None:
    assert loaded_after("""
        from monitor.config import Settings, load_settings
        Settings()
        load_settings()
    """) == []


def test_settings_do_not_even_load_numpy() -> None:
    """A tenth of a second, but the CLI's parser (``--help``) should not pay for it either."""
    assert loaded_after("from monitor.config import load_settings\nload_settings()", ("numpy",)) == []


def test_a_daemon_without_drift_and_probes_builds_its_components_without_river_or_sklearn() -> None:
    loaded = loaded_after("""
        from monitor.components import default_component_factories
        from monitor.config import load_settings
        settings = load_settings(overrides={"source": "synthetic", "drift": {"enabled": False}})
        assert not settings.probes.enabled
        assert default_component_factories(settings) == []
    """)
    assert "river" not in loaded and "sklearn" not in loaded


def test_the_demo_and_its_view_import_nothing_heavy_and_rich_only_to_draw() -> None:
    """The view's plain lines (a pipe, CI) need neither numpy nor rich; drawing on a terminal loads rich."""
    assert loaded_after("import monitor.demo, monitor.demo_view", (*HEAVY, "numpy", "rich")) == []
    drawn = loaded_after("""
        from monitor.demo_view import DemoStatus, JobCounts, plain_lines, render
        status = DemoStatus(0.0, "healthy", 1.0, (), (), {}, JobCounts(0, 0, 0))
        plain_lines(status)
        render(status)
    """, (*HEAVY, "numpy", "rich"))
    assert drawn == ["rich"]


def test_the_baseline_command_registers_without_numpy() -> None:
    """The CLI registers ``baseline`` whenever it builds its parser (``--help``, ``--version``)."""
    code = """
        import argparse
        from monitor.baseline import add_baseline_parser
        add_baseline_parser(argparse.ArgumentParser().add_subparsers())
    """
    assert loaded_after(code, ("numpy",)) == []


def modules_after(code: str) -> set[str]:
    """Every module in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    probe = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sys.modules))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def ours(modules: set[str]) -> set[str]:
    return {name for name in modules if name.startswith("monitor.")}


def test_importing_the_probe_settings_loads_only_the_light_probe_modules() -> None:
    modules = modules_after("import monitor.retrieval.settings")
    assert loaded_after("import monitor.retrieval.settings", (*HEAVY, "numpy")) == []
    assert ours(modules) <= {
        "monitor.labels",
        "monitor.retrieval",
        "monitor.retrieval.families",
        "monitor.retrieval.settings",
        "monitor.retrieval.probes",
        "monitor.retrieval.probes.deadline",
        "monitor.retrieval.probes.ids_path",
        "monitor.retrieval.probes.request_template",
    }


def test_registering_the_evaluate_command_loads_no_engine() -> None:
    code = "from monitor.retrieval.evaluate import add_evaluate_parser"
    assert loaded_after(code, (*HEAVY, "numpy")) == []
    assert ours(modules_after(code)) == {
        "monitor.retrieval",
        "monitor.retrieval.evaluate",
        "monitor.retrieval.families",
    }


def test_registering_the_artifacts_command_loads_no_generator() -> None:
    code = "from monitor.artifacts import add_artifacts_parser"
    modules = modules_after(code)
    assert loaded_after(code, (*HEAVY, "numpy", "yaml", "pydantic")) == []
    assert ours(modules) == {"monitor.artifacts", "monitor.artifacts.command"}
