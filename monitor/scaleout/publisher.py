"""A replica's side of the partials topic: each checkpoint's state, published as one publication.

A publication is built from the very state a checkpoint captured (the same arrays, taken between
two batches with the offsets they reflect), so what the reducer merges is exactly what this
replica could restore. It holds the sub-windows that changed since the last publication that was
sent (every one when a full publication is due, see ``scale_out.full_publish_seconds``) and
tombstones for sub-windows that left the window, each on its (model, stream)'s partition, and,
once all of those are acknowledged, the manifest (the seal) on every partition of the topic: a
reducer owning some partitions sees each of their streams' partials before the seal that binds
them. Building (encoding) and
sending are separate: a publication that could not be sent stays staged and the next checkpoint
replaces it with one that covers both.

Which publication the group's committed offsets match is recorded by the published marker
(:mod:`monitor.scaleout.marker`; docs/operations.md, "Scaling out: exactly-once").
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from monitor.daemon import failpoints
from monitor.logs import RateLimitedLog
from monitor.scaleout import signing
from monitor.scaleout.partials import (
    EpochClock,
    Manifest,
    Offsets,
    Record,
    StreamManifest,
    SubwindowKey,
    WindowGeometry,
    encode_manifest,
    encode_subwindow,
    partition_of,
    tombstones,
)
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings
    from monitor.sources.kafka.clients import Producer

logger = logging.getLogger(__name__)

RECORD_KINDS = ("subwindow", "tombstone", "manifest")  # the `kind` label of embmon_partials_published_total
PRODUCER_OVERHEAD_BYTES = 64 * 1024  # headers, key and batch framing on top of a chunk


@dataclass(frozen=True)
class Held:
    """What the reducer holds of one of our sub-windows: its record count, the epoch that sent it, its chunks."""

    count: int
    epoch: int
    chunks: int


@dataclass(frozen=True)
class Publication:
    epoch: int
    offsets: Offsets
    records: tuple[Record, ...]  # partials and tombstones, each with its (model, stream)
    manifest: Manifest  # sealed on every partition once the records are acknowledged
    held: Mapping[SubwindowKey, Held]  # what the reducer holds once this is sent
    full: bool


@dataclass(frozen=True)
class Sent:
    """The newest publication that reached the broker."""

    epoch: int
    offsets: Offsets
    at: float  # unix time


def producer_config(settings: Settings) -> dict[str, Any]:
    """kafka-python producer settings: the brokers, and the security options of ``kafka.options``."""
    from monitor.sources.kafka.clients import PRODUCER_DEFAULTS

    scale = settings.scale_out
    config: dict[str, Any] = {k: v for k, v in settings.kafka.options.items() if k in PRODUCER_DEFAULTS}
    for consumer_only in ("max_poll_records", "max_poll_interval_ms", "session_timeout_ms", "heartbeat_interval_ms"):
        config.pop(consumer_only, None)
    config.update(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        client_id=f"{settings.kafka.client_id}-partials-{scale.replica_id}",
        acks="all",
        linger_ms=5,
        max_request_size=scale.max_record_bytes + PRODUCER_OVERHEAD_BYTES,
        # kafka-python wants delivery_timeout_ms > linger_ms + request_timeout_ms
        delivery_timeout_ms=int(scale.publish_timeout_seconds * 1000),
        request_timeout_ms=max(500, min(30_000, int(scale.publish_timeout_seconds * 1000) // 2)),
        max_block_ms=int(scale.publish_timeout_seconds * 1000),  # metadata of a missing topic, a full buffer
    )
    return config


class PartialsPublisher:
    """Builds publications from checkpoint captures and sends them: partials by (model, stream), then the seal."""

    def __init__(
        self,
        settings: Settings,
        producer_factory: Callable[[], Producer] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        scale = settings.scale_out
        self.replica = scale.replica_id
        self.topic = scale.partials_topic
        self.max_record_bytes = scale.max_record_bytes
        self.timeout = scale.publish_timeout_seconds
        self.full_every = scale.full_publish_seconds or settings.window.seconds
        self.geometry = WindowGeometry(settings.window.seconds, settings.window.subwindows,
                                       settings.window.reservoir_size, settings.quality.alignment_alpha)
        self.keys = scale.partials_keys()  # the first signs every record (none: unsigned)
        self.instance = uuid.uuid4().hex[:12]
        self.epochs = EpochClock(clock)
        self.clock = clock
        self.records: Tally[str] = Tally()  # by kind
        self.refused: Tally[str] = Tally()  # manifests this replica's resume reader refused, by reason
        self.bytes_total = 0
        self.failures = 0
        self._settings = settings
        self._producer_factory = producer_factory
        self._producer: Producer | None = None
        self._closed = False  # closed publishers build no producer again (its I/O thread would outlive the daemon)
        self._lock = threading.Lock()  # one staging or send at a time
        self._staged: Publication | None = None
        self._held: dict[SubwindowKey, Held] = {}
        self._last_full: float | None = None
        self.sent: Sent | None = None  # read without the lock (one reference swap)
        self._log = RateLimitedLog(logger)

    # ------------------------------------------------------------------ building
    def stage(self, epoch: int, offsets: Offsets, streams: Sequence[Mapping[str, Any]]) -> None:
        """Encode the state of one checkpoint (its registry ``streams``) as the next publication."""
        with self._lock:
            now = self.clock()
            full = self._last_full is None or now - self._last_full >= self.full_every
            records: list[Record] = []
            held: dict[SubwindowKey, Held] = {}
            manifests = []
            for entry in streams:
                model, stream, window = str(entry["model"]), str(entry["stream"]), entry["window"]
                listed = []
                for sub in window["live"]:
                    key = (model, stream, int(sub["index"]))
                    count = int(sub["stats"]["count"])
                    before = self._held.get(key)
                    if full or before is None or before.count != count:
                        encoded = encode_subwindow(self.replica, model, stream, epoch, sub, self.max_record_bytes)
                        records.extend(encoded)
                        held[key] = Held(count, epoch, len(encoded))
                        if before is not None and before.chunks > len(encoded):
                            records.extend(tombstones(self.replica, key, before.chunks)[len(encoded):])
                    else:
                        held[key] = before
                    listed.append((key[2], held[key].epoch, count))
                pairs = window.get("pairs") or {}
                manifests.append(StreamManifest(model, stream, int(window["dim"]), tuple(listed),
                                                len(pairs.get("ids") or ()), int(pairs.get("evicted") or 0)))
            for key, gone in self._held.items():
                if key not in held:
                    records.extend(tombstones(self.replica, key, gone.chunks))
            manifest = Manifest(self.replica, epoch, self.instance, self.geometry, dict(offsets), tuple(manifests))
            self._staged = Publication(epoch, dict(offsets), tuple(records), manifest, held, full)

    @property
    def pending(self) -> bool:
        """A staged publication waits to be sent."""
        return self._staged is not None

    # ------------------------------------------------------------------ sending
    def flush(self) -> bool:
        """Send the staged publication and wait for the broker; True when nothing is left to send."""
        with self._lock:
            publication = self._staged
            if publication is None:
                return True
            if self._closed:  # a checkpoint that ends after the shutdown closed this: its offsets stay uncommitted
                return False
            try:
                self._send(publication)
            except Exception as exc:  # counted; kept staged, the next checkpoint retries
                self.failures += 1
                self._log.warning("publish", "publishing partials to %s failed (%s); offsets are not committed "
                                  "until a publication succeeds", self.topic, exc)
                logger.debug("publish failure", exc_info=True)
                self._drop_producer()
                return False
            self._held = dict(publication.held)
            if publication.full:
                self._last_full = self.clock()
            self.sent = Sent(publication.epoch, publication.offsets, time.time())
            if self._staged is publication:
                self._staged = None
            return True

    def _send(self, publication: Publication) -> None:
        producer = self._ensure_producer()
        partitions = sorted(producer.partitions_for(self.topic) or [0])
        where = {s: partition_of(s[0], s[1], partitions) for s in {r.stream for r in publication.records if r.stream}}
        self._deliver(producer, [(r, where[r.stream]) for r in publication.records if r.stream is not None])
        manifest = publication.manifest
        streams = tuple(replace(s, partition=partition_of(s.model, s.stream, partitions)) for s in manifest.streams)
        seal = encode_manifest(replace(manifest, streams=streams))
        self.seal(producer, seal, partitions[:1])
        if self.sent is None or publication.offsets != self.sent.offsets:  # only when it binds new records
            failpoints.reach("replica-sealing")  # tests: killed with the seal on the first partition only
        self.seal(producer, seal, partitions[1:])

    def seal(self, producer: Producer, record: Record, partitions: Sequence[int]) -> None:
        """Write one manifest to each of ``partitions`` and wait for the broker."""
        if partitions:
            self._deliver(producer, [(record, p) for p in partitions])

    def complete_seal(self, record: Record, partitions: Sequence[int]) -> bool:
        """Write a manifest (another replica's, killed while sealing it) where it is missing; False
        (logged) when the broker did not take it."""
        with self._lock:
            if self._closed:
                return False
            try:
                self.seal(self._ensure_producer(), record, partitions)
            except Exception as exc:  # noqa: BLE001 - reported; the caller goes on without it
                self._log.warning("seal", "completing a publication's seal on %s failed (%s)", self.topic, exc)
                self._drop_producer()
                return False
            return True

    def _deliver(self, producer: Producer, records: Sequence[tuple[Record, int]]) -> None:
        futures = [producer.send(self.topic, key=record.key, value=record.value, partition=partition,
                                 headers=list(signing.sign(self.keys, record.key, record.value, record.headers)))
                   for record, partition in records]
        deadline = time.monotonic() + self.timeout
        producer.flush(timeout=self.timeout)
        for future in futures:
            future.get(timeout=max(0.1, deadline - time.monotonic()))
        for record, _ in records:
            kind = "tombstone" if record.value is None else dict(record.headers).get("embmon-kind", b"").decode()
            self.records.add(kind)
            self.bytes_total += len(record.value or b"")

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            if self._producer_factory is not None:
                self._producer = self._producer_factory()
            else:
                from monitor.sources.kafka.clients import new_producer

                self._producer = new_producer(producer_config(self._settings), self._settings.kafka)
        return self._producer

    def _drop_producer(self, timeout: float = 1.0) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            from monitor.sources.kafka.clients import close_producer

            try:
                close_producer(producer, timeout)
            except Exception:  # already failing; a fresh producer comes next time
                logger.debug("closing the partials producer", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            # at shutdown, time for the producer's network thread to end and close its sockets (1 s was
            # not always enough on a busy machine: the thread and a socket outlived the daemon)
            self._drop_producer(timeout=5.0)
