"""The in-memory shapes that flow from decoding to state: batches of vectors and interaction events.

Decoding turns every accepted Kafka/file message into one of these; everything downstream
(state, metrics, probes, drift) only ever sees them, never raw bytes or a source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

StreamKey = tuple[str, str]  # (model, stream): what state, drift references and partials are keyed by


@dataclass(frozen=True, slots=True)
class EmbeddingBatch:
    """Rows of one (model, stream), already validated: finite, non-zero, of the model's dimension.

    ``vectors`` is float32 (n, d), C-contiguous. The per-row sequences are ``None`` when no row
    carried that field (the binary fast path carries none of them).
    """

    model: str
    stream: str
    vectors: np.ndarray
    ids: tuple[str, ...] | None = None
    timestamps: np.ndarray | None = None  # event time, unix seconds, float64 (n,)
    slices: tuple[str | None, ...] | None = None
    pair_ids: tuple[str | None, ...] | None = None
    # L2 norms of the rows in float64, when decoding already computed them (it does, to reject
    # zero vectors): state and detectors reuse them instead of another pass over the rows.
    norms: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])


@dataclass(frozen=True, slots=True)
class InteractionEvent:
    """One served query and what happened to it (the interactions topic).

    Fields follow the interaction message format in docs/usage.md; every field but ``model`` is
    optional because different probes need different evidence (served ids for ANN recall,
    clicks or graded relevance for click feedback).
    """

    model: str
    query_id: str | None = None
    query_vector: np.ndarray | None = None  # float32 (d,)
    results: tuple[str, ...] = ()
    clicks: tuple[str, ...] = ()
    relevance: dict[str, float] = field(default_factory=dict)
    slice: str | None = None
    ts: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # the served query's equality predicates (tenant, collection, ...): the index probes re-run the
    # query with the same filter (monitor/index/); sorted (key, value) pairs
    filter: tuple[tuple[str, str | int | float | bool], ...] = ()


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where a message came from, so state can record exactly which offsets it reflects."""

    topic: str
    partition: int
    offset: int
