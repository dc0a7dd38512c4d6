"""Shared fixtures: a real broker per test module, a fresh settings builder; the session's hygiene; the
record of every test's duration and the fast tier's 5 s rule.

After each test the cyclic garbage collector runs over what the test made (what was there before is
frozen, ``gc.freeze``: the imports, then whatever outlived each test), so a socket, file or thread a
test leaves open in a reference cycle is finalised in that test's teardown: its ``ResourceWarning``
(an error, pyproject's ``filterwarnings``) reaches pytest's unraisable-exception hook there, and that
test errors, not a later one whose own ``gc.collect()`` (hypothesis runs one) happens to find it. A
thread that a module's tests or fixtures started and left running after its last test fails that test.

Every run records each test's wall time (setup, call and teardown, and the call alone), the CPU time
of the process that ran it and the load average in ``.cache/test-durations.json`` (git-ignored, or
``EMBMON_TEST_DURATIONS``; merged with what earlier runs recorded, so a run of one folder updates its
tests only). With ``EMBMON_FAST_TIER_SECONDS`` set (``scripts/test --fast`` sets 5), a test not marked
slow whose call took longer than that, scaled up by the machine's load (the 1-minute load average per
core, when over 1), fails the run after the last test, each named with its times. The call alone: a
module fixture's setup (a model the module shares) is paid by whichever test comes first. With
``EMBMON_FAST_TIER_BUDGET_SECONDS`` (``scripts/test --fast`` sets 175: the 180 s of the tier less
set-up, lint and types, 2.5 s with warm caches), a session that took longer, scaled by the load when
the session began (not the load its own workers make), fails too. Under pytest-xdist the slow tests
are handed out first.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import Broker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_CONFIG: list[pytest.Config] = []  # pytest_runtest_logreport is given the report only
TIMES = pytest.StashKey[dict[str, dict[str, Any]]]()
DURATIONS_FILE = Path(os.environ.get("EMBMON_TEST_DURATIONS")
                      or Path(__file__).resolve().parent.parent / ".cache" / "test-durations.json")
FAST_TIER_VARIABLE = "EMBMON_FAST_TIER_SECONDS"
FAST_TIER_BUDGET_VARIABLE = "EMBMON_FAST_TIER_BUDGET_SECONDS"


def pytest_configure(config: pytest.Config) -> None:
    config.stash[TIMES] = {}
    _CONFIG[:] = [config]


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker: its reports reach the controller


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """The CPU time of the process over the test's three phases, carried to the controller in the reports."""
    started = time.process_time()
    item.user_properties.append(("cpu_started", started))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    if call.when == "teardown":
        started = dict(item.user_properties).get("cpu_started", time.process_time())
        item.user_properties.append(("cpu_seconds", time.process_time() - started))
        item.user_properties.append(("load1", os.getloadavg()[0]))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    config = _CONFIG[0] if _CONFIG else None
    if config is None or _is_worker(config):
        return
    times = config.stash[TIMES].setdefault(report.nodeid, {"wall_s": 0.0, "outcome": "passed"})
    times["wall_s"] += report.duration
    if report.when == "call":
        times["call_s"] = round(report.duration, 3)
    if report.outcome != "passed":
        times["outcome"] = report.outcome
    if report.when == "teardown":
        properties = dict(report.user_properties)
        times["cpu_s"] = round(float(properties.get("cpu_seconds", 0.0)), 3)
        times["gc_s"] = round(float(properties.get("gc_seconds", 0.0)), 4)
        times["load1"] = round(float(properties.get("load1", 0.0)), 2)
        times["slow"] = "slow" in report.keywords
        times["wall_s"] = round(times["wall_s"], 3)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_worker(config) or not config.stash.get(TIMES, {}):
        return
    times = config.stash[TIMES]
    _record(times)
    limit = os.environ.get(FAST_TIER_VARIABLE)
    over = _over_the_fast_tier_limit(times, float(limit)) if limit else []
    budget = os.environ.get(FAST_TIER_BUDGET_VARIABLE)
    if budget:
        spent = time.monotonic() - config.stash.get(STARTED, time.monotonic())
        # scaled by the load the machine carried when the session began: the tier's own workers raise
        # the load average as it runs, and scaling by that would excuse the tier's own slowness
        load = config.stash.get(LOAD_AT_START, 0.0)
        allowed = float(budget) * max(1.0, load / (os.cpu_count() or 1))
        if spent > allowed:
            over.append(f"the tier: {spent:.0f} s from the session's start (allowed {allowed:.0f} s: "
                        f"{FAST_TIER_BUDGET_VARIABLE}={budget} at load {load:.1f} when it began)")
    if over:
        config.stash[OVER] = over
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


OVER = pytest.StashKey[list[str]]()


def _record(times: dict[str, dict[str, Any]]) -> None:
    """Merge this run's times into the durations file (a run of one folder updates its tests only)."""
    try:
        recorded = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    except (OSError, ValueError):
        recorded = {}
    recorded.update(times)
    DURATIONS_FILE.parent.mkdir(exist_ok=True)
    temporary = DURATIONS_FILE.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(dict(sorted(recorded.items())), indent=0))
    temporary.replace(DURATIONS_FILE)


def _over_the_fast_tier_limit(times: dict[str, dict[str, Any]], limit: float) -> list[str]:
    """The fast-tier tests over ``limit`` seconds of wall time, the limit scaled by the load per core."""
    cores = os.cpu_count() or 1
    over = []
    for nodeid, t in sorted(times.items(), key=lambda kv: -kv[1]["wall_s"]):
        if t.get("slow") or t["outcome"] == "skipped":
            continue
        allowed = limit * max(1.0, t.get("load1", 0.0) / cores)
        if t.get("call_s", t["wall_s"]) > allowed:
            over.append(f"{nodeid}: {t.get('call_s', 0):.1f} s wall in its body (allowed {allowed:.1f} s at load "
                        f"{t.get('load1', 0):.1f} on {cores} cores; {t['wall_s']:.1f} s with setup and teardown), "
                        f"{t.get('cpu_s', 0):.1f} s CPU")
    return over


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the slow tests first, the modules with the most recorded slow time first,
    dealt out to the workers' shares in turn; then the fast tests, each worker's share a run of whole
    modules.

    Each worker then starts with long tests while the short ones can still fill the workers around
    them, instead of one long test running alone at the end. The fast tests are not dealt one by
    one: a module's tests spread over every worker made each worker start the module's fixtures (a
    broker, a database, an embedding server), which cost the fast tier a sixth of its CPU. Within a
    module the order is kept. Every worker collects and sorts alike (the same durations file), as
    xdist requires."""
    if not _is_worker(config):
        return
    try:
        recorded = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    except (OSError, ValueError):
        recorded = {}
    module_seconds: dict[str, float] = {}
    for nodeid, t in recorded.items():
        if isinstance(t, dict) and t.get("slow"):
            module_seconds[nodeid.split("::")[0]] = module_seconds.get(nodeid.split("::")[0], 0.0) + t.get("wall_s", 0)
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                                 -module_seconds.get(_module(item), 0.0), position[id(item)]))
    # --dist worksteal hands each worker one contiguous share, as many tests each, and steals from the
    # queues' ends: every share starts with its part of the slow tests, then a run of fast modules
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        fast = items[len(slow):]
        shares = [[slow[i] for i in range(start, len(slow), workers)] for start in range(workers)]
        for k, share in enumerate(shares):
            share += fast[k * len(fast) // workers:(k + 1) * len(fast) // workers]
        items[:] = [item for share in shares for item in share]


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[STARTED] = time.monotonic()
    session.config.stash[LOAD_AT_START] = os.getloadavg()[0]


STARTED = pytest.StashKey[float]()
LOAD_AT_START = pytest.StashKey[float]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what the imports made: each test's collection then walks only the objects made since."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # pytest's last collection, after this, then walks everything (a module fixture's leaks)


@pytest.fixture(autouse=True)
def _leaks_fail_the_test_that_made_them(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    started = time.process_time()
    gc.collect()
    gc.freeze()  # what outlives the test (caches, module fixtures) is not walked again by the next one
    request.node.user_properties.append(("gc_seconds", time.process_time() - started))


_MODULE_THREADS: dict[str, Any] = {}
# threads a library starts once per process and keeps (they belong to whichever module first used the
# library, which xdist's scheduling makes any of them): not a leak of that module
PROCESS_THREADS = ("LanceDBBackgroundEventLoop", "tqdm_monitor")
# how long a module's threads may take to end after its last test (tests/meta's pytest-in-pytest runs shorten it)
THREAD_GRACE_SECONDS = float(os.environ.get("EMBMON_THREAD_GRACE_SECONDS", "15"))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if _MODULE_THREADS.get("module") != _module(item):
        _MODULE_THREADS.update(module=_module(item), before=set(threading.enumerate()))
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test (its module fixtures torn down), no thread its tests started runs.

    Checked per module, not per test: a module fixture's daemon starts pool threads lazily, during
    whichever test first needs one."""
    result = yield
    if nextitem is None or _module(nextitem) != _module(item):
        # a module may name threads it leaves by design (ABANDONED_THREADS: e.g. a Kafka client's I/O
        # thread the daemon abandons with a bootstrap that never answers, ending at its own timeout)
        allowed = PROCESS_THREADS + tuple(getattr(item.module, "ABANDONED_THREADS", ()))
        left = [t for t in threading.enumerate()
                if t not in _MODULE_THREADS.get("before", set()) and not t.name.startswith(allowed)]
        deadline = time.monotonic() + THREAD_GRACE_SECONDS  # threads on their way out, on a busy machine
        for thread in left:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = [t for t in left if t.is_alive()]
        _MODULE_THREADS.clear()
        if left:
            names = ", ".join(f"{t.name} ({'daemon' if t.daemon else 'not daemon'})" for t in left)
            raise AssertionError(f"the tests of {_module(item)} left {len(left)} thread(s) running: {names}")
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    over = config.stash.get(OVER, [])
    if over:
        limit = os.environ.get(FAST_TIER_VARIABLE)
        terminalreporter.section(f"fast tier over its limits ({limit} s a test, "
                                 f"{os.environ.get(FAST_TIER_BUDGET_VARIABLE)} s the tier): mark tests slow, "
                                 "or make them cheaper", red=True)
        for line in over:
            terminalreporter.write_line(line)
    spent = [t.get("gc_s", 0.0) for t in config.stash.get(TIMES, {}).values()]
    if spent:
        terminalreporter.write_line(
            f"garbage collection after each test: {sum(spent):.2f} s of CPU over {len(spent)} tests "
            f"(at most {max(spent) * 1000:.0f} ms)")


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    """A real Kafka-compatible broker (tansu, memory storage) on a free loopback port."""
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path
