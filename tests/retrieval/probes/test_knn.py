"""Exact k-NN (monitor/retrieval/probes/knn.py) against a brute-force numpy reference, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.retrieval.probes.deadline import ProbeDeadline, ProbeTimeout
from monitor.retrieval.probes.knn import exact_topk, prepare


def exact_scores(queries: np.ndarray, docs: np.ndarray, similarity: str) -> np.ndarray:
    """Every (query, document) score in float64."""
    q = queries.astype(np.float64)
    d = docs.astype(np.float64)
    if similarity == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
    if similarity == "l2":
        return -((q[:, None, :] - d[None, :, :]) ** 2).sum(-1)
    return q @ d.T


def brute_force(queries: np.ndarray, docs: np.ndarray, k: int, similarity: str, exclude=None):  # type: ignore[no-untyped-def]
    """Score every pair in float64, order by (score desc, index asc) with a full sort."""
    scores = exact_scores(queries, docs, similarity)
    indices, values = [], []
    for i, row in enumerate(scores):
        order = [j for j in np.lexsort((np.arange(len(row)), -row)) if exclude is None or j != exclude[i]]
        indices.append(order[:k] + [-1] * (k - len(order[:k])))
        values.append([row[j] for j in order[:k]])
    return np.asarray(indices), values


def tied_data(rng: np.random.Generator, n_docs: int, n_queries: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Small-integer vectors: float32 dot products are exact, and many scores tie."""
    docs = rng.integers(-2, 3, size=(n_docs, dim)).astype(np.float32)
    docs[np.all(docs == 0, axis=1), 0] = 1
    docs[n_docs // 2 :: 7] = docs[0]  # exact duplicates of one document
    queries = rng.integers(-2, 3, size=(n_queries, dim)).astype(np.float32)
    queries[np.all(queries == 0, axis=1), 0] = 1
    return queries, docs


@pytest.mark.parametrize("block_size", [3, 17, 64, 10_000])
@pytest.mark.parametrize("k", [1, 5, 23])
def test_dot_with_ties_equals_brute_force_across_block_sizes(block_size: int, k: int) -> None:
    rng = np.random.default_rng(block_size * 100 + k)
    queries, docs = tied_data(rng, 200, 40, 4)
    result = exact_topk(queries, docs, k, similarity="dot", block_size=block_size, query_block_size=16)
    expected_idx, expected_val = brute_force(queries, docs, k, "dot")
    # ties are everywhere in this data: the order must still be exactly (score desc, index asc)
    assert (np.diff(docs @ queries.T, axis=0) == 0).any()
    np.testing.assert_array_equal(result.indices, expected_idx)
    np.testing.assert_allclose(result.scores, np.asarray(expected_val), rtol=0, atol=0)


def test_many_documents_tied_at_the_kth_place_pick_the_lowest_indices() -> None:
    docs = np.ones((50, 3), dtype=np.float32)  # every document scores the same
    docs[37] = [2, 2, 2]
    result = exact_topk(np.ones((2, 3), dtype=np.float32), docs, 4, similarity="dot", block_size=8)
    assert result.indices.tolist() == [[37, 0, 1, 2], [37, 0, 1, 2]]


@pytest.mark.parametrize("similarity", ["cosine", "dot", "l2"])
def test_random_float_data_matches_brute_force(similarity: str) -> None:
    rng = np.random.default_rng(5)
    docs = rng.standard_normal((500, 24)).astype(np.float32)
    queries = rng.standard_normal((30, 24)).astype(np.float32)
    result = exact_topk(queries, docs, 10, similarity=similarity, block_size=128)
    expected_idx, expected_val = brute_force(queries, docs, 10, similarity)
    np.testing.assert_array_equal(result.indices, expected_idx)
    np.testing.assert_allclose(result.scores, np.asarray(expected_val), rtol=1e-4, atol=1e-4)


def test_exclude_leaves_out_each_querys_own_row_even_among_duplicates() -> None:
    rng = np.random.default_rng(2)
    queries, docs = tied_data(rng, 120, 1, 4)
    rows = np.array([0, 5, 60, 67, 119])  # 60, 67 are duplicates of row 0
    result = exact_topk(docs[rows], docs, 6, similarity="dot", block_size=32, exclude=rows)
    expected_idx, _ = brute_force(docs[rows], docs, 6, "dot", exclude=rows)
    np.testing.assert_array_equal(result.indices, expected_idx)
    assert not np.any(result.indices == rows[:, None])


def test_fewer_documents_than_k_pad_with_minus_one_and_minus_inf() -> None:
    docs = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    result = exact_topk(np.array([[1, 0.1]], dtype=np.float32), docs, 5, block_size=2, exclude=np.array([2]))
    assert result.indices.tolist() == [[0, 1, -1, -1, -1]]
    assert np.isneginf(result.scores[0, 2:]).all() and np.isfinite(result.scores[0, :2]).all()
    empty = exact_topk(np.ones((2, 2), dtype=np.float32), np.empty((0, 2), dtype=np.float32), 3)
    assert empty.indices.tolist() == [[-1] * 3] * 2


def test_dimension_mismatch_and_bad_arguments_fail_early() -> None:
    with pytest.raises(ValueError, match="dimension 3 but documents 2"):
        exact_topk(np.ones((1, 3), dtype=np.float32), np.ones((4, 2), dtype=np.float32), 2)
    with pytest.raises(ValueError, match="k must be"):
        exact_topk(np.ones((1, 2), dtype=np.float32), np.ones((4, 2), dtype=np.float32), 0)
    with pytest.raises(ValueError, match="similarity"):
        prepare(np.ones((2, 2)), "hamming")


def test_the_deadline_is_checked_between_blocks() -> None:
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 3:
            raise ProbeTimeout("stop")

    docs = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
    with pytest.raises(ProbeTimeout):
        exact_topk(docs[:2], docs, 3, block_size=10, check=check)
    assert len(calls) == 4  # it stopped at the fourth of ten blocks
    exact_topk(docs[:2], docs, 3, block_size=10, check=ProbeDeadline.starting_now(60).check)  # ample time: no raise


# The CUDA path (monitor/retrieval/probes/knn_torch.py) run on torch's CPU backend against the
# numpy path, through exact_topk: the same neighbours in the same order, ties included; scores
# equal where the products are exact (small integers) and to float32 rounding otherwise
# (the two BLAS libraries may sum a dot product in another order: rtol 1e-6).
def on_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from monitor.retrieval.probes import knn, knn_torch

    monkeypatch.setattr(knn, "block_ops", lambda device: knn_torch.TorchBlocks("cpu"))


@pytest.mark.parametrize("similarity", ["cosine", "dot", "l2"])
def test_torch_and_numpy_find_the_same_neighbours_in_random_data(
    monkeypatch: pytest.MonkeyPatch, similarity: str
) -> None:
    rng = np.random.default_rng(8)
    docs = rng.standard_normal((3000, 32)).astype(np.float32)
    queries = rng.standard_normal((70, 32)).astype(np.float32)
    exclude = rng.integers(-1, 3000, size=70)
    kwargs = {"similarity": similarity, "block_size": 700, "query_block_size": 32, "exclude": exclude}
    numpy_result = exact_topk(queries, docs, 15, **kwargs)
    on_torch(monkeypatch)
    torch_result = exact_topk(queries, docs, 15, **kwargs)
    np.testing.assert_allclose(torch_result.scores, numpy_result.scores, rtol=1e-6, atol=1e-5)
    # the same neighbours, except where two documents' scores differ by less than float32 rounding
    # (−‖q − d‖² ≈ −64 here: ~1e-5) and the two products round them into the other order
    differ = np.argwhere(torch_result.indices != numpy_result.indices)
    assert len(differ) <= 0.01 * torch_result.indices.size
    scores = exact_scores(queries, docs, similarity)
    for row, col in differ:
        gap = scores[row, torch_result.indices[row, col]] - scores[row, numpy_result.indices[row, col]]
        assert abs(gap) < 1e-5 * max(1.0, abs(scores[row]).max()), (row, col, gap)


@pytest.mark.parametrize("block_size", [3, 17, 10_000])
def test_torch_and_numpy_break_ties_alike(monkeypatch: pytest.MonkeyPatch, block_size: int) -> None:
    rng = np.random.default_rng(9)
    queries, docs = tied_data(rng, 300, 40, 4)
    exclude = np.arange(40) * 7
    kwargs = {"similarity": "dot", "block_size": block_size, "query_block_size": 16, "exclude": exclude}
    numpy_result = exact_topk(queries, docs, 23, **kwargs)
    on_torch(monkeypatch)
    torch_result = exact_topk(queries, docs, 23, **kwargs)
    np.testing.assert_array_equal(torch_result.indices, numpy_result.indices)
    np.testing.assert_array_equal(torch_result.scores, numpy_result.scores)
