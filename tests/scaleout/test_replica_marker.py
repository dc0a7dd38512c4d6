"""The replica's commit order on its own: intent, commit, marker; a refused commit keeps the intent."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from monitor.config import load_settings
from monitor.scaleout.marker import MarkerState, PublishedMarker
from monitor.scaleout.partials import EpochClock
from monitor.scaleout.replica import ReplicaRole
from monitor.storage.checkpoint_format import CheckpointError


class Publisher:
    def __init__(self) -> None:
        self.epochs = EpochClock()
        self.sent = None


class Source:
    def __init__(self) -> None:
        self.accept = True
        self.commits: list[dict] = []  # type: ignore[type-arg]

    def commit(self, offsets) -> bool:  # type: ignore[no-untyped-def]
        self.commits.append(dict(offsets))
        return self.accept


class Manifests:
    """The partials topic as read at start-up: ``published`` is this replica's newest manifest epoch there."""

    def __init__(self, published: int | None = None) -> None:
        self.published = published

    def newest(self) -> dict[str, SimpleNamespace]:
        return {} if self.published is None else {"r0": SimpleNamespace(epoch=self.published, offsets={})}


def role(tmp_path: Path, publisher: Publisher, manifests: Manifests | None = None) -> ReplicaRole:
    settings = load_settings(overrides={
        "source": "kafka", "state_dir": str(tmp_path),
        "kafka": {"bootstrap_servers": ["127.0.0.1:1"], "embeddings_topic": "emb"},
        "scale_out": {"role": "replica", "replica_id": "r0", "partials_topic": "partials"},
    })
    return ReplicaRole(settings, publisher=publisher, manifests=manifests or Manifests())  # type: ignore[arg-type]


def test_a_refused_commit_leaves_the_restored_epoch_and_the_intent_then_a_commit_marks(tmp_path: Path) -> None:
    PublishedMarker(tmp_path).write("r0", 5)
    publisher, source = Publisher(), Source()
    replica = role(tmp_path, publisher)
    replica.before_restore()
    publisher.sent = SimpleNamespace(epoch=9, offsets={("emb", 0): 40})  # type: ignore[assignment]

    source.accept = False
    replica.commit_published(source)  # type: ignore[arg-type]
    marker = PublishedMarker(tmp_path).read()
    assert marker is not None and marker.epoch == 5  # not moved, and never below what was restored
    assert marker.committing is not None and dict(marker.committing.offsets) == {("emb", 0): 40}

    source.accept = True
    replica.commit_published(source)  # type: ignore[arg-type]
    assert PublishedMarker(tmp_path).read() == MarkerState("r0", 9)
    assert source.commits == [{("emb", 0): 40}, {("emb", 0): 40}]


def test_a_publication_newer_than_the_marker_is_what_a_restart_restores(tmp_path: Path) -> None:
    """Killed after publishing epoch 9 and before committing or marking it: the partials topic is
    the truth (others resume after it), so the checkpoint of epoch 9 is restorable, not newer ones."""
    PublishedMarker(tmp_path).write("r0", 5)
    publisher = Publisher()
    replica = role(tmp_path, publisher, Manifests(published=9))
    replica.before_restore()
    replica.check({"scale_out": {"replica": "r0", "epoch": 9}})  # accepted
    with pytest.raises(CheckpointError) as refused:
        replica.check({"scale_out": {"replica": "r0", "epoch": 10}})
    assert refused.value.reason == "unpublished"
    assert publisher.epochs.next() > 9


def test_an_older_publication_than_the_marker_changes_nothing(tmp_path: Path) -> None:
    PublishedMarker(tmp_path).write("r0", 7)
    replica = role(tmp_path, Publisher(), Manifests(published=3))
    replica.before_restore()
    with pytest.raises(CheckpointError) as refused:
        replica.check({"scale_out": {"replica": "r0", "epoch": 8}})
    assert refused.value.reason == "unpublished"
