"""The replica role: publish each checkpoint's state, and commit only offsets whose state is published.

The order of the durable steps is what keeps the reducer exact across crashes and rebalances
(docs/operations.md, "Scaling out: exactly-once"):

1. a checkpoint is captured between two batches and written (as in single-process mode), tagged
   with this replica's id and a fresh epoch;
2. its state is published (:class:`~monitor.scaleout.publisher.PartialsPublisher`) and the
   broker acknowledged it;
3. the offsets of the newest *published* state are committed (:class:`PublishedOffsetsSource`:
   never offsets whose state is only applied or only on disk);
4. the published marker records that epoch. Before step 3 it records the commit intent, so a
   replica killed between the commit and the marker learns from the broker which of the two
   the group holds (:mod:`monitor.scaleout.marker`).

On restart a checkpoint newer than the marker is not restored (:meth:`ReplicaRole.check`): its
state may be in no publication, and its offsets are not committed, so the records it holds are
read again by whoever owns the partition; the previous checkpoint, which is published, is
restored instead, and republished at start so it replaces whatever this replica had published.
On a rebalance the hand-off publishes before it returns the offsets to commit, and records the
commit intent first, since the commit follows within the listener.

:class:`Replica` is the role: the single daemon (:class:`~monitor.daemon.service.Monitor`) with its
injection points filled in from :class:`ReplicaRole`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from monitor.component import Component
from monitor.daemon import failpoints
from monitor.daemon.checkpointing import Checkpointer
from monitor.daemon.ingest import IngestPipeline
from monitor.daemon.offsets import OffsetTracker
from monitor.daemon.rebalance import PartitionHandoff
from monitor.daemon.service import Monitor
from monitor.errors import ConfigError
from monitor.scaleout.canaries import ARRIVALS, replica_component_factories, with_arrivals
from monitor.scaleout.export import PublisherCollector, SigningCollector
from monitor.scaleout.marker import CommitIntent, MarkerState, PublishedMarker, commit_happened
from monitor.scaleout.publisher import PartialsPublisher
from monitor.scaleout.resume import ManifestReader, published_offsets, resume_after
from monitor.scaleout.signing import warn_if_unsigned
from monitor.sources import build_source
from monitor.sources.base import Offsets, Partition, PartitionListener, Source, SourceMessage
from monitor.state.registry import StateRegistry
from monitor.storage.checkpoint_format import CheckpointError

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from monitor.config import Settings
    from monitor.daemon.features import ComponentFactory

logger = logging.getLogger(__name__)


class ReplicaRole:
    """Ties a replica's checkpoints to its publications and to what it may commit and restore."""

    def __init__(self, settings: Settings, publisher: PartialsPublisher | None = None,
                 manifests: ManifestReader | None = None):
        self.settings = settings
        self.replica = settings.scale_out.replica_id
        self.publisher = publisher or PartialsPublisher(settings)
        self.marker = PublishedMarker(settings.state_dir)
        # the partials topic: where partitions resume (the manifests it refuses are the publisher's to export)
        self.manifests = manifests or ManifestReader(settings, refused=self.publisher.refused)
        self._initial: MarkerState | None = None
        self._marked = -1  # newest epoch in the marker
        self._committed = -1  # newest published epoch whose offsets were committed
        self._last_commit: dict[Partition, int] = {}  # what this replica committed, per partition
        self.floors: dict[Partition, int] = {}  # per partition: last offset before our current assignment

    # ------------------------------------------------------------------ checkpoint observer
    def tag(self) -> dict[str, Any]:
        """Extra checkpoint fields: who wrote it and its epoch (taken with the state, between batches)."""
        return {"replica": self.replica, "epoch": self.publisher.epochs.next()}

    def check(self, state: Mapping[str, Any]) -> None:
        """Refuse to restore a checkpoint another replica wrote, or one this replica never published."""
        tag = state.get("scale_out")
        if tag is None:
            return  # written in single-process mode: its offsets were committed as it was written
        if tag.get("replica") != self.replica:
            raise CheckpointError(
                "incompatible", f"written by replica {tag.get('replica')!r}, this is {self.replica!r}: its records "
                "are in that replica's publications"
            )
        epoch = int(tag["epoch"])
        if self._initial is None:
            logger.warning("no %s: restoring a replica checkpoint that may not have been published", self.marker.path)
        elif epoch > self._initial.epoch:
            raise CheckpointError(
                "unpublished", f"epoch {epoch} was never published and committed (newest that was: "
                f"{self._initial.epoch}); its records will be read again"
            )
        self.publisher.epochs.advance_past(epoch)

    def written(self, state: Mapping[str, Any], offsets: Offsets) -> None:
        """A checkpoint is on disk: build its publication (checkpoints call this in order)."""
        arrivals = (state.get("components") or {}).get(ARRIVALS)  # canary records, by sub-window
        self.publisher.stage(int(state["scale_out"]["epoch"]), offsets, with_arrivals(state["streams"], arrivals))

    def after_write(self) -> None:
        """Send it; its offsets may be committed once the broker has it."""
        self.publisher.flush()

    # ------------------------------------------------------------------ start-up
    def before_restore(self) -> None:
        initial = self.marker.read()
        if initial is not None and initial.replica != self.replica:
            logger.warning("%s belongs to replica %r, this is %r", self.marker.path, initial.replica, self.replica)
            initial = MarkerState(self.replica, 0)
        elif initial is not None:
            if initial.committing is not None:
                initial = self._settle_intent(initial)
            self.publisher.epochs.advance_past(initial.epoch)
        initial = self._newest_published(initial)
        self._initial = initial
        if initial is not None:
            self._marked = initial.epoch  # a commit intent written before the next mark keeps this epoch

    def _settle_intent(self, marker: MarkerState) -> MarkerState:
        """Killed between a commit and its marker: ask the broker whether the commit went through."""
        intent = marker.committing
        assert intent is not None
        positions = group_positions(self.settings, sorted(intent.offsets))
        happened = None if positions is None else commit_happened(intent, positions)
        if happened is None:
            # Another replica has committed past both positions (or the broker did not answer):
            # the newer checkpoint risks doubling records, the older one losing them.
            logger.error(
                "cannot tell whether the commit of epoch %d reached the group before the restart; restoring it "
                "(records read again by another replica may count twice until they leave the window)", intent.epoch)
            happened = True
        logger.info("the commit of epoch %d %s before the restart", intent.epoch,
                    "went through" if happened else "did not go through")
        return MarkerState(marker.replica, intent.epoch if happened else marker.epoch)

    def _newest_published(self, initial: MarkerState | None) -> MarkerState | None:
        """The partials topic is the source of truth: a publication of ours newer than the marker
        (killed after publishing, before committing or marking) is what the reducer holds and what
        the other replicas resume after, so its checkpoint is the one to restore."""
        manifests = self.manifests.newest()
        if manifests is None:
            logger.error("cannot read the partials topic: restoring the checkpoint the marker names (records "
                         "published after it and read again by another replica may count twice)")
            return initial
        ours = manifests.get(self.replica)
        if ours is None or (initial is not None and ours.epoch <= initial.epoch):
            return initial
        logger.info("the partials topic holds our epoch %d, newer than the marker's %s: restoring its checkpoint",
                    ours.epoch, None if initial is None else initial.epoch)
        self.publisher.epochs.advance_past(ours.epoch)
        return MarkerState(self.replica, ours.epoch)

    def complete_seals(self) -> None:
        """A publication sealed on some partitions only (its replica killed while sealing) is the one
        the resume positions count: write its manifest where it is missing, so that every reducer
        holds it whole (:mod:`monitor.scaleout.resume`)."""
        for record, partitions in self.manifests.incomplete():
            if self.publisher.complete_seal(record, partitions):
                logger.info("completed a publication's seal on partitions %s of %s", partitions,
                            self.publisher.topic)

    def publish_restored(self, registry: StateRegistry, offsets: OffsetTracker,
                         components: Sequence[Component] = ()) -> None:
        """Publish the state just restored (or the empty one), in full, under a new epoch.

        It replaces everything this replica published before, including a newer publication whose
        checkpoint was not restored. Its offsets were committed before the crash (commits follow
        publications), so it is marked at once. If the broker is not reachable it stays staged and
        the first checkpoint sends it.
        """
        durable = offsets.durable()
        epoch = self.publisher.epochs.next()
        if self._initial is None:
            self._mark(0)
        arrivals = next((c.state_dict() for c in components if c.name == ARRIVALS), None)
        self.publisher.stage(epoch, durable, with_arrivals(registry.state_dict()["streams"], arrivals))
        if self.publisher.flush():
            self._committed = epoch
            self._mark(epoch)

    # ------------------------------------------------------------------ commits
    def commit_published(self, source: Source) -> None:
        """Commit the offsets of the newest sent publication (if not done yet), then mark it."""
        sent = self.publisher.sent
        if sent is None:
            return
        if sent.epoch > self._committed:
            # never move a partition back below where our current assignment started
            offsets = {k: o for k, o in sent.offsets.items() if o >= self.floors.get(k, -1)}
            if offsets:
                failpoints.reach("replica-published")  # tests: killed between a publication and its commit
                if any(o > self._last_commit.get(k, -1) for k, o in offsets.items()):
                    # tests: the same, at a publication holding records its commit does not (under load
                    # a publication may hold nothing new, and then there is no gap to test)
                    failpoints.reach("replica-published-ahead")
            before = {k: self._last_commit.get(k) for k in offsets}
            self.marker.write(self.replica, self._marked, CommitIntent(sent.epoch, offsets, before))
            if not source.commit(offsets):
                return  # the intent stays: the next poll tries again, and a restart asks the broker
            if offsets:
                failpoints.reach("replica-committed")  # tests: killed between the commit and the marker
            self._last_commit.update(offsets)
            self._committed = sent.epoch
        if sent.epoch > self._marked:
            self._mark(sent.epoch)

    def intend_handoff_commit(self, leaving: set[Partition]) -> dict[Partition, int]:
        """Hand-off: the offsets of the newest sent publication for the partitions leaving, with the
        commit intent recorded (the listener commits them next; the next poll's commit marks it)."""
        sent = self.publisher.sent
        if sent is None:
            return {}
        offsets = {key: offset for key, offset in sent.offsets.items() if key in leaving}
        if offsets and sent.epoch > self._marked:
            before = {k: self._last_commit.get(k) for k in offsets}
            self.marker.write(self.replica, self._marked, CommitIntent(sent.epoch, offsets, before))
        return offsets

    def _mark(self, epoch: int) -> None:
        self.marker.write(self.replica, epoch)
        self._marked = epoch


def group_positions(settings: Settings, partitions: list[Partition]) -> dict[Partition, int | None] | None:
    """The consumer group's committed position per partition (``None``: no commit), or ``None``
    when the broker cannot be asked. A plain consumer that joins no group: OffsetFetch only."""
    from monitor.sources.kafka.clients import KafkaError, TopicPartition, close_consumer, new_consumer
    from monitor.sources.kafka.source import KafkaSource

    config = KafkaSource(settings.kafka).consumer_config()
    try:
        consumer = new_consumer(config, settings.kafka)
    except KafkaError as exc:
        logger.warning("cannot reach Kafka to read the group's committed offsets (%s)", exc)
        return None
    try:
        return {(t, p): consumer.committed(TopicPartition(t, p), timeout_ms=10_000) for t, p in partitions}
    except KafkaError as exc:
        logger.warning("cannot read the group's committed offsets (%s)", exc)
        return None
    finally:
        close_consumer(consumer)


def check_replica_settings(settings: Settings) -> None:
    """A replica must consume Kafka and checkpoint: publications are the state of its checkpoints."""
    if settings.source != "kafka":
        raise ConfigError(f"scale_out.role replica needs source kafka, not {settings.source}")
    if settings.checkpoint.enabled is False:
        raise ConfigError("scale_out.role replica needs checkpoint.enabled (publications are checkpoints)")


def replica_source_settings(settings: Settings) -> Settings:
    """What a replica consumes: the embeddings topic only (the reducer reads interactions itself)."""
    kafka = settings.kafka.model_copy(update={"interactions_topic": None})
    return settings.model_copy(update={"kafka": kafka})


class PublishedOffsetsSource(Source):
    """Wraps the Kafka source so that the daemon's commits become "commit what is published"."""

    def __init__(self, inner: Source, role: ReplicaRole):
        self.inner = inner
        self.role = role
        self.name = inner.name

    def set_listener(self, listener: PartitionListener) -> None:
        self.inner.set_listener(listener)

    def start(self) -> None:
        self.inner.start()

    def poll(self, timeout: float) -> list[SourceMessage]:
        self.role.commit_published(self.inner)
        return self.inner.poll(timeout)

    def commit(self, offsets: Mapping[Partition, int]) -> bool:
        # ``offsets`` are durable (on disk); what may be committed is what is published.
        self.role.commit_published(self.inner)
        return True

    def close(self) -> None:
        self.role.commit_published(self.inner)
        self.inner.close()
        self.role.publisher.close()
        self.role.manifests.close()

    @property
    def up(self) -> bool:
        return self.inner.up

    @property
    def exhausted(self) -> bool:
        return self.inner.exhausted

    def lag(self) -> dict[str, int] | None:
        return self.inner.lag()

    @property
    def lag_updated(self) -> float | None:
        return self.inner.lag_updated

    def error_counts(self) -> dict[str, int]:
        return self.inner.error_counts()

    def offset_reset_counts(self) -> dict[str, int]:
        return self.inner.offset_reset_counts()

    def last_progress(self) -> dict[str, float] | None:
        return self.inner.last_progress()

    def topic_ids(self) -> dict[str, str]:
        return self.inner.topic_ids()

    def remember_topic_ids(self, ids: Mapping[str, str]) -> None:
        self.inner.remember_topic_ids(ids)

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()


class PublishingHandoff(PartitionHandoff):
    """The rebalance hand-off, committing on revocation only what the publication holds."""

    def __init__(
        self, pipeline: IngestPipeline, offsets: OffsetTracker, checkpointer: Checkpointer | None, role: ReplicaRole
    ):
        super().__init__(pipeline, offsets, checkpointer)
        self._role = role

    def on_revoked(self, partitions: list[Partition]) -> dict[Partition, int]:
        super().on_revoked(partitions)  # applies what was polled and checkpoints (which publishes)
        if not self._role.publisher.flush():
            logger.error("hand-off: the newest state could not be published; committing the last published offsets")
        return self._role.intend_handoff_commit(set(partitions))

    def on_assigned(self, positions: Mapping[Partition, int]) -> None:
        super().on_assigned(positions)
        for key, position in positions.items():
            self._role.floors[key] = position - 1

    def on_reset(self, positions: Mapping[Partition, int]) -> None:
        super().on_reset(positions)
        for key, position in positions.items():  # the old floor belongs to the old log
            self._role.floors[key] = position - 1

    def resume_offsets(self) -> dict[Partition, int]:
        """After our state, or after what any replica published, whichever is further
        (:mod:`monitor.scaleout.resume`): records a replica published but did not commit before it
        died are in the reducer already. Unreadable topic: our state only (and the group commit)."""
        own = super().resume_offsets()
        manifests = self._role.manifests.newest()
        if manifests is None:
            logger.error("cannot read the partials topic: resuming from the group's commits (records published "
                         "but not committed by a replica that died may count twice)")
            return own
        self._role.complete_seals()
        return resume_after(own, self._role.manifests.capped(published_offsets(manifests)))


class Replica(Monitor):
    """``scale_out.role: replica``: a daemon that publishes each checkpoint's state for the reducer,
    commits only published offsets, and computes no window metrics (the reducer does)."""

    role = "replica"
    computes_windows = False

    def __init__(self, settings: Settings, *args: Any, **kwargs: Any):
        check_replica_settings(settings)
        warn_if_unsigned(settings.scale_out)
        self.replica = ReplicaRole(settings)
        super().__init__(settings, *args, **kwargs)

    def _source(self, settings: Settings, source: Source | None) -> Source:
        return PublishedOffsetsSource(source or build_source(replica_source_settings(settings)), self.replica)

    def _component_factories(self, settings: Settings) -> list[ComponentFactory]:
        # a replica's drift and probe gauges would be partial answers: the reducer runs them
        # (canary records are forwarded to the reducer, which holds the pins)
        return replica_component_factories(settings)

    def _checkpoint_observer(self) -> ReplicaRole:
        return self.replica

    def _handoff(self) -> PartitionListener:
        return PublishingHandoff(self.pipeline, self.offsets, self.checkpointer, self.replica)

    def _collectors(self) -> list[Collector]:
        return [PublisherCollector(self.replica.publisher),
                SigningCollector(self.settings.scale_out.partials_key_file is not None)]

    def _before_restore(self) -> None:
        self.replica.before_restore()

    def _after_restore(self) -> None:
        self.replica.publish_restored(self.registry, self.offsets, self.components)

