"""Settings and the CLI's parser stay light: no torch, river, scikit-learn, scipy or kafka (nor numpy).

Those take seconds to import; ``--help``, config validation and a daemon with the heavy features
switched off should not pay for them. Each check runs in a fresh interpreter (``-c``), so what
this test process already imported cannot hide an import, and reads ``sys.modules`` afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.imports import EXTRA_PACKAGES, HEAVY, importers, loaded_after, without
from tests.support.paths import REPO


@pytest.mark.parametrize(
    "code",
    [
        "import monitor.config",
        "import monitor.drift.settings, monitor.quality.settings, monitor.retrieval.settings",
        "import monitor.drift.references.profile, monitor.drift.references.store,"
        " monitor.drift.references.lagged, monitor.drift.references.pinned",
        "import monitor.drift.baseline_cli",
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


def test_the_admin_clients_and_their_endpoint_paths_do_not_load_numpy() -> None:
    """``baseline --url`` and ``drift explain`` take their paths from monitor.drift.admin: it must stay stdlib."""
    code = "import monitor.drift.admin, monitor.drift.cli, monitor.drift.baseline_cli"
    assert loaded_after(code, (*HEAVY, "numpy")) == []


def test_the_version_and_the_help_load_neither_the_settings_nor_pydantic() -> None:
    """``--version`` and ``--help`` must answer in well under 0.3 s on a slow CPU: building the
    settings' pydantic models alone took 445 ms on one, so the parser must not import them."""
    for flag in ("--version", "--help"):
        loaded = loaded_after(f"""
            import sys
            from monitor.cli.main import main
            try:
                main(["{flag}"])
            except SystemExit:
                pass
        """, (*HEAVY, "numpy", "pydantic", "monitor.config", "yaml"))
        assert loaded == [], flag


def test_settings_do_not_even_load_numpy() -> None:
    """A tenth of a second, but the CLI's parser (``--help``) should not pay for it either."""
    assert loaded_after("from monitor.config import load_settings\nload_settings()", ("numpy",)) == []


def test_a_daemon_without_drift_and_probes_builds_its_components_without_river_or_sklearn() -> None:
    loaded = loaded_after("""
        from monitor.daemon.features import default_component_factories
        from monitor.config import load_settings
        settings = load_settings(overrides={"source": "synthetic", "drift": {"enabled": False}})
        assert not settings.probes.enabled
        assert default_component_factories(settings) == []
    """)
    assert "river" not in loaded and "sklearn" not in loaded


def test_the_demo_and_its_view_import_nothing_heavy_and_rich_only_to_draw() -> None:
    """The view's plain lines (a pipe, CI) need neither numpy nor rich; drawing on a terminal loads rich."""
    assert loaded_after("import monitor.cli.demo, monitor.cli.demo_view", (*HEAVY, "numpy", "rich")) == []
    drawn = loaded_after("""
        from monitor.cli.demo_view import DemoStatus, JobCounts, plain_lines, render
        status = DemoStatus(0.0, "healthy", 1.0, (), (), {}, JobCounts(0, 0, 0))
        plain_lines(status)
        render(status)
    """, (*HEAVY, "numpy", "rich"))
    assert drawn == ["rich"]


def test_the_baseline_command_registers_without_numpy() -> None:
    """The CLI registers ``baseline`` whenever it builds its parser (``--help``, ``--version``)."""
    code = """
        import argparse
        from monitor.drift.baseline_cli import add_baseline_parser
        add_baseline_parser(argparse.ArgumentParser().add_subparsers())
    """
    assert loaded_after(code, ("numpy",)) == []


def modules_after(code: str) -> set[str]:
    """Every module in ``sys.modules`` after ``code`` runs in a fresh interpreter."""
    probe = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sys.modules))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def ours(modules: set[str]) -> set[str]:
    return {name for name in modules if name.startswith("monitor.")}


def test_importing_the_probe_settings_loads_only_the_light_probe_modules() -> None:
    modules = modules_after("import monitor.retrieval.settings")
    assert loaded_after("import monitor.retrieval.settings", (*HEAVY, "numpy")) == []
    assert ours(modules) <= {
        "monitor.deadline",
        "monitor.decoding",  # the package of the one label-value rule (its __init__ is a docstring)
        "monitor.decoding.labels",
        "monitor.outbound",  # the URL and header checks: stdlib and h11
        "monitor.retrieval",
        "monitor.retrieval.families",
        "monitor.retrieval.settings",
        "monitor.retrieval.probes",
        "monitor.retrieval.probes.deadline",
        "monitor.retrieval.probes.ids_path",
        "monitor.retrieval.probes.request_template",
        "monitor.settings_base",
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
    code = "from monitor.artifacts.command import add_artifacts_parser"
    modules = modules_after(code)
    assert loaded_after(code, (*HEAVY, "numpy", "yaml", "pydantic")) == []
    assert ours(modules) == {"monitor.artifacts", "monitor.artifacts.command"}


@pytest.mark.slow  # 3.4 s of CPU: it imports torch
def test_only_the_cuda_paths_and_the_text_encoder_import_torch_or_sentence_transformers() -> None:
    """The import graph, read from source (lazy imports included): torch is imported by the modules
    monitor/devices.py names, sentence-transformers by the golden probe's encoder and the serving
    probe's in-process encoder, and nothing else; so the default install (neither,
    monitor/extras.py) lacks nothing the CPU daemon runs."""
    assert importers("torch") == {
        "monitor.devices", "monitor.drift.twosample.mmd_torch", "monitor.retrieval.probes.knn_torch",
        "monitor.state.stats", "monitor.quality.intrinsic",
    }
    assert importers("sentence_transformers") == {"monitor.retrieval.probes.golden", "monitor.serving.backends"}


@pytest.mark.slow
@pytest.mark.parametrize("torch_installed", [True, False], ids=["torch-without-a-driver", "a-driver-without-torch"])
def test_a_default_daemon_with_every_feature_at_work_never_imports_torch(tmp_path: Path, torch_installed: bool) -> None:
    """The demo's daemon (synthetic source, default device ``auto``, drift and probes on) after
    ingest, refreshes, a drift cycle and a run of every probe: on a machine without an NVIDIA
    driver (here, ``auto``'s driver check is pointed at a missing file) torch is never loaded; on
    one with a driver but the default install (torch and sentence-transformers not importable)
    ``auto`` is the CPU and everything runs, without a warning."""
    driver = tmp_path / "nvidia-version"
    if not torch_installed:
        driver.write_text("NVRM version: fake\n")
    loaded = loaded_after(("" if torch_installed else without(*EXTRA_PACKAGES)) + textwrap.dedent(f"""
        import logging
        from prometheus_client import generate_latest
        from monitor import devices
        from monitor.config import load_settings
        from monitor.cli.demo import DEMO_SETTINGS
        from monitor.daemon.service import Monitor
        from monitor.sources.synthetic import SyntheticSource

        warnings = []

        class Kept(logging.Handler):
            def emit(self, record):
                warnings.append(record)

        logging.getLogger("monitor").addHandler(Kept(logging.WARNING))
        devices._NVIDIA_DRIVER = devices.Path({str(driver)!r})
        assert devices.nvidia_driver_loaded() is {not torch_installed}
        now = [1_000_000.0]
        clock = lambda: now[0]
        # every test every cycle (screen_level 1): the MMD, the test with a torch path, must run
        drift = {{**DEMO_SETTINGS["drift"], "window_sample_size": 300, "reference_sample_size": 300,
                  "screen_level": 1.0}}
        settings = load_settings(overrides={{
            **DEMO_SETTINGS, "drift": drift, "http": {{"host": "127.0.0.1", "port": 0}},
            "state_dir": {str(tmp_path / "state")!r},
        }})
        assert settings.device == settings.drift.device == "auto" and settings.probes.enabled
        source = SyntheticSource(settings.synthetic, clock=clock)
        monitor = Monitor(settings, source=source, clock=clock)
        try:
            for _ in range(8):
                now[0] += 1.0
                monitor.pipeline.apply_messages(source.poll(0.0))
            monitor.refresh()
            for component in monitor.components:
                for job in component.jobs():
                    job.func()
            monitor.refresh()
            text = generate_latest(monitor.metrics_registry).decode()
        finally:
            monitor.stop()
        assert 'embmon_drift_mmd2{{model="mpnet-demo",stream="documents"}}' in text, "no drift cycle"
        for probe in ("ann", "clicks"):
            assert f'embmon_probe_runs_total{{{{outcome="success",probe="{{probe}}"}}}} 1.0' in text, probe
        assert devices.device_type("auto") == "cpu"
        assert warnings == [], [r.getMessage() for r in warnings]
    """), ("torch",))
    assert loaded == []


@pytest.mark.slow  # 2.1 s of CPU in a process of its own
def test_the_golden_scenario_exports_every_number_without_torch(tmp_path: Path) -> None:
    """Every probe kind (a golden set searched by k-NN, ANN recall, clicks, model agreement),
    drift, canaries and the intrinsic metrics of tests/support/golden.py, with ``auto`` seeing
    no NVIDIA driver: torch is never loaded."""
    code = f"""
        from monitor import devices
        from tests.support.golden import current
        devices._NVIDIA_DRIVER = devices.Path({str(tmp_path / "no-driver")!r})
        values = current()
        assert any(key.startswith("embmon_drift_mmd2") for key in values)
        for probe in ("gold", "ann", "clicks", "agree"):
            assert values[f"embmon_probe_runs_total{{{{outcome=success,probe={{probe}}}}}}"] == 1.0, probe
    """
    assert loaded_after(code, ("torch",)) == []


@pytest.mark.slow  # 2.1 s of CPU in a process of its own
def test_the_drift_suite_runs_every_test_without_scikit_learn_installed() -> None:
    """scikit-learn is a test dependency only: the classifier test fits its own logistic regression
    (monitor/drift/twosample/logistic.py), and the daemon no longer pays half a second to import it."""
    loaded = loaded_after(without("sklearn") + textwrap.dedent("""
        import numpy as np
        from monitor.drift.settings import DriftSettings
        from monitor.drift.twosample.suite import run_drift_suite
        rng = np.random.default_rng(0)
        report = run_drift_suite(rng.normal(size=(300, 16)) + 0.3, rng.normal(size=(300, 16)),
                                 DriftSettings(interval_seconds=60, false_alarm_every="1h"), seed=1)
        assert not report.errors, report.errors
        assert report.result("classifier").detected, report.result("classifier")
    """))
    assert "sklearn" not in loaded
