"""Reference-model agreement on two real embedding models: all-MiniLM-L6-v2 as the reference, and
(1) itself, (2) itself rotated into 512 dimensions, (3) itself truncated to its first 2 layers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.config import load_settings
from monitor.retrieval.probes.agreement import agreement_per_query
from monitor.retrieval.probes.component import ProbeComponent
from tests.support.probes import collect, probe_context, window_of
from tests.support.realdata import help_topic_sentences, load_minilm, minilm_encode, stored_encoding
from tests.support.scrape import value

K = 10


def sentences(limit: int) -> list[str]:
    """Real English sentences from the Python reference manual's help topics (offline)."""

    def keep(sentence: str) -> bool:
        return 6 <= len(sentence.split()) <= 24 and sentence[:1].isupper() and sentence.endswith(".")

    return list(itertools.islice(help_topic_sentences(keep), limit))


@pytest.fixture(scope="module")
def embeddings() -> dict[str, Any]:
    texts = sentences(300)
    reference = minilm_encode(tuple(texts), batch_size=64, normalize=True)

    def first_two_layers() -> np.ndarray:
        shallow = load_minilm()  # a private copy: its layers are cut
        encoder = shallow[0].auto_model.encoder
        encoder.layer = encoder.layer[:2]  # a genuinely different (weaker) model: the first 2 of 6 layers
        return shallow.encode(texts, batch_size=64, normalize_embeddings=True)

    truncated = stored_encoding(tuple(texts), ("minilm, first 2 of 6 layers", 64, True), first_two_layers)
    basis, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((512, 384)))
    rotated = (reference.astype(np.float64) @ basis.T).astype(np.float32)  # 512-d, same cosines
    ids = [f"s{i}" for i in range(len(texts))]
    return {"ids": ids, "reference": reference, "same": reference.copy(), "rotated": rotated, "truncated": truncated}


def run_agreement(tmp_path: Path, embeddings: dict[str, Any], candidate: str, **extra: Any) -> dict:  # type: ignore[type-arg]
    ids = embeddings["ids"]
    # the candidate's sample holds every id but the first 20, the reference's every id but the last 20
    windows = {
        ("minilm", "documents"): window_of(embeddings["reference"][:-20], ids[:-20], model="minilm"),
        (candidate, "documents"): window_of(embeddings[candidate][20:], ids[20:], model=candidate),
    }
    settings = load_settings(overrides={"state_dir": str(tmp_path), "probes": {
        "device": "cpu", "statistics": {"resamples": 300},
        "agreement": [{"name": "shadow", "reference": {"model": "minilm"}, "candidate": {"model": candidate},
                       "k": [5, K], "queries": 120, "pairs": 5000, **extra}]}})
    component = ProbeComponent(probe_context(settings, windows))
    result = component.run_probe("shadow")
    assert result is not None and result.notes == ("260 ids in both samples",)
    return collect(component)


@pytest.mark.slow  # over 5 s on the 2-core machine (.cache/test-durations.json)
def test_identical_models_agree_perfectly(tmp_path: Path, embeddings: dict[str, Any]) -> None:
    s = run_agreement(tmp_path, embeddings, "same")
    labels = {"probe": "shadow", "model": "same", "slice": "all"}
    for family in ("recall", "ndcg", "mrr", "map"):
        for k in ("5", str(K)):
            assert value(s, f"embmon_retrieval_{family}", **labels, k=k) == 1.0, (family, k)
    assert value(s, "embmon_retrieval_similarity_spearman", probe="shadow", model="same") == pytest.approx(1.0)
    assert value(s, "embmon_retrieval_queries", **labels) == 120


def test_a_different_dimension_with_the_same_geometry_agrees(tmp_path: Path, embeddings: dict[str, Any]) -> None:
    s = run_agreement(tmp_path, embeddings, "rotated")
    labels = {"probe": "shadow", "model": "rotated", "slice": "all", "k": str(K)}
    assert value(s, "embmon_retrieval_recall", **labels) > 0.99  # float32 rounding may swap a near tie
    assert value(s, "embmon_retrieval_similarity_spearman", probe="shadow", model="rotated") > 0.9999


def test_a_truncated_model_agrees_less(tmp_path: Path, embeddings: dict[str, Any]) -> None:
    s = run_agreement(tmp_path, embeddings, "truncated")
    labels = {"probe": "shadow", "model": "truncated", "slice": "all", "k": str(K)}
    recall = value(s, "embmon_retrieval_recall", **labels)
    upper = value(s, "embmon_retrieval_recall_ci_upper", **labels)
    rho = value(s, "embmon_retrieval_similarity_spearman", probe="shadow", model="truncated")
    assert 0.1 < recall < 0.8 and upper < 0.9  # related, but clearly not the same neighbourhoods
    assert 0.1 < rho < 0.8  # measured 0.31: similarity scores far less alike than with itself (1.0)
    # seed 003's Recall@k (overlap / k) computed directly on the same 120 queries equals ours
    ids = embeddings["ids"]
    shared = sorted(set(ids[:-20]) & set(ids[20:]))
    rows = np.array([ids.index(i) for i in shared])
    rng = np.random.default_rng(0)  # the probe's statistics seed picks the queries
    queries = np.sort(rng.choice(len(shared), size=120, replace=False))
    ref, cand = embeddings["reference"][rows].astype(np.float64), embeddings["truncated"][rows].astype(np.float64)
    def top(matrix: np.ndarray, q: int) -> set[int]:
        scores = matrix @ matrix[q] / np.linalg.norm(matrix, axis=1) / np.linalg.norm(matrix[q])
        scores[q] = -np.inf
        return set(np.argsort(-scores, kind="stable")[:K].tolist())

    overlaps = [len(top(ref, q) & top(cand, q)) / K for q in queries]
    assert recall == pytest.approx(np.mean(overlaps), abs=0.01)  # float32 vs float64 near ties only


def test_seed_003_worked_example_binary_and_graded() -> None:
    """Seed 003's Recall@5 example as vectors: reference top 5 [7, 23, 156, 89, 42] -> documents
    1..5; the candidate's [7, 89, 12, 23, 99] -> [1, 4, 6, 2, 7]: hits at ranks 1, 2 and 4."""
    angles_ref = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.2, 1.3])  # from document 0: 1, 2, 3, 4, 5, 6, 7
    angles_cand = np.array([0.0, 0.1, 0.4, 0.9, 0.2, 1.0, 0.3, 0.5])  # from document 0: 1, 4, 6, 2, 7, 3, 5
    ref = np.stack([np.cos(angles_ref), np.sin(angles_ref)], axis=1).astype(np.float32)
    cand = np.stack([np.cos(angles_cand), np.sin(angles_cand)], axis=1).astype(np.float32)
    got = agreement_per_query(ref, cand, np.array([0]), [5], ["recall", "ndcg", "mrr", "map", "map_hits"])
    d = 1 / np.log2(np.arange(2, 7))  # discounts of ranks 1..5
    assert got["recall@5"][0] == pytest.approx(0.60)  # the seed's 3/5
    assert got["mrr@5"][0] == 1.0
    assert got["ndcg@5"][0] == pytest.approx((d[0] + d[1] + d[3]) / d.sum())
    assert got["map@5"][0] == pytest.approx((1 + 1 + 3 / 4) / 5)  # trec_eval: over R = 5
    assert got["map_hits@5"][0] == pytest.approx((1 + 1 + 3 / 4) / 3)  # seed 003: over the hits found
    graded = agreement_per_query(ref, cand, np.array([0]), [5], ["ndcg"], graded=True)
    # grades 5..1 for the reference's ranks 1..5; the candidate shows grades 5, 2, 0, 4, 0
    dcg = 5 * d[0] + 2 * d[1] + 4 * d[3]
    assert graded["ndcg@5"][0] == pytest.approx(dcg / np.dot([5, 4, 3, 2, 1], d))
