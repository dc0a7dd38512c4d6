"""A stream of real sentences whose topic mix can shift: MiniLM embeddings labelled by help topic.

The first :data:`SENTENCES` help-topic sentences (``realdata.minilm_embeddings``, so one encode per
process) carry their topic (``pydoc_data.topics`` key). :data:`NEW_TOPICS` (the debugger's
commands and the format-string mini-language: 281 sentences) never appear in a reference; the
other 42 topics (919 sentences) are the stream's usual content. Records are drawn with
replacement, like a stream that sees popular items again; a record's id names its sentence
(``s<index>``), so exemplar ids can be checked against topics.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from tests.support.realdata import help_topic_sentences, minilm_embeddings

SENTENCES = 1200
NEW_TOPICS = ("debugger", "formatstrings")


@functools.lru_cache(maxsize=1)
def topic_labels() -> np.ndarray:
    """The help topic of each of the first :data:`SENTENCES` sentences, in ``minilm_embeddings`` order."""
    from pydoc_data.topics import topics

    seen: set[str] = set()
    labels: list[str] = []
    sentences: list[str] = []
    for key in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", topics[key])):
            if sentence not in seen and 30 <= len(sentence) <= 200:
                seen.add(sentence)
                labels.append(key)
                sentences.append(sentence)
    assert sentences[:SENTENCES] == list(help_topic_sentences(lambda s: 30 <= len(s) <= 200))[:SENTENCES]
    return np.array(labels[:SENTENCES])


def embeddings() -> np.ndarray:
    return minilm_embeddings(SENTENCES)


def usual_and_new() -> tuple[np.ndarray, np.ndarray]:
    """Sentence indices of the usual topics and of the new ones."""
    new = np.isin(topic_labels(), NEW_TOPICS)
    return np.flatnonzero(~new), np.flatnonzero(new)


def ids_of(indices: np.ndarray) -> tuple[str, ...]:
    return tuple(f"s{i}" for i in indices)


def topic_of(record_id: str) -> str:
    return str(topic_labels()[int(record_id[1:])])


def draw(rng: np.random.Generator, count: int, new_share: float = 0.0) -> np.ndarray:
    """``count`` sentence indices (records): a ``new_share`` of them from the new topics, the rest
    from the usual ones, in random order."""
    usual, new = usual_and_new()
    fresh = int(round(count * new_share))
    picked = np.r_[rng.choice(usual, count - fresh), rng.choice(new, fresh)]
    return picked[rng.permutation(count)]
