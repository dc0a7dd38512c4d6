"""Intrinsic metrics: textbook references, the source's worked examples, the collapse rule, and
a real model (all-MiniLM-L6-v2) on real English text."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pydantic
import pytest

from monitor.decoding.records import EmbeddingBatch
from monitor.quality import intrinsic
from monitor.quality.intrinsic import (
    IntrinsicReport,
    collapse_reasons,
    report_from_matrix,
    report_from_snapshot,
    report_from_stats,
    uniformity,
)
from monitor.quality.settings import IntrinsicSettings
from monitor.state.stats import SufficientStats
from monitor.state.window import SlidingWindow
from tests.support.realdata import help_topic_sentences, minilm_encode

GAUGES = [
    "partition_isotropy", "effective_dimension", "effective_dimension_ratio", "top10_variance_ratio",
    "mean_cosine_similarity", "vector_norm_mean", "vector_norm_stddev", "dead_dimensions",
    "effective_rank", "stable_rank", "collapse_detected", "uniformity", "alignment", "dimension",
    "window_records", "sample_records",
]  # fmt: skip


# -- textbook references --------------------------------------------------------------------


def _reference(x: np.ndarray, pairs: list[tuple[int, int]], dead_ratio: float = 0.01, t: float = 2.0) -> dict:
    """Each metric computed the slow, obvious way: np.cov, an SVD, explicit pair loops."""
    x = x.astype(np.float64)
    n, d = x.shape
    centred = x - x.mean(axis=0)
    sigma = np.linalg.svd(centred, compute_uv=False)
    sigma = np.where(sigma > sigma.max() * max(n, d) * np.finfo(float).eps, sigma, 0.0)  # matrix_rank's tolerance
    lam = np.sort(sigma**2 / (n - 1))[::-1]
    units = x / np.linalg.norm(x, axis=1, keepdims=True)
    cosines = units @ units.T
    off_diagonal = cosines[~np.eye(n, dtype=bool)]
    variances = np.diag(np.cov(x, rowvar=False))
    kernel = [
        math.exp(-t * float(np.sum((units[i] - units[j]) ** 2))) for i, j in itertools.combinations(range(n), 2)
    ]
    p = sigma[sigma > 0] / sigma.sum()
    return {
        "partition_isotropy": d * lam.min() / lam.sum(),
        "effective_dimension": lam.sum() ** 2 / (lam**2).sum(),
        "effective_dimension_ratio": lam.sum() ** 2 / (lam**2).sum() / d,
        "top10_variance_ratio": lam[:10].sum() / lam.sum(),
        "mean_cosine_similarity": off_diagonal.mean(),
        "vector_norm_mean": np.linalg.norm(x, axis=1).mean(),
        "vector_norm_stddev": np.linalg.norm(x, axis=1).std(ddof=1),
        "dead_dimensions": int(np.sum(variances < dead_ratio * variances.mean())),
        "effective_rank": math.exp(-np.sum(p * np.log(p))),
        "stable_rank": np.sum(sigma**2) / sigma.max() ** 2,
        "uniformity": math.log(np.mean(kernel)),
        "alignment": np.mean([np.sum((units[i] - units[j]) ** 2) for i, j in pairs]) if pairs else None,
        "dimension": d,
        "window_records": n,
        "sample_records": n,
    }


def _awkward_matrix(n: int = 120, d: int = 14, seed: int = 0) -> np.ndarray:
    """Anisotropic, off-centre, two near-dead dimensions, unequal norms."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.linspace(0.3, 4.0, d) + rng.standard_normal(d) * 2
    x[:, 3] = 0.001 * rng.standard_normal(n) + 1.0
    x[:, d - 1] *= 0.02
    return x.astype(np.float32)


def test_report_fields_are_exactly_the_gauge_names() -> None:
    assert [f.name for f in dataclasses.fields(IntrinsicReport)] == GAUGES
    report = report_from_matrix(_awkward_matrix())
    gauges = report.as_gauges()
    assert set(gauges) == {f"embmon_{name}" for name in GAUGES} - {"embmon_alignment"}  # no pairs
    assert gauges["embmon_window_records"] == 120.0


def test_every_metric_matches_a_textbook_reference() -> None:
    x = _awkward_matrix()
    pair_ids = [f"p{i // 2}" if i < 40 else None for i in range(len(x))]
    pairs = [(i, i + 1) for i in range(0, 40, 2)]
    report = report_from_matrix(x, pair_ids=pair_ids, settings=IntrinsicSettings(uniformity_pair_budget=10_000))
    expected = _reference(x, pairs)
    assert expected["dead_dimensions"] == 2  # the fixture really exercises the rule
    for name, value in expected.items():
        assert getattr(report, name) == pytest.approx(value, rel=1e-6, abs=1e-9), name
    # 2 of 14 dimensions dead is more than the 10 % the collapse rule tolerates.
    assert report.collapse_detected == 1 and collapse_reasons(report) == ["dead_dimensions"]


def test_report_from_snapshot_equals_report_from_the_same_matrix() -> None:
    x = _awkward_matrix(n=90)
    window = SlidingWindow(dim=x.shape[1], window_seconds=60, subwindows=3, reservoir_size=300)
    for k in range(3):
        window.add(EmbeddingBatch("m", "s", x[30 * k : 30 * (k + 1)]), now=20.0 * k)
    snap = window.snapshot(now=40.0)
    assert len(snap.sample) == 90  # the whole window fits in the sample
    from_window = report_from_snapshot(snap)
    from_matrix = report_from_matrix(x)
    for name in GAUGES:
        a, b = getattr(from_window, name), getattr(from_matrix, name)
        assert (a is None and b is None) or a == pytest.approx(b, rel=1e-9), name


def test_alignment_alpha_must_match_the_window() -> None:
    window = SlidingWindow(dim=2, alignment_alpha=1.0)
    window.add(EmbeddingBatch("m", "s", np.ones((3, 2), dtype=np.float32)), now=0.0)
    with pytest.raises(ValueError, match="alignment_alpha"):
        report_from_snapshot(window.snapshot(0.0), IntrinsicSettings(alignment_alpha=2.0))


@pytest.mark.parametrize("block_elements", [7, 130, 4_000_000])
def test_uniformity_is_exact_over_pairs_of_the_prefix_in_any_block_size(
    block_elements: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intrinsic, "_BLOCK_ELEMENTS", block_elements)
    x = _awkward_matrix(n=40, d=6)
    value, used = uniformity(x, t=3.0, pair_budget=10**6)
    assert used == 40 and value == pytest.approx(_reference(x, [], t=3.0)["uniformity"], rel=1e-5)
    # A budget of 45 pairs is exactly the first 10 rows (10 * 9 / 2 = 45).
    value, used = uniformity(x, t=3.0, pair_budget=45)
    assert used == 10 and value == pytest.approx(_reference(x[:10], [], t=3.0)["uniformity"], rel=1e-5)
    assert uniformity(x, pair_budget=44)[1] == 9


def test_uniformity_is_stable_for_a_sharp_kernel() -> None:
    """With t = 200 every kernel value underflows float32; logsumexp keeps the answer finite."""
    x = np.eye(4, dtype=np.float32)  # all pairwise squared distances are 2
    value, _ = uniformity(x, t=200.0)
    assert value == pytest.approx(-400.0)


def test_undefined_values() -> None:
    single = SufficientStats(3)
    single.update(np.ones((1, 3)))
    report = report_from_stats(single, sample=np.ones((1, 3), dtype=np.float32))
    assert math.isnan(report.partition_isotropy) and math.isnan(report.mean_cosine_similarity)
    assert report.uniformity is None and report.alignment is None and report.sample_records == 1
    assert (report.window_records, report.dead_dimensions, report.collapse_detected) == (1, 0, 0)
    assert report.vector_norm_mean == pytest.approx(math.sqrt(3))
    assert set(report.as_gauges()) == {
        "embmon_vector_norm_mean", "embmon_dead_dimensions", "embmon_collapse_detected",
        "embmon_dimension", "embmon_window_records", "embmon_sample_records",
    }  # fmt: skip
    empty = report_from_stats(SufficientStats(3))
    assert empty.window_records == 0 and math.isnan(empty.vector_norm_mean) and empty.sample_records == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("dead_dimension_ratio", 0.5 * 3, "relative to the mean per-dimension variance"),
        ("dead_dimension_ratio", 0.0, "relative"),
        ("uniformity_t", -1.0, "positive finite"),
        ("alignment_alpha", float("inf"), "finite number"),  # every section: allow_inf_nan=False
        ("uniformity_pair_budget", 0, "at least 1"),
        ("collapse_min_records", 1, "at least 2"),
        ("collapse_dead_dimension_share", 1.5, "share between 0 and 1"),
        ("collapse_effective_rank_ratio", -0.1, "share between 0 and 1"),
        ("collapse_stable_rank", 0.5, "at least 1"),
        ("collapse_mean_cosine", 2.0, "cosine between -1 and 1"),
        ("no_such_setting", 1, "Extra inputs are not permitted"),
    ],
)
def test_settings_reject_bad_values_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as error:
        IntrinsicSettings(**{field: value})
    assert field in str(error.value) and message in str(error.value)


# -- the source's worked examples -----------------------------------------------------------


def _seed_isotropy_examples() -> tuple[np.ndarray, np.ndarray]:
    import torch  # the source's examples draw with torch's generator; imported here, not by every collection

    torch.manual_seed(42)
    isotropic = torch.randn(1000, 256)
    anisotropic = torch.randn(1000, 256)
    anisotropic[:, :10] *= 10
    return isotropic.numpy(), anisotropic.numpy()


def _seed_collapse_examples() -> tuple[np.ndarray, np.ndarray]:
    import torch

    torch.manual_seed(42)
    healthy = torch.randn(1000, 256)
    collapsed = torch.randn(1000, 256)
    collapsed[:, 50:] = 0.01 * torch.randn(1000, 206)
    return healthy.numpy(), collapsed.numpy()


def test_seed_isotropy_example_reproduces_the_printed_numbers() -> None:
    """Source prints partition isotropy 0.2481 / 0.0518, effective dim ratio 79.38% / 5.91%,
    mean cosine 0.0001 / -0.0001; our definitions of these equal the source's."""
    isotropic, anisotropic = (report_from_matrix(x) for x in _seed_isotropy_examples())
    assert round(isotropic.partition_isotropy, 4) == 0.2481
    assert round(anisotropic.partition_isotropy, 4) == 0.0518
    assert round(isotropic.effective_dimension_ratio, 4) == 0.7938
    assert round(anisotropic.effective_dimension_ratio, 4) == 0.0591
    assert round(isotropic.mean_cosine_similarity, 4) == 0.0001
    assert round(anisotropic.mean_cosine_similarity, 4) == -0.0001
    # Finite n: even perfectly isotropic data gives λmin/mean λ ≈ (1 − √(d/n))², not 1.
    assert isotropic.partition_isotropy == pytest.approx((1 - math.sqrt(256 / 1000)) ** 2, rel=0.05)
    # Anisotropic is not collapse: the spectrum is skewed, but every direction still varies.
    assert anisotropic.collapse_detected == 0 and anisotropic.top10_variance_ratio > 0.8


def test_seed_collapse_example() -> None:
    """Source prints dead dims 0 / 206 (absolute threshold 0.01), effective rank 247.0 / 61.5."""
    healthy_x, collapsed_x = _seed_collapse_examples()
    healthy, collapsed = report_from_matrix(healthy_x), report_from_matrix(collapsed_x)
    assert round(healthy.effective_rank, 1) == 247.0 and round(collapsed.effective_rank, 1) == 61.5
    # Our relative rule (variance < 1% of the mean per-dimension variance) agrees here: the dead
    # dims have variance 1e-4 against a mean of ≈ 0.195.
    assert healthy.dead_dimensions == 0 and collapsed.dead_dimensions == 206
    assert healthy.collapse_detected == 0 and collapsed.collapse_detected == 1
    assert collapse_reasons(collapsed) == ["dead_dimensions", "effective_rank"]
    # Stable rank Σσ²/σmax²; the source's "(Σσ)²/Σσ²" is a different quantity (239.1 / 53.3).
    assert round(healthy.stable_rank, 1) == 113.0 and round(collapsed.stable_rank, 1) == 33.9
    for x, source_value in [(healthy_x, 239.1), (collapsed_x, 53.3)]:
        sigma = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
        assert round(float(sigma.sum() ** 2 / (sigma**2).sum()), 1) == source_value


def test_relative_dead_dimension_rule_on_a_healthy_unit_normalised_model() -> None:
    """Unit vectors in 384-d have per-dimension variance ≈ 1/384 < 0.01: the source's absolute
    threshold would call all 384 dimensions dead."""
    x = np.random.default_rng(3).standard_normal((2000, 384))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    report = report_from_matrix(x)
    assert int(np.sum(x.var(axis=0, ddof=1) < 0.01)) == 384
    assert report.dead_dimensions == 0 and report.collapse_detected == 0
    assert report.vector_norm_mean == pytest.approx(1.0) and report.vector_norm_stddev < 1e-6


# -- the collapse rule ----------------------------------------------------------------------


def test_near_identical_vectors_are_collapse() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64) + 1e-3 * rng.standard_normal((500, 64))
    report = report_from_matrix(x)
    assert report.mean_cosine_similarity > 0.99 and report.collapse_detected == 1
    assert collapse_reasons(report) == ["mean_cosine"]  # the spectrum of the noise looks healthy


def test_identical_vectors_are_collapse_with_every_dimension_dead() -> None:
    report = report_from_matrix(np.tile(np.arange(1.0, 33.0), (200, 1)))
    assert report.dead_dimensions == 32 and report.collapse_detected == 1
    assert "dead_dimensions" in collapse_reasons(report) and "mean_cosine" in collapse_reasons(report)


def test_collapse_into_a_rotated_subspace_is_caught_by_effective_rank() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1000, 6)) @ rng.standard_normal((6, 128))  # rank 6, no dead axis
    report = report_from_matrix(x)
    assert report.dead_dimensions == 0 and report.effective_rank < 8
    assert collapse_reasons(report) == ["effective_rank"]


def test_one_dominant_direction_is_caught_by_stable_rank() -> None:
    rng = np.random.default_rng(2)
    direction = rng.standard_normal(64)
    direction /= np.linalg.norm(direction)
    x = rng.standard_normal((1000, 64)) + 40 * rng.standard_normal((1000, 1)) * direction
    report = report_from_matrix(x)
    assert report.stable_rank < 1.1 and collapse_reasons(report) == ["stable_rank"]


def test_collapse_needs_enough_records_and_thresholds_are_configurable() -> None:
    identical = np.tile(np.arange(1.0, 9.0), (60, 1))
    assert report_from_matrix(identical).collapse_detected == 0  # 60 < collapse_min_records
    assert report_from_matrix(identical, IntrinsicSettings(collapse_min_records=50)).collapse_detected == 1
    _, collapsed_x = _seed_collapse_examples()
    lenient = IntrinsicSettings(collapse_dead_dimension_share=0.9, collapse_effective_rank_ratio=0.2)
    assert report_from_matrix(collapsed_x, lenient).collapse_detected == 0


# -- a real model on real text --------------------------------------------------------------


def _english_sentences(limit: int) -> list[str]:
    """Short sentences from the Python reference manual's help topics (offline, real prose)."""

    def keep(sentence: str) -> bool:
        return 5 <= len(sentence.split()) <= 20 and sentence[:1].isupper() and sentence.endswith(".")

    return list(itertools.islice(help_topic_sentences(keep), limit))


@pytest.fixture(scope="session")
def minilm_embeddings() -> np.ndarray:
    """all-MiniLM-L6-v2 (384-d, unit-normalised output) on 1,000 real sentences, once per session."""
    sentences = _english_sentences(1000)
    assert len(sentences) == 1000
    return minilm_encode(tuple(sentences), batch_size=128)


@pytest.mark.slow
def test_minilm_on_real_text_is_healthy(minilm_embeddings: np.ndarray) -> None:
    report = report_from_matrix(minilm_embeddings)
    assert report.dimension == 384 and report.window_records == 1000
    assert report.collapse_detected == 0 and collapse_reasons(report) == []
    # The model's final LayerNorm has weight and bias ≈ 0 on 3 of 384 channels, so exactly those
    # 3 coordinates are constant (≈ 1e-33) for every input: genuinely dead, not a false alarm.
    assert report.dead_dimensions == 3
    assert int(np.sum(minilm_embeddings.var(axis=0) < 1e-12)) == 3
    # Values documented in docs/metrics.md ("Reference values").
    assert 0.12 < report.effective_dimension_ratio < 0.35
    assert 0.08 < report.mean_cosine_similarity < 0.25
    assert 0.2 < report.top10_variance_ratio < 0.45
    assert 0.55 < report.effective_rank / 384 < 0.85
    assert 10 < report.stable_rank < 40
    assert -3.6 < report.uniformity < -2.8  # type: ignore[operator]
    assert report.partition_isotropy == 0.0  # 3 constant channels: the covariance is singular
    assert report.vector_norm_mean == pytest.approx(1.0, abs=1e-5) and report.vector_norm_stddev < 1e-5


# -- scale-free: the same data at any scale, rank bounds, collapse at every scale ---------------

RATIO_METRICS = ("partition_isotropy", "effective_dimension", "effective_dimension_ratio", "top10_variance_ratio",
                 "mean_cosine_similarity", "dead_dimensions", "effective_rank", "stable_rank", "collapse_detected")
SCALES = (1e-4, 1.0, 1e4)


def _at_scales(x: np.ndarray) -> list[IntrinsicReport]:
    return [report_from_matrix(np.asarray(x, dtype=np.float64) * c) for c in SCALES]


def _assert_same_ratios(reports: list[IntrinsicReport], rel: float = 1e-9) -> None:
    first = reports[0]
    for other in reports[1:]:
        for name in RATIO_METRICS:
            a, b = getattr(first, name), getattr(other, name)
            assert b == pytest.approx(a, rel=rel, abs=1e-12), (name, a, b)
        # uniformity works on the float32 sample, whose rounding depends on the scale
        assert other.uniformity == pytest.approx(first.uniformity, rel=1e-6)


def rank_k(k: int, n: int = 1000, d: int = 384, seed: int = 0, norm: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)) @ rng.standard_normal((k, d)) + rng.standard_normal(d)
    return x * (norm / np.linalg.norm(x, axis=1).mean())  # one factor for every row: still rank k


def test_every_ratio_metric_is_the_same_at_any_scale() -> None:
    _assert_same_ratios(_at_scales(_awkward_matrix(n=400, d=32)))
    _assert_same_ratios(_at_scales(rank_k(6)))


@pytest.mark.parametrize("k", [1, 6, 20])
def test_a_rank_k_collapse_is_flagged_at_every_scale(k: int) -> None:
    reports = _at_scales(rank_k(k, norm=0.001))  # the case: vectors of norm 0.001
    _assert_same_ratios(reports)
    for report in reports:
        assert report.collapse_detected == 1
        assert report.effective_rank <= k + 1e-9 and report.stable_rank <= k + 1e-9
        assert report.partition_isotropy == 0.0


def test_ranks_are_bounded_by_min_d_and_n_minus_one() -> None:
    ten = np.random.default_rng(3).standard_normal((10, 384))
    for report in _at_scales(ten):
        assert report.effective_rank <= 9 + 1e-9 and report.stable_rank <= 9 + 1e-9
        assert report.effective_dimension <= 9 + 1e-9


def test_identical_vectors_have_rank_zero() -> None:
    report = report_from_matrix(np.tile(np.arange(1.0, 9.0), (200, 1)))
    assert (report.effective_rank, report.stable_rank, report.partition_isotropy) == (0.0, 0.0, 0.0)
    assert math.isnan(report.top10_variance_ratio) and report.collapse_detected == 1


@pytest.mark.slow
def test_real_minilm_embeddings_are_never_flagged_at_any_scale(minilm_embeddings: np.ndarray) -> None:
    reports = _at_scales(minilm_embeddings)
    _assert_same_ratios(reports)
    assert [r.collapse_detected for r in reports] == [0, 0, 0]
    assert [r.dead_dimensions for r in reports] == [3, 3, 3]


def _float32_report(x: np.ndarray) -> IntrinsicReport:
    """The report when the window's product runs in float32 (``window.gram_precision: float32``)."""
    stats = SufficientStats(x.shape[1], "float32")
    for block in np.array_split(np.asarray(x, dtype=np.float32), 10):
        stats.update(block)
    return intrinsic.report_from_stats(stats, sample=None, alignment=(0.0, 0), settings=IntrinsicSettings())


@pytest.mark.parametrize("k", [1, 6, 20])
def test_float32_products_still_flag_a_rank_k_collapse_at_every_scale(k: int) -> None:
    """float32 rounding leaves null directions near 1e-8 of the variance: its own floor zeroes them."""
    for c in SCALES:
        report = _float32_report(rank_k(k, norm=0.001) * c)
        assert report.collapse_detected == 1 and report.partition_isotropy == 0.0
        assert report.effective_rank <= k + 1e-6, (c, report.effective_rank)


@pytest.mark.slow
def test_float32_products_read_real_minilm_like_float64(minilm_embeddings: np.ndarray) -> None:
    """The float32 floor is under MiniLM's smallest real eigenvalue: no real direction is erased."""
    single, double = _float32_report(minilm_embeddings), report_from_matrix(minilm_embeddings)
    assert single.collapse_detected == 0 and single.dead_dimensions == double.dead_dimensions == 3
    for name in ("effective_rank", "stable_rank", "effective_dimension", "top10_variance_ratio"):
        assert getattr(single, name) == pytest.approx(getattr(double, name), rel=1e-5), name
