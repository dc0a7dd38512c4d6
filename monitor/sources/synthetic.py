"""A generator of embedding-like vectors with scripted incidents, for the demo and tests.

"Healthy" vectors imitate a real sentence-embedding model rather than white noise: unit-normalised
draws from a Gaussian with a power-law spectrum in a random basis plus a shared mean direction,
which gives an effective-dimension ratio near 0.2 and a mean cosine near 0.15 (what
all-MiniLM-L6-v2 shows on real text, docs/metrics.md). The incident phases then break it the way production
models break: a few directions dominate (anisotropic), everything folds onto a handful of
directions (collapsed), the distribution moves (shifted), a different model ships whose space is a
rotated copy of the old one (swapped: every intrinsic metric unchanged, only canaries and drift
can tell), a share of traffic comes from a topic the reference never had (topic_shift), or the
producer sends garbage (invalid).

With ``ids`` set, the traffic goes as JSON events with ids (``doc-N``; ``topic-N`` for the
records of topic_shift's new topic) instead of binary batches, so the drift explanation's exemplar
ids say which records moved.

With ``canaries`` set, each model also has that many fixed items (ids ``canary-0`` ...), each a
fixed latent draw, re-sent as JSON events every ``canary_period_seconds`` through the phase's
"model": unchanged while healthy, rotated when swapped.

With ``interactions`` set, the source also plays a small search system for the retrieval probes:
a fixed catalog per model (healthy draws with ids, re-emitted on ``catalog_stream`` so the
window always holds it) and interaction events whose served results are the catalog's exact top
k with a known share replaced, clicked with a position bias. Those follow no phase: they are
the steady evidence the probes' gauges and dashboards are read from.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from monitor.sources.base import Source, SourceMessage
from monitor.sources.settings import SyntheticInteractions, SyntheticPhase, SyntheticSourceSettings

BATCH_WAIT_SECONDS = 0.1  # the longest a record waits for its batch to fill


@dataclass
class _ModelGenerator:
    name: str
    dim: int
    basis: np.ndarray  # (d, d) orthonormal
    scales: np.ndarray  # (d,)
    mean: np.ndarray  # (d,)
    shift: np.ndarray  # (d,) direction the "shifted" phase moves to
    rotation: np.ndarray  # (d, d) orthogonal: the "swapped" model's space
    topic: np.ndarray  # (d,) centre of the new topic of "topic_shift"

    TOPIC_SHARE = 0.3  # of the traffic, in the topic_shift phase

    @classmethod
    def create(cls, name: str, dim: int, rng: np.random.Generator) -> _ModelGenerator:
        basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        scales = (np.arange(1, dim + 1) ** -0.38).astype(np.float64)  # eff. dim ratio ~0.2, like MiniLM
        scales /= np.sqrt((scales**2).sum())
        mean = rng.standard_normal(dim)
        mean *= 0.42 / np.linalg.norm(mean)
        shift = rng.standard_normal(dim)
        shift *= 0.42 / np.linalg.norm(shift)
        rotation, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        topic = rng.standard_normal(dim)
        topic *= 0.9 / np.linalg.norm(topic)
        return cls(name, dim, basis, scales, mean, shift, rotation, topic)

    def draw(self, kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.draw_marked(kind, n, rng)[0]

    def draw_marked(self, kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` rows of the phase, and which of them come from the topic_shift's new topic."""
        return self.embed_marked(kind, rng.standard_normal((n, self.dim)), rng)

    def embed(self, kind: str, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The phase's "model" applied to latent draws ``z`` (n, d): unit float32 rows."""
        return self.embed_marked(kind, z, rng)[0]

    def embed_marked(self, kind: str, z: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`embed`, and the mask of rows drawn from the new topic (all False outside topic_shift)."""
        n: int = z.shape[0]
        new = np.zeros(n, dtype=bool)
        scales, mean = self.scales, self.mean
        if kind == "anisotropic":
            scales = scales.copy()
            scales[:4] *= 12.0
            scales /= np.sqrt((scales**2).sum())
        elif kind == "collapsed":
            scales = np.zeros(self.dim)
            scales[:3] = 1.0 / np.sqrt(3)
            z = z + 0.0  # keep draws aligned with the healthy phase's RNG use
        elif kind == "shifted":
            mean = self.shift
        x = mean + (z * scales) @ self.basis.T
        if kind == "collapsed":
            x += 1e-4 * rng.standard_normal(x.shape)
        elif kind == "topic_shift":
            # a share of the traffic from a tight cluster around a direction the reference never saw
            new = rng.random(n) < self.TOPIC_SHARE
            x[new] = self.topic + 0.35 * (z[new] * scales) @ self.basis.T
        elif kind == "swapped":
            x = x @ self.rotation.T
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype("<f4"), new


@dataclass
class _Catalog:
    """A model's synthetic catalog and the search system the interaction events pretend to use."""

    model: _ModelGenerator
    vectors: np.ndarray  # (n, d) unit rows, fixed
    ids: list[str]

    @classmethod
    def create(cls, model: _ModelGenerator, config: SyntheticInteractions, rng: np.random.Generator) -> _Catalog:
        vectors = model.draw("healthy", config.catalog_size, rng)
        return cls(model, vectors, [f"item-{i}" for i in range(config.catalog_size)])

    def documents(self, rows: list[int], stream: str) -> SourceMessage:
        events = [{"id": self.ids[r], "model": self.model.name, "stream": stream, "vector": self.vectors[r].tolist()}
                  for r in rows]
        return SourceMessage(orjson.dumps(events), (), "embeddings")

    def interaction(self, n: int, config: SyntheticInteractions, rng: np.random.Generator) -> dict[str, object]:
        query = self.model.draw("healthy", 1, rng)[0]
        event: dict[str, object] = {"query_id": f"{self.model.name}-q{n}", "model": self.model.name,
                                    "slice": "head" if rng.random() < 0.7 else "tail"}
        if rng.random() < config.zero_result_ratio:
            event["results"] = []
            return event
        k = min(config.k, len(self.ids))
        order = np.argsort(-(self.vectors @ query), kind="stable")
        served = order[:k].copy()
        missed = rng.random(k) < config.ann_miss_ratio  # the "ANN index" returns a far-off item instead
        if missed.any():
            served[missed] = rng.choice(order[len(order) // 2 :], size=int(missed.sum()), replace=False)
        clicks = [self.ids[r] for rank, r in enumerate(served) if rng.random() < 0.5 / (rank + 1)]
        event.update(query_vector=query.tolist(), results=[self.ids[r] for r in served], clicks=clicks)
        return event


class SyntheticSource(Source):
    name = "synthetic"

    def __init__(self, settings: SyntheticSourceSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._rng = np.random.default_rng(settings.seed)
        self._models = [_ModelGenerator.create(m.name, m.dim, self._rng) for m in settings.models]
        self._started_at: float | None = None
        self._emitted = 0  # per model
        self._cycle = sum(p.seconds for p in settings.phases)
        self._catalogs = [_Catalog.create(m, settings.interactions, self._rng) for m in self._models] if (
            settings.interactions is not None
        ) else []
        self._interactions_emitted = 0
        self._catalog_emitted = 0
        canary_rng = np.random.default_rng([settings.seed, 2])  # fixed items, apart from the traffic's draws
        self._canary_latents = {m.name: canary_rng.standard_normal((settings.canaries, m.dim)) for m in self._models}
        self._canary_rounds = 0
        self._ids_emitted: dict[str, int] = {}  # per model, with ``ids``

    def start(self) -> None:
        self._started_at = self._clock()

    def phase_at(self, elapsed: float) -> SyntheticPhase:
        """The scripted phase in force ``elapsed`` seconds after start."""
        phases = self.settings.phases
        if self.settings.loop:
            elapsed %= self._cycle
        for phase in phases:
            if elapsed < phase.seconds:
                return phase
            elapsed -= phase.seconds
        return phases[-1]

    @property
    def current_phase(self) -> SyntheticPhase:
        if self._started_at is None:
            return self.settings.phases[0]
        return self.phase_at(self._clock() - self._started_at)

    def phase_left(self) -> float | None:
        """Seconds until the current phase ends (None once a non-looping script is in its last phase)."""
        elapsed = 0.0 if self._started_at is None else self._clock() - self._started_at
        if self.settings.loop:
            elapsed %= self._cycle
        for phase in self.settings.phases:
            if elapsed < phase.seconds:
                return phase.seconds - elapsed
            elapsed -= phase.seconds
        return None

    @property
    def elapsed(self) -> float:
        """Seconds since the first poll."""
        return 0.0 if self._started_at is None else self._clock() - self._started_at

    def poll(self, timeout: float) -> list[SourceMessage]:
        if self._started_at is None:
            self.start()
        assert self._started_at is not None
        elapsed = self._clock() - self._started_at
        due = int(elapsed * self.settings.rate) - self._emitted
        # wait for a batch's worth (at most BATCH_WAIT_SECONDS of traffic): a producer batches, and
        # one message per record would spend the demo's CPU on per-message overhead
        ready = min(self.settings.batch_size, max(1, int(self.settings.rate * BATCH_WAIT_SECONDS)))
        if due < ready:
            time.sleep(min(timeout, max(0.001, (self._emitted + ready) / self.settings.rate - elapsed)))
            return []
        due = min(due, self.settings.batch_size * 20)
        phase = self.phase_at(elapsed)
        messages: list[SourceMessage] = []
        for start in range(0, due, self.settings.batch_size):
            n = min(self.settings.batch_size, due - start)
            for model in self._models:
                messages.extend(self._messages(model, phase.kind, n))
        self._emitted += due
        messages.extend(self._interaction_messages(elapsed))
        messages.extend(self._canary_messages(elapsed, phase.kind))
        return messages

    def _canary_messages(self, elapsed: float, kind: str) -> list[SourceMessage]:
        """Every canary of every model, once per ``canary_period_seconds`` (the producer's canary job)."""
        if not self.settings.canaries or int(elapsed / self.settings.canary_period_seconds) < self._canary_rounds:
            return []
        self._canary_rounds += 1
        model_kind = "healthy" if kind in ("invalid", "topic_shift", "shifted") else kind  # data phases: same model
        out = []
        for model in self._models:
            rows = model.embed(model_kind, self._canary_latents[model.name], self._rng)
            events = [{"id": f"canary-{i}", "model": model.name, "stream": self.settings.stream, "vector": row.tolist()}
                      for i, row in enumerate(rows)]
            out.append(SourceMessage(orjson.dumps(events), (), "embeddings"))
        return out

    def _interaction_messages(self, elapsed: float) -> list[SourceMessage]:
        config = self.settings.interactions
        if config is None:
            return []
        out: list[SourceMessage] = []
        catalog_due = int(elapsed * config.catalog_size / config.catalog_period_seconds) - self._catalog_emitted
        catalog_due = min(catalog_due, config.catalog_size)  # after a stall, one pass is enough
        if catalog_due > 0:
            rows = [(self._catalog_emitted + i) % config.catalog_size for i in range(catalog_due)]
            for catalog in self._catalogs:
                for start in range(0, len(rows), self.settings.batch_size):
                    out.append(catalog.documents(rows[start : start + self.settings.batch_size], config.catalog_stream))
            self._catalog_emitted += catalog_due
        due = min(int(elapsed * config.rate) - self._interactions_emitted, self.settings.batch_size * 20)
        if due > 0:
            for catalog in self._catalogs:
                events = [catalog.interaction(self._interactions_emitted + i, config, self._rng) for i in range(due)]
                out.append(SourceMessage(orjson.dumps(events), (), "interactions"))
            self._interactions_emitted += due
        return out

    def _messages(self, model: _ModelGenerator, kind: str, n: int) -> list[SourceMessage]:
        rows, topic = model.draw_marked("healthy" if kind == "invalid" else kind, n, self._rng)
        headers = (
            ("model", model.name.encode()),
            ("dim", str(model.dim).encode()),
            ("stream", self.settings.stream.encode()),
        )
        if self.settings.ids:
            out = [self._events(model, rows, topic)]
        else:
            out = [SourceMessage(rows.tobytes(), headers, "embeddings")]
        if kind == "invalid":
            # A broken producer: NaNs in some rows, a truncated JSON event, a wrong-dimension event.
            broken = rows[: max(1, n // 10)].copy()
            broken[:, 0] = np.nan
            out.append(SourceMessage(broken.tobytes(), headers, "embeddings"))
            out.append(
                SourceMessage(b'{"id": "x", "model": "' + model.name.encode() + b'", "vector": [0.1,', (), "embeddings")
            )
            event = {
                "id": "short",
                "model": model.name,
                "vector": [0.5] * (model.dim // 2),
                "stream": self.settings.stream,
            }
            out.append(SourceMessage(orjson.dumps(event), (), "embeddings"))
        return out

    def _events(self, model: _ModelGenerator, rows: np.ndarray, topic: np.ndarray) -> SourceMessage:
        """``rows`` as JSON events with ids: ``doc-N``, or ``topic-N`` for rows of the new topic."""
        first = self._ids_emitted.get(model.name, 0)
        self._ids_emitted[model.name] = first + len(rows)
        events = [
            {"id": f"{'topic' if new else 'doc'}-{first + i}", "model": model.name, "stream": self.settings.stream,
             "vector": row}
            for i, (row, new) in enumerate(zip(rows, topic.tolist(), strict=True))
        ]
        return SourceMessage(orjson.dumps(events, option=orjson.OPT_SERIALIZE_NUMPY), (), "embeddings")
