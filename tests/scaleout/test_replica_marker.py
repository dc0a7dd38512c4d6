"""The replica's commit order on its own: intent, commit, marker; a refused commit keeps the intent."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from monitor.config import load_settings
from monitor.scaleout.marker import MarkerState, PublishedMarker
from monitor.scaleout.partials import EpochClock
from monitor.scaleout.replica import ReplicaRole


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


def role(tmp_path: Path, publisher: Publisher) -> ReplicaRole:
    settings = load_settings(overrides={
        "source": "kafka", "state_dir": str(tmp_path),
        "kafka": {"bootstrap_servers": ["127.0.0.1:1"], "embeddings_topic": "emb"},
        "scale_out": {"role": "replica", "replica_id": "r0", "partials_topic": "partials"},
    })
    return ReplicaRole(settings, publisher=publisher)  # type: ignore[arg-type]


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
