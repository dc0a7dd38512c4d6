"""From polled messages to state: decoding, the poll and apply threads, backpressure, commits.

Threads:

* ``embmon-poll`` polls the source, decodes, hands each decoded poll to the apply thread and
  commits the offsets the state reflects (kafka-python is not thread-safe, so polling and
  committing stay on one thread). When the apply queue is full it pauses the source and keeps
  polling, so the group never evicts it for not polling (backpressure: the lag grows, nothing is
  dropped);
* ``embmon-apply`` folds batches into the windows (BLAS releases the GIL, so this overlaps with
  polling and JSON parsing on a second core) and calls the components' cheap hooks. Between two
  batches it also runs what must see a consistent state (:meth:`IngestPipeline.at_batch_boundary`:
  checkpoint captures), so state and offsets always agree.

Tests and offline tools skip the threads: :meth:`IngestPipeline.apply_messages` decodes and
applies one poll synchronously.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from threadpoolctl import threadpool_limits

from monitor.component import Component
from monitor.daemon.counters import InternalErrors
from monitor.daemon.offsets import OffsetTracker
from monitor.decoding.decoder import INTERACTIONS_STREAM, Decoder, DecodeResult, RawMessage, StartedDecode
from monitor.decoding.json_workers import JsonWorkerPool
from monitor.logs import RateLimitedLog
from monitor.sources.base import Offsets, Source, SourceMessage
from monitor.state.registry import StateRegistry
from monitor.tally import Tally

if TYPE_CHECKING:
    from monitor.config import Settings

logger = logging.getLogger(__name__)

BUSY_POLLING_CORES = 2  # the poll thread and kafka-python's IO thread
APPLY_QUEUE_POLLS = 8  # polls buffered between the poll and apply threads: bounds memory
OVERFLOW_STREAM = "_overflow"  # invalid-record label for stream names outside the label budget
T = TypeVar("T")


@dataclass
class DecodedPoll:
    """One poll, decoded, on its way to the apply thread."""

    embeddings: DecodeResult
    interactions: DecodeResult
    positions: Offsets  # last offset per partition in the poll


@dataclass
class _StartedPoll:
    """One poll whose decoding started (its JSON possibly in a worker process)."""

    embeddings: StartedDecode
    interactions: list[RawMessage]
    positions: Offsets


@dataclass
class _BoundaryCall:
    """Work to run on the apply thread between two batches; claimed exactly once."""

    work: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    claimed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: Any = None
    error: BaseException | None = None

    def claim(self) -> bool:
        with self.lock:
            if self.claimed:
                return False
            self.claimed = True
            return True

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - handed to the requester
            self.error = exc
        finally:
            self.done.set()


def _logging_death(loop: Callable[[], None]) -> Callable[[], None]:
    """``loop`` as a thread target that logs why it ended, if an exception ended it: the thread is
    gone (``alive`` turns false, ``/healthz`` answers 503) and the log says what killed it."""

    def run() -> None:
        try:
            loop()
        except BaseException:  # logged here, with the traceback, instead of on stderr
            logger.critical("thread %s died; /healthz now fails", threading.current_thread().name, exc_info=True)

    return run


def limit_blas_threads() -> int:
    """Give BLAS one thread per core beyond the two that polling needs (at least one); returns it.

    The statistics product runs on the apply thread while the poll thread and kafka-python's IO
    thread keep a core busy. A BLAS product split over threads waits for its slowest helper, and
    a helper that loses its core to kafka-python stalls the whole product: on 2 cores one thread
    measured 0.62 of the bare consumer's rate at d = 768, two threads 0.41. The limit is
    process-wide (OpenBLAS has one pool), so the refresh's eigendecomposition shares it.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores - BUSY_POLLING_CORES)
    threadpool_limits(limits=threads, user_api="blas")
    return threads


class IngestPipeline:
    """Decodes polls, applies them to the registry and components, tracks offsets and backpressure."""

    def __init__(
        self,
        settings: Settings,
        source: Source,
        decoder: Decoder,
        registry: StateRegistry,
        components: Sequence[Component],
        offsets: OffsetTracker,
        errors: InternalErrors,
        clock: Callable[[], float] = time.time,
    ):
        self.settings = settings
        self.source = source
        self.decoder = decoder
        self.registry = registry
        self.components = components
        self.offsets = offsets
        self.errors = errors
        self.clock = clock
        self.invalid: Tally[tuple[str, str]] = Tally()  # (stream, reason)
        self.interactions: Tally[str] = Tally()  # model
        self._log = RateLimitedLog(logger)
        self._queue: queue.Queue[DecodedPoll | None] = queue.Queue(maxsize=APPLY_QUEUE_POLLS)
        self._backlog: list[DecodedPoll] = []  # decoded polls waiting for room in the queue
        self._backlog_lock = threading.Lock()
        self._inflight = 0  # polls queued or being applied
        self._inflight_cond = threading.Condition()
        self._paused_since: float | None = None
        self._backpressure_seconds = 0.0
        self._pressure_lock = threading.Lock()
        self._boundary: _BoundaryCall | None = None
        self._boundary_lock = threading.Lock()
        # Polls whose decoding started (JSON in a worker) and is finished in order on the poll
        # thread, or by drain() for a hand-off; the lock keeps the two from finishing one twice.
        self._decoding: collections.deque[_StartedPoll] = collections.deque()
        self._decoding_lock = threading.Lock()
        self._json_workers: JsonWorkerPool | None = None
        self._commit_now = threading.Event()
        self._stop = threading.Event()
        self._on_intake_end: Callable[[], None] = lambda: None
        self._poll_thread = threading.Thread(target=_logging_death(self._poll_loop), name="embmon-poll", daemon=True)
        self._apply_thread = threading.Thread(target=_logging_death(self._apply_loop), name="embmon-apply", daemon=True)

    # ------------------------------------------------------------------ synchronous use
    def decode(self, messages: Sequence[SourceMessage]) -> DecodedPoll:
        """Decode one poll on the calling thread."""
        return self._finish_decode(self._start_decode(messages, None))

    def _start_decode(self, messages: Sequence[SourceMessage], workers: JsonWorkerPool | None) -> _StartedPoll:
        readable = [m for m in messages if m.unreadable is None]
        embeddings = [(m.value, m.headers) for m in readable if m.kind == "embeddings"]
        interactions: list[RawMessage] = [(m.value, m.headers) for m in readable if m.kind == "interactions"]
        positions: Offsets = {}
        for m in messages:
            if m.position is not None:
                key = (m.position.topic, m.position.partition)
                positions[key] = max(positions.get(key, -1), m.position.offset)
        started = self.decoder.start_embeddings(embeddings, None if workers is None else workers.submit)
        if len(readable) < len(messages):
            self._reject_unreadable(messages, started)
        return _StartedPoll(started, interactions, positions)

    def _reject_unreadable(self, messages: Sequence[SourceMessage], started: StartedDecode) -> None:
        """Count the records the source could not read (by its reason), as invalid records of the
        stream their topic's records default to; their offsets are applied with the rest."""
        for m in messages:
            if m.unreadable is not None:
                stream = self.decoder.default_stream if m.kind == "embeddings" else INTERACTIONS_STREAM
                where = "" if m.position is None else f" at {m.position.topic}[{m.position.partition}] " \
                    f"offset {m.position.offset}"
                started.result.reject(stream, m.unreadable, detail=f"a record the Kafka client could not read{where}")

    def _finish_decode(self, poll: _StartedPoll) -> DecodedPoll:
        return DecodedPoll(
            self.decoder.finish_embeddings(poll.embeddings),
            self.decoder.decode_interactions(poll.interactions) if poll.interactions else DecodeResult(),
            poll.positions,
        )

    def _finish_decoding(self, keep: int = 0) -> None:
        """Finish started polls, oldest first, until at most ``keep`` remain; enqueue them."""
        with self._decoding_lock:
            while len(self._decoding) > keep:
                self._enqueue(self._finish_decode(self._decoding.popleft()))

    def apply(self, poll: DecodedPoll) -> None:
        """Fold one decoded poll into the state and the components; count what was rejected."""
        now = self.clock()
        for batch in poll.embeddings.batches:
            with self.errors.guard("apply"):
                self.registry.apply(batch, now)
            for component in self.components:
                with self.errors.guard(f"on_embeddings:{component.name}"):
                    component.on_embeddings(batch, now)
        for event in poll.interactions.interactions:
            self.interactions.add(event.model)
            for component in self.components:
                with self.errors.guard(f"on_interaction:{component.name}"):
                    component.on_interaction(event, now)
        for result in (poll.embeddings, poll.interactions):
            if result.rejected:
                bounded: Counter[tuple[str, str]] = Counter()
                for (stream, reason), count in result.rejected.items():
                    bounded[(self._bounded_stream(stream), reason)] += count
                self.invalid.update(bounded)
                for reason, detail in result.examples.items():
                    self._log.warning(f"invalid:{reason}", "skipping invalid record (%s): %s", reason, detail)
        if poll.positions:
            self.offsets.mark_applied(poll.positions)

    def apply_messages(self, messages: Sequence[SourceMessage]) -> None:
        """Decode and apply one poll on the calling thread (tests, offline replays)."""
        self.apply(self.decode(messages))

    def _bounded_stream(self, stream: str) -> str:
        """``stream`` when it is (or may become) a label of some model, else OVERFLOW_STREAM:
        rejected records must not let their stream names through the label budget."""
        if stream == self.decoder.default_stream or stream in self.registry.known_streams():
            return stream
        return OVERFLOW_STREAM

    # ------------------------------------------------------------------ threads
    def start(self, on_intake_end: Callable[[], None] = lambda: None) -> None:
        """Start the apply and poll threads. ``on_intake_end`` runs on the poll thread once intake
        stopped and everything polled was applied, before the last commit (the final checkpoint)."""
        self._on_intake_end = on_intake_end
        limit_blas_threads()
        workers = self.settings.decoding.json_workers
        if workers:
            self._json_workers = JsonWorkerPool(
                self.decoder.json, workers, on_failure=lambda: self.errors.count("json_worker")
            )
        self._apply_thread.start()
        self._poll_thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop intake, apply what was polled, commit; True if both threads ended within ``timeout``."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        for thread in (self._poll_thread, self._apply_thread):
            if thread.ident is not None:
                thread.join(timeout=max(0.1, deadline - time.monotonic()))
        return not (self._poll_thread.is_alive() or self._apply_thread.is_alive())

    @property
    def alive(self) -> bool:
        """Both ingest threads run (only meaningful after :meth:`start`)."""
        return self._poll_thread.is_alive() and self._apply_thread.is_alive()

    def commit_soon(self) -> None:
        """Commit on the poll thread's next turn (a checkpoint just made more offsets durable)."""
        self._commit_now.set()

    def _poll_loop(self) -> None:
        timeout = self.settings.kafka.poll_timeout_seconds
        commit_every = self.settings.kafka.commit_interval_seconds
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                backlogged = self._flush_backlog(wait=min(timeout, 0.1))
                self._set_paused(backlogged)
                try:
                    # Started polls wait for this one: keep the wait short while any is pending.
                    wait = 0.0 if self._decoding else min(timeout, 0.1) if backlogged else timeout
                    messages = self.source.poll(wait)
                except Exception:  # never let a source bug end intake
                    self.errors.count("poll")
                    logger.exception("source poll failed")
                    time.sleep(min(timeout, 1.0))
                    continue
                if messages:
                    if self._json_workers is None:
                        self._enqueue(self.decode(messages))
                    else:
                        # Finish the oldest poll only now: its JSON was parsed in a worker while
                        # this thread polled Kafka for the next one.
                        self._finish_decoding(keep=self._json_workers.size - 1)
                        with self._decoding_lock:
                            self._decoding.append(self._start_decode(messages, self._json_workers))
                else:
                    self._finish_decoding()
                if self._commit_now.is_set() or time.monotonic() - last_commit >= commit_every:
                    self._commit_now.clear()
                    self.commit()
                    last_commit = time.monotonic()
        finally:
            self._finish_intake()

    def _finish_intake(self) -> None:
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds / 2
        with self.errors.guard("decode"):
            self._finish_decoding()
        if self._json_workers is not None:
            self._json_workers.close()
        while self._flush_backlog(wait=0.05) and time.monotonic() < deadline:
            pass
        with contextlib.suppress(queue.Full):  # tell the apply thread to finish what is queued
            self._queue.put(None, timeout=max(0.05, deadline - time.monotonic()))
        self._apply_thread.join(timeout=max(0.05, deadline - time.monotonic()))
        if not self._apply_thread.is_alive():
            with self.errors.guard("shutdown"):
                self._on_intake_end()
        self.commit()
        with self.errors.guard("close:source"):
            self.source.close()

    def commit(self) -> None:
        """Tell the source which offsets the (durable) state reflects (poll thread only)."""
        pending = self.offsets.to_commit()
        if pending:
            self.source.commit(pending)
            self.offsets.mark_committed(pending)

    def _apply_loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                self._serve_boundary()
                continue
            self._serve_boundary()
            if item is None:
                return
            try:
                self.apply(item)
            finally:
                with self._inflight_cond:
                    self._inflight -= 1
                    self._inflight_cond.notify_all()
            self._serve_boundary()

    # ------------------------------------------------------------------ backpressure
    def _enqueue(self, item: DecodedPoll) -> None:
        with self._backlog_lock:
            if not self._backlog:
                try:
                    self._queue.put_nowait(item)
                except queue.Full:
                    pass
                else:
                    with self._inflight_cond:
                        self._inflight += 1
                    return
            self._backlog.append(item)

    def _flush_backlog(self, wait: float) -> bool:
        """Move backlogged polls into the queue; True while some remain (the queue is full)."""
        with self._backlog_lock:
            while self._backlog:
                try:
                    self._queue.put(self._backlog[0], timeout=wait)
                except queue.Full:
                    return True
                self._backlog.pop(0)
                with self._inflight_cond:
                    self._inflight += 1
            return False

    def _set_paused(self, paused: bool) -> None:
        now = time.monotonic()
        if paused and self._paused_since is None:
            self._paused_since = now
            self.source.pause()
            self._log.warning("backpressure", "apply queue full: pausing fetches until it drains (lag will grow)")
        elif not paused and self._paused_since is not None:
            with self._pressure_lock:
                self._backpressure_seconds += now - self._paused_since
            self._paused_since = None
            self.source.resume()

    @property
    def paused(self) -> bool:
        """Fetching is paused because the apply queue is full."""
        return self._paused_since is not None

    def backpressure_seconds(self) -> float:
        """Total time fetching was paused, the current pause included."""
        with self._pressure_lock:
            total = self._backpressure_seconds
        since = self._paused_since
        return total + (time.monotonic() - since if since is not None else 0.0)

    def queue_depth(self) -> int:
        """Decoded polls waiting to be applied (queue plus backlog)."""
        with self._backlog_lock:
            backlog = len(self._backlog)
        return self._queue.qsize() + backlog

    def drain(self, timeout: float) -> bool:
        """Wait until every polled record is applied (backlog and queue empty, nothing in flight)."""
        deadline = time.monotonic() + timeout
        self._finish_decoding()  # polls still being decoded (the poll thread waits in source.poll)
        while self._flush_backlog(wait=0.05):
            if time.monotonic() > deadline or not self._apply_thread.is_alive():
                return False
        with self._inflight_cond:
            while self._inflight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._apply_thread.is_alive():
                    return False
                self._inflight_cond.wait(min(remaining, 0.1))
        return True

    # ------------------------------------------------------------------ batch boundaries
    def at_batch_boundary(self, work: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``work`` where no batch is half-applied: on the apply thread between two batches
        (or right here when that thread is this one or not running). Raises what ``work`` raises,
        or TimeoutError when no boundary came within ``timeout``."""
        if threading.current_thread() is self._apply_thread or not self._apply_thread.is_alive():
            return work()
        call = _BoundaryCall(work)
        with self._boundary_lock:
            self._boundary = call
            try:
                deadline = time.monotonic() + timeout
                while not call.done.wait(0.02):
                    if not self._apply_thread.is_alive() and call.claim():
                        call.run()
                    elif time.monotonic() > deadline:
                        raise TimeoutError("the apply thread did not reach a batch boundary in time")
            finally:
                self._boundary = None
        if call.error is not None:
            raise call.error
        return call.result

    def _serve_boundary(self) -> None:
        call = self._boundary
        if call is not None and call.claim():
            call.run()
