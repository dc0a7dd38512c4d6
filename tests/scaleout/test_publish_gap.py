"""A replica killed between a publication and its offset commit, and never restarted.

Its publication is in the partials topic, so the reducer merges it, while the group's committed
offsets are older. The replica that takes its partitions must resume after what the publication
reflects (``monitor.scaleout.resume``: the partials topic is the source of truth), or the reducer
counts those records twice for as long as they stay in the window. The victim never comes back
(a scaled-down StatefulSet, a lost volume): the reducer ends exact on its own, and its window
gauges equal a single daemon's over the same records (and the float64 truth).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

import pytest

from monitor.config import load_settings
from monitor.daemon import failpoints
from monitor.quality.intrinsic import report_from_matrix
from monitor.scaleout.replica import group_positions
from monitor.scaleout.resume import ManifestReader, published_offsets
from tests.support import daemons
from tests.support.broker import Broker
from tests.support.logs import tracebacks
from tests.support.producers import KnownSequence
from tests.support.scaleout import (
    EXACT,
    exact_counts_in,
    produced,
    replica,
    scaled_settings,
    wait_for_exact_counts,
    wait_for_further_publications,
)
from tests.support.scrape import scrape, value
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

GROUP = "publish-gap"


@pytest.mark.slow
@pytest.mark.parametrize("restarted", [False, True], ids=["never-restarted", "restarted"])
def test_a_replica_killed_between_publication_and_commit_leaves_the_reducer_exact(
        broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restarted: bool) -> None:
    """Never restarted: the survivor alone keeps it exact. Restarted once the survivor has resumed
    past the gap: the victim restores the checkpoint its newest publication names (its marker is
    older), so its restart publication still holds the records the survivor skipped."""
    topic = f"emb-scaled-publish-gap-{int(restarted)}"
    settings = scaled_settings(monkeypatch, broker, topic, GROUP, tmp_path)
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        single = running.enter_context(daemons.crash_tested(
            broker, topic, "publish-gap-single", tmp_path / "single", tmp_path / "single.log",
            env={"EMBMON_SCALE_OUT__ROLE": "single"}))
        producer = running.enter_context(KnownSequence(broker, topic))
        victim = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", tmp_path / "a.log", GROUP,
                                               env={"EMBMON_FAILPOINT": "replica-published-ahead@5"}))
        assert victim.wait(timeout=90) == failpoints.EXIT_STATUS  # published, then died before committing
        assert producer.is_alive()  # records keep coming: the survivor has more to read after the gap
        reader = ManifestReader(settings)
        try:
            manifests = reader.newest()
        finally:
            reader.close()
        assert manifests is not None and "replica-a" in manifests
        published = published_offsets(manifests)
        committed = group_positions(settings, sorted(published))
        assert committed is not None
        # the gap is real: the publication reflects records the group's commit does not
        ahead = {key: (offset, committed[key]) for key, offset in published.items()
                 if committed[key] is None or offset + 1 > committed[key]}
        assert ahead, (published, committed)

        survivor = running.enter_context(replica(broker, topic, "replica-b", tmp_path / "b", tmp_path / "b.log",
                                                 GROUP))
        if restarted:
            wait_until(lambda: value(scrape(survivor.port), "embmon_records_total", model="bin", stream="default"),
                       timeout=60, message="the survivor consuming after the gap")
            back = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", tmp_path / "a-1.log",
                                                 GROUP))
            wait_until(lambda: "the partials topic holds our epoch" in back.output(), timeout=60,
                       message="the victim restoring its newest published checkpoint")
        expected = produced(producer)
        wait_for_exact_counts(reducer.http.port, expected)
        wait_until(lambda: exact_counts_in(scrape(single.port), expected), timeout=60,
                   message="the single daemon counted everything")
        wait_for_further_publications(reducer)
        samples, one = scrape(reducer.http.port), scrape(single.port)
        survivor_log = survivor.output()

    assert exact_counts_in(samples, expected)  # still exact after further publications: nothing doubled
    for (t, p), (offset, _) in ahead.items():
        # the survivor resumed right after the victim's publication, not at the group's older commit
        assert re.search(rf"partition \('{t}', {p}\): starting at offset {offset + 1}\b", survivor_log), survivor_log
    assert not tracebacks(survivor_log)
    quality = load_settings().quality
    for model, matrix in (("bin", producer.bin_rows.reshape(-1, producer.DIM_BIN)), ("json", producer.json_rows)):
        want = report_from_matrix(matrix, settings=quality)
        for name in EXACT:
            got = value(samples, f"embmon_{name}", model=model, stream="default")
            single_value = value(one, f"embmon_{name}", model=model, stream="default")
            print(f"{model} {name}: reducer vs single daemon, relative difference "
                  f"{abs(got - single_value) / max(abs(single_value), 1e-300):.2e}")
            assert got == pytest.approx(value(one, f"embmon_{name}", model=model, stream="default"),
                                        rel=1e-9, abs=1e-12), (model, name)
            assert got == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-12), (model, name)
    # the dead replica's publication stays merged (stale once it is old, never dropped before its window)
    assert sum(value(samples, "embmon_reducer_replicas", state=s) or 0 for s in ("live", "stale")) == 2


@pytest.mark.slow
def test_a_replica_killed_while_sealing_leaves_the_reducer_exact(broker: Broker, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed with its publication's seal on partition 0 only (both streams' partials are on
    partition 1, acknowledged), never restarted: the survivor resumes after that publication and
    writes its seal to partition 1 (``ReplicaRole.complete_seals``), so the reducer holds it whole;
    without that, the records between the victim's last two publications would be missing."""
    topic, group = "emb-scaled-sealing", f"{GROUP}-sealing"
    settings = scaled_settings(monkeypatch, broker, topic, group, tmp_path)
    with contextlib.ExitStack() as running:
        reducer = running.enter_context(daemons.reducer(settings))
        producer = running.enter_context(KnownSequence(broker, topic))
        victim = running.enter_context(replica(broker, topic, "replica-a", tmp_path / "a", tmp_path / "a.log", group,
                                               env={"EMBMON_FAILPOINT": "replica-sealing@5"}))
        try:
            assert victim.wait(timeout=90) == failpoints.EXIT_STATUS  # sealed on partition 0, then died
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the victim did not reach its fail point:\n{victim.output()[-3000:]}") from None
        assert producer.is_alive()
        survivor = running.enter_context(replica(broker, topic, "replica-b", tmp_path / "b", tmp_path / "b.log",
                                                 group))
        wait_until(lambda: "completed a publication's seal on partitions [1]" in survivor.output(), timeout=60,
                   message="the survivor completing the victim's seal")
        expected = produced(producer)
        wait_for_exact_counts(reducer.http.port, expected)
        wait_for_further_publications(reducer)
        samples = scrape(reducer.http.port)
        survivor_log = survivor.output()
    assert exact_counts_in(samples, expected)
    assert not tracebacks(survivor_log)
