"""What the ingest hooks keep for the index probe, and how a cycle draws from it.

* :class:`ProbeQuery`: a query vector with the filter it was served under (from an interaction
  event or a golden file);
* :func:`draw`: the cycle's queries: a uniform draw of the recent ones (the overall estimate),
  plus up to ``min_per_scope`` extra draws from each scope the uniform draw under-covers (the
  per-scope numbers), within the budget;
* :class:`IdSketch`: the ids of the embedding stream kept by a bottom-k hash sample, each with its
  latest vector: a uniform sample of the distinct ids, the same ids every cycle, O(1) per row on
  the ingest thread.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monitor.index.connectors.base import Filter
from monitor.index.estimators import NONE, scope_label

MAX_GOLDEN_QUERIES = 100_000


@dataclass(frozen=True, slots=True)
class ProbeQuery:
    vector: np.ndarray  # float32 (d,)
    filter: Filter = ()

    def scope(self, field_name: str | None) -> str:
        if field_name is None:
            return NONE
        for key, value in self.filter:
            if key == field_name:
                return scope_label(value)
        return NONE


def draw(
    queries: Sequence[ProbeQuery],
    budget: int,
    scope_field: str | None,
    min_per_scope: int,
    rng: np.random.Generator,
) -> list[tuple[ProbeQuery, bool]]:
    """Up to ``budget`` (query, uniform?) pairs: the uniform draw first, then the scope top-ups.

    The top-ups go round the under-covered scopes one query each per round (the smallest scopes
    first in a round), so no scope takes more than its share of them: a flood of one-query scopes
    cannot starve the others, and one scope's queries cannot take the rounds of the rest.

    >>> qs = [ProbeQuery(np.zeros(2, np.float32), (("tenant", "big"),))] * 95 + \\
    ...      [ProbeQuery(np.ones(2, np.float32), (("tenant", "small"),))] * 5
    >>> picked = draw(qs, 20, "tenant", 3, np.random.default_rng(0))
    >>> len(picked) <= 20, sum(q.scope("tenant") == "small" for q, _ in picked) >= 3
    (True, True)
    """
    n = len(queries)
    if n == 0 or budget <= 0:
        return []
    by_scope: dict[str, list[int]] = {}
    if scope_field is not None and min_per_scope > 0:
        for i, q in enumerate(queries):
            by_scope.setdefault(q.scope(scope_field), []).append(i)
        by_scope.pop(NONE, None)
    reserve = min(budget // 2, sum(min(min_per_scope, len(v)) for v in by_scope.values()))
    uniform_size = min(n, budget - reserve)
    chosen = rng.choice(n, size=uniform_size, replace=False)
    taken = set(chosen.tolist())
    picked = [(queries[i], True) for i in chosen.tolist()]
    left = budget - len(picked)
    # under-covered scopes, one top-up each per round, the smallest first in a round
    order = sorted(by_scope.items(), key=lambda item: len(item[1]))
    wants = {scope: min_per_scope - sum(1 for i in members if i in taken) for scope, members in order}
    free = {scope: [members[int(j)] for j in rng.permutation(len(members)).tolist() if members[int(j)] not in taken]
            for scope, members in order}
    for _round in range(min_per_scope):
        for scope, _members in order:
            if left <= 0:
                return picked
            if wants[scope] <= 0 or not free[scope]:
                continue
            i = free[scope].pop()
            wants[scope] -= 1
            taken.add(i)
            picked.append((queries[i], False))
            left -= 1
    return picked


def read_golden(path: Path, limit: int = MAX_GOLDEN_QUERIES) -> list[ProbeQuery]:
    """Golden queries: JSONL of ``{"query_vector": [...], "filter": {...}}``; ValueError names the line."""
    from monitor.decoding.decoder import parse_filter  # the interaction events' own filter rules

    out = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
            vector = np.asarray(row["query_vector"], dtype=np.float32)
            if vector.ndim != 1 or vector.size == 0 or not np.isfinite(vector).all() or not vector.any():
                raise ValueError("query_vector must be a non-zero list of finite numbers")
            out.append(ProbeQuery(vector, parse_filter(row.get("filter"))))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} line {number}: {exc}") from None
        if len(out) > limit:
            raise ValueError(f"{path}: more than {limit} queries")
    return out


HASH_MAX = 2**64 - 1
# keyed with a random key of this process: nobody outside can compute which ids the sketch keeps
_KEYED = hashlib.blake2b(digest_size=8, key=os.urandom(16))


def id_hash(ident: str) -> int:
    """The sketch's hash of an id: 64-bit keyed BLAKE2b with a random key of this process.

    Keyed, so ids cannot be ground to land in the sample: with a plain hash (CRC-32) anyone who
    writes records can pick ids the sketch keeps (a few tries each) and steer the census; the
    sketch lives in memory only, so a key per process loses nothing.
    """
    h = _KEYED.copy()  # the keyed state, copied: cheaper than keying anew per id
    h.update(ident.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "big")


class IdSketch:
    """A bottom-k sample of the distinct ids of a stream, each with its latest vector.

    An id is kept while its hash is among the ``capacity`` smallest seen; every later row of a
    kept id replaces its vector (the latest wins). Once full, ``threshold`` is the largest kept
    hash: the kept ids are exactly the stream's ids with a hash at most that, a uniform sample of
    the distinct ids whatever their frequencies, and an index id with a hash at most that which is
    not kept was never seen (an orphan, or an id older than the monitor's memory).
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._heap: list[tuple[int, str]] = []  # max-heap by hash (negated)
        self._rows: dict[str, tuple[int, np.ndarray, float]] = {}  # id -> (hash, vector, last seen)
        self._lock = threading.Lock()
        self.seen_rows = 0

    @property
    def threshold(self) -> int:
        """Hashes up to this are all kept (:data:`HASH_MAX` until the sketch is full)."""
        with self._lock:
            if len(self._rows) < self.capacity:
                return HASH_MAX
            return -self._heap[0][0]

    def add(self, ids: Sequence[str | None], vectors: np.ndarray, now: float) -> None:
        """Ingest thread: one hash per row; only rows under the threshold touch the heap."""
        limit = self.threshold
        hits = []
        for row, ident in enumerate(ids):
            if ident is None:
                continue
            h = id_hash(ident)
            if h <= limit:
                hits.append((row, ident, h))
        with self._lock:
            self.seen_rows += len(ids)
            for row, ident, h in hits:
                if ident in self._rows:
                    self._rows[ident] = (h, np.array(vectors[row], dtype=np.float32), now)
                    continue
                if len(self._rows) < self.capacity:
                    heapq.heappush(self._heap, (-h, ident))
                elif h < -self._heap[0][0]:
                    _, evicted = heapq.heapreplace(self._heap, (-h, ident))
                    self._rows.pop(evicted, None)
                else:
                    continue
                self._rows[ident] = (h, np.array(vectors[row], dtype=np.float32), now)

    def items(self) -> list[tuple[str, np.ndarray, float]]:
        """(id, latest vector, last seen) of every kept id."""
        with self._lock:
            return [(ident, vector, seen) for ident, (_h, vector, seen) in self._rows.items()]

    def __contains__(self, ident: object) -> bool:
        return ident in self._rows

    def __len__(self) -> int:
        return len(self._rows)
