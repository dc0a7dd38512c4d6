"""Ranking-quality metrics, computed for many queries at once.

Every metric here is a function of two matrices, not of per-query Python objects:

- ``grades`` (Q, K): the relevance grade of the document at each rank of each query's ranking
  (0 for unjudged documents and for the padding past the end of a short list);
- ``ideal_grades`` (Q, J): each query's positive judged grades sorted descending (0-padded), from
  which the number of relevant documents and the ideal DCG follow.

A metric is then a running sum along the rank axis read at the cutoff, so a whole family
(``ndcg@5``, ``ndcg@10``, ``ndcg@100``) costs one cumulative sum. Where trec_eval has the measure,
the numbers equal trec_eval's (checked against ``pytrec_eval`` in ``tests/retrieval/test_metrics.py``);
``docs/retrieval.md`` has every formula and where the seeds' variants differ.

Examples
--------
>>> results = RankedResults.from_lists(
...     [["d1", "d2", "d3"], ["d9", "d7"]],
...     [{"d2": 1, "d3": 2}, {"d7": 1, "d8": 1}],
... )
>>> scores = evaluate(results, ["precision@2", "recall@2", "mrr", "ndcg@3"])
>>> {name: values.round(4).tolist() for name, values in scores.items()}
{'precision@2': [0.5, 0.5], 'recall@2': [0.5, 0.5], 'mrr': [0.5, 0.5], 'ndcg@3': [0.6199, 0.3869]}
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import Literal, TypeVar

import numpy as np

__all__ = [
    "METRIC_FAMILIES",
    "RankingMetric",
    "RankedResults",
    "UnknownMetricError",
    "evaluate",
    "expand_metrics",
    "parse_metric",
    "qrels_from_reference",
]

Gain = Literal["linear", "exponential"]

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, float]]
_Id = TypeVar("_Id", bound=Hashable)  # a document id: str from files and probes, any hashable in from_lists

# How each family treats a cutoff: "required" (precision@k), "optional" (no cutoff = the whole
# ranking, as trec_eval's map / ndcg / recip_rank), "none" (r_precision: its cutoff is R itself).
_CUTOFF_REQUIRED, _CUTOFF_OPTIONAL, _CUTOFF_NONE = "required", "optional", "none"

# Elements compared per block when placing relevant documents (bounds memory for long rankings).
_COMPARE_BLOCK = 1 << 18

_METRIC_NAME = re.compile(r"^(?P<family>[a-z_]+)(?:@(?P<k>[0-9]+))?\Z")


class UnknownMetricError(ValueError):
    """A metric name that does not parse, names no family, or uses a cutoff the wrong way."""


@dataclass(frozen=True, slots=True)
class RankingMetric:
    """One metric to compute: a family and a cutoff (``None`` = the whole ranking)."""

    family: str
    k: int | None = None

    @property
    def name(self) -> str:
        return self.family if self.k is None else f"{self.family}@{self.k}"

    def __str__(self) -> str:
        return self.name


def parse_metric(name: str | RankingMetric) -> RankingMetric:
    """Parse ``"ndcg@10"``, ``"map"`` or ``"r_precision"``; raise ``UnknownMetricError`` otherwise.

    >>> parse_metric("NDCG@10")
    RankingMetric(family='ndcg', k=10)
    >>> parse_metric("precision")
    Traceback (most recent call last):
    ...
    monitor.retrieval.metrics.UnknownMetricError: precision needs a cutoff, e.g. precision@10
    """
    if isinstance(name, RankingMetric):
        spec = name
    else:
        match = _METRIC_NAME.match(str(name).strip().lower())
        if match is None:
            raise UnknownMetricError(
                f"cannot parse metric {name!r}: expected family[@k], e.g. ndcg@10; "
                f"families: {', '.join(METRIC_FAMILIES)}"
            )
        k = match["k"]
        spec = RankingMetric(match["family"], None if k is None else int(k))
    if spec.family not in METRIC_FAMILIES:
        raise UnknownMetricError(
            f"unknown metric family {spec.family!r}; families: {', '.join(METRIC_FAMILIES)}"
        )
    rule = METRIC_FAMILIES[spec.family].cutoff
    if spec.k is None and rule == _CUTOFF_REQUIRED:
        raise UnknownMetricError(f"{spec.family} needs a cutoff, e.g. {spec.family}@10")
    if spec.k is not None and rule == _CUTOFF_NONE:
        raise UnknownMetricError(f"{spec.family} takes no cutoff (its cutoff is R, the number of relevant documents)")
    if spec.k is not None and spec.k < 1:
        raise UnknownMetricError(f"cutoff must be >= 1 in {spec.name!r}")
    return spec


def expand_metrics(names: Iterable[str], cutoffs: Iterable[int] = ()) -> list[RankingMetric]:
    """Expand bare families over ``cutoffs``; names with ``@k`` or without a cutoff stay as given.

    >>> [m.name for m in expand_metrics(["ndcg", "recall", "mrr@10", "r_precision"], [5, 10])]
    ['ndcg@5', 'ndcg@10', 'recall@5', 'recall@10', 'mrr@10', 'r_precision']
    >>> [m.name for m in expand_metrics(["ndcg", "map@100"])]
    ['ndcg', 'map@100']
    """
    cutoffs = list(cutoffs)
    specs: list[RankingMetric] = []
    for name in names:
        spec = parse_metric(name)
        if spec.k is None and cutoffs and METRIC_FAMILIES[spec.family].cutoff != _CUTOFF_NONE:
            specs.extend(parse_metric(RankingMetric(spec.family, k)) for k in cutoffs)
        else:
            specs.append(spec)
    return list(dict.fromkeys(specs))


@dataclass(frozen=True, eq=False)
class RankedResults:
    """The relevance grades of many rankings, as matrices; build it with ``from_run``/``from_lists``.

    ``grades`` (Q, K) holds the grade of the document at each rank (0 when unjudged or past the
    end of the list); ``ideal_grades`` (Q, J) holds each query's positive judged grades (sorted
    descending here, 0-padded). Negative grades are stored as 0: no metric tells them apart.
    ``missing_from_run`` lists judged queries the run has no ranking
    for (skipped, or zero rows when built with ``all_queries=True``) and ``not_in_qrels`` the run's
    queries without judgments (always ignored, as in trec_eval).
    """

    grades: np.ndarray
    ideal_grades: np.ndarray
    query_ids: tuple[str, ...]
    missing_from_run: tuple[str, ...] = field(default=())
    not_in_qrels: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        grades = _at_least_one_column(np.asarray(self.grades, dtype=np.float64))
        ideal = _at_least_one_column(np.asarray(self.ideal_grades, dtype=np.float64))
        if grades.ndim != 2 or ideal.ndim != 2 or grades.shape[0] != ideal.shape[0]:
            raise ValueError(
                f"grades {grades.shape} and ideal_grades {ideal.shape} must be 2-D with one row per query"
            )
        if len(self.query_ids) != grades.shape[0]:
            raise ValueError(f"{len(self.query_ids)} query ids for {grades.shape[0]} rankings")
        if not (np.isfinite(grades).all() and np.isfinite(ideal).all()):
            raise ValueError("relevance grades must be finite numbers")
        # Grades <= 0 are all alike: no gain, and below any (positive) relevance threshold.
        grades = np.maximum(grades, 0.0)
        ideal = -np.sort(-np.maximum(ideal, 0.0), axis=1)
        object.__setattr__(self, "grades", grades)
        object.__setattr__(self, "ideal_grades", ideal)
        object.__setattr__(self, "query_ids", tuple(self.query_ids))

    def __len__(self) -> int:
        return self.grades.shape[0]

    @classmethod
    def from_run(
        cls, run: Run, qrels: Qrels, *, all_queries: bool = False, depth: int | None = None
    ) -> RankedResults:
        """Rank a TREC-style run (qid → {docid: score}) exactly as trec_eval does.

        Documents are ranked by score descending, ties by docid descending (trec_eval's and
        pytrec_eval's order; the run's own ranks are ignored; scores must be finite). Queries are the qrels' queries
        with at least one judgment, in qrels order; those the run lacks are skipped, or become
        empty rankings that score 0 with ``all_queries=True`` (trec_eval ``-c``). A query in the
        run with an empty ranking is kept and scores 0, as in pytrec_eval. ``depth`` keeps only
        the top ``depth`` documents of each ranking (metrics deeper than that see nothing more).

        >>> r = RankedResults.from_run({"q1": {"a": 0.5, "b": 0.5, "c": 0.9}}, {"q1": {"a": 1}, "q2": {"x": 1}})
        >>> r.grades.tolist(), r.query_ids, r.missing_from_run
        ([[0.0, 0.0, 1.0]], ('q1',), ('q2',))
        """
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        judged = [qid for qid, docs in qrels.items() if docs]
        missing = tuple(qid for qid in judged if qid not in run)
        evaluated = judged if all_queries else [qid for qid in judged if qid in run]
        judged_set = set(judged)
        not_in_qrels = tuple(qid for qid in run if qid not in judged_set)
        judgments = [qrels[qid] for qid in evaluated]
        grades = _grades_in_trec_order([run.get(qid, {}) for qid in evaluated], judgments)
        return cls(
            grades=grades if depth is None else grades[:, :depth],
            ideal_grades=_ideal_matrix(judgments),
            query_ids=tuple(evaluated),
            missing_from_run=missing,
            not_in_qrels=not_in_qrels,
        )

    @classmethod
    def from_lists(
        cls,
        ranked_ids: Sequence[Sequence[_Id]],
        qrels: Sequence[Mapping[_Id, float]],
        query_ids: Sequence[str] | None = None,
    ) -> RankedResults:
        """Rankings already in order (best first), each with its own judgments.

        For the online probes: ``ranked_ids[i]`` is what was served for query ``i`` and
        ``qrels[i]`` maps document id → grade (absent = 0). A repeated id counts once, at its
        first rank. Every query is kept, even one with no relevant document (it scores 0).
        Ids may be any hashable (str, int).

        >>> RankedResults.from_lists([[3, 1, 3, 2]], [{2: 1, 3: 2}]).grades.tolist()
        [[2.0, 0.0, 1.0]]
        """
        if isinstance(qrels, Mapping):
            raise TypeError("qrels must be a sequence aligned with ranked_ids (use from_run for qid-keyed dicts)")
        if len(ranked_ids) != len(qrels):
            raise ValueError(f"{len(ranked_ids)} rankings but {len(qrels)} qrels")
        if query_ids is None:
            query_ids = [str(i) for i in range(len(ranked_ids))]
        rankings = [list(dict.fromkeys(ids)) for ids in ranked_ids]
        ranked_grades = [judged.get(doc, 0) for docs, judged in zip(rankings, qrels, strict=True) for doc in docs]
        return cls(
            grades=_rows_to_matrix(ranked_grades, [len(docs) for docs in rankings]),
            ideal_grades=_ideal_matrix(qrels),
            query_ids=tuple(query_ids),
        )


def qrels_from_reference(
    reference_rankings: Sequence[Sequence[Hashable]], *, depth: int, graded: bool = False
) -> list[dict[Hashable, int]]:
    """Judgments from a reference model's rankings: its top ``depth`` documents are the relevant ones.

    Binary (grade 1) as in seed 003's agreement with Ada-002, or ``graded``: the reference's
    rank 1 gets grade ``depth``, its rank ``depth`` grade 1 (use ``max_grade=depth`` for ERR).

    >>> qrels_from_reference([["a", "b", "c"]], depth=2)
    [{'a': 1, 'b': 1}]
    >>> qrels_from_reference([["a", "b", "c"]], depth=2, graded=True)
    [{'a': 2, 'b': 1}]
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    qrels = []
    for ranking in reference_rankings:
        top = list(dict.fromkeys(ranking))[:depth]
        qrels.append({doc: (depth - rank if graded else 1) for rank, doc in enumerate(top)})
    return qrels


def evaluate(
    results: RankedResults,
    metrics: Iterable[str | RankingMetric],
    *,
    relevance_threshold: float = 1,
    gain: Gain = "linear",
    max_grade: float = 3,
) -> dict[str, np.ndarray]:
    """Per-query values (float64, in ``results.query_ids`` order) of each metric, keyed by name.

    ``relevance_threshold``: grade >= threshold is relevant for the binary metrics (trec_eval
    ``-l``, default 1; must be > 0). nDCG uses every positive grade as gain whatever the
    threshold, as trec_eval does. ``gain``: nDCG gain, ``linear`` (grade, trec_eval) or
    ``exponential`` (2^grade - 1). ``max_grade``: ERR's top grade (Elasticsearch default 3).
    """
    specs = [parse_metric(m) for m in metrics]
    if not relevance_threshold > 0:
        raise ValueError(f"relevance_threshold must be > 0, got {relevance_threshold}")
    if gain not in ("linear", "exponential"):
        raise ValueError(f"gain must be 'linear' or 'exponential', got {gain!r}")
    if not max_grade > 0:
        raise ValueError(f"max_grade must be > 0, got {max_grade}")
    sums = _RankingSums(results, specs, relevance_threshold, gain, max_grade)
    return {spec.name: METRIC_FAMILIES[spec.family].compute(sums, spec.k) for spec in specs}


class _RankingSums:
    """Running sums along the rank axis, each computed once per ``evaluate`` call and only if used."""

    def __init__(
        self, results: RankedResults, specs: list[RankingMetric], threshold: float, gain: Gain, max_grade: float
    ) -> None:
        full_depth = any(s.k is None for s in specs)
        depth = results.grades.shape[1]
        if not full_depth and specs:
            depth = min(depth, max(s.k for s in specs))  # type: ignore[type-var]
        ndcg_cutoffs = [s.k for s in specs if s.family == "ndcg"]
        ideal_depth = results.ideal_grades.shape[1]
        if ndcg_cutoffs and None not in ndcg_cutoffs:
            ideal_depth = min(ideal_depth, max(ndcg_cutoffs))  # type: ignore[type-var]
        self.grades = results.grades[:, :depth]
        self.ideal_grades = results.ideal_grades[:, :ideal_depth]
        self.gain = gain
        self.max_grade = max_grade
        self.relevant = self.grades >= threshold
        self.n_relevant = np.count_nonzero(results.ideal_grades >= threshold, axis=1).astype(np.float64)
        self.ranks = np.arange(1, depth + 1, dtype=np.float64)

    @staticmethod
    def at(running: np.ndarray, k: int | None) -> np.ndarray:
        """The running sum through rank ``k`` (past the end of the matrix: its last column)."""
        width = running.shape[1]
        return running[:, width - 1 if k is None else min(k, width) - 1]

    @cached_property
    def hits(self) -> np.ndarray:
        return np.cumsum(self.relevant, axis=1, dtype=np.float64)

    @cached_property
    def first_relevant_rank(self) -> np.ndarray:
        first = np.argmax(self.relevant, axis=1) + 1.0
        return np.where(self.relevant.any(axis=1), first, np.inf)

    @cached_property
    def precision_at_hits(self) -> np.ndarray:
        return np.cumsum(self.hits / self.ranks * self.relevant, axis=1)

    @cached_property
    def discount(self) -> np.ndarray:
        width = max(self.grades.shape[1], self.ideal_grades.shape[1])
        return 1.0 / np.log2(np.arange(2, width + 2, dtype=np.float64))

    def _gains(self, grades: np.ndarray) -> np.ndarray:
        positive = np.maximum(grades, 0.0)
        return positive if self.gain == "linear" else np.exp2(positive) - 1.0

    @cached_property
    def dcg(self) -> np.ndarray:
        return np.cumsum(self._gains(self.grades) * self.discount[: self.grades.shape[1]], axis=1)

    @cached_property
    def ideal_dcg(self) -> np.ndarray:
        return np.cumsum(self._gains(self.ideal_grades) * self.discount[: self.ideal_grades.shape[1]], axis=1)

    @cached_property
    def expected_reciprocal_rank(self) -> np.ndarray:
        stop = (np.exp2(np.clip(self.grades, 0.0, self.max_grade)) - 1.0) / np.exp2(self.max_grade)
        reached = np.cumprod(1.0 - stop, axis=1)
        reached = np.concatenate([np.ones((reached.shape[0], 1)), reached[:, :-1]], axis=1)
        return np.cumsum(stop * reached / self.ranks, axis=1)


def _safe_divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, and 0 where the denominator is 0 (no relevant document)."""
    out = np.zeros(np.broadcast_shapes(np.shape(numerator), np.shape(denominator)))
    return np.divide(numerator, denominator, out=out, where=denominator > 0)


def _precision(s: _RankingSums, k: int | None) -> np.ndarray:
    return s.at(s.hits, k) / k


def _recall(s: _RankingSums, k: int | None) -> np.ndarray:
    return _safe_divide(s.at(s.hits, k), s.n_relevant)


def _recall_capped(s: _RankingSums, k: int | None) -> np.ndarray:
    return _safe_divide(s.at(s.hits, k), np.minimum(s.n_relevant, k))  # type: ignore[arg-type]


def _average_precision(s: _RankingSums, k: int | None) -> np.ndarray:
    return _safe_divide(s.at(s.precision_at_hits, k), s.n_relevant)


def _average_precision_over_hits(s: _RankingSums, k: int | None) -> np.ndarray:
    return _safe_divide(s.at(s.precision_at_hits, k), s.at(s.hits, k))


def _reciprocal_rank(s: _RankingSums, k: int | None) -> np.ndarray:
    rank = s.first_relevant_rank
    return np.where(rank <= (np.inf if k is None else k), 1.0 / rank, 0.0)


def _ndcg(s: _RankingSums, k: int | None) -> np.ndarray:
    return _safe_divide(s.at(s.dcg, k), s.at(s.ideal_dcg, k))


def _err(s: _RankingSums, k: int | None) -> np.ndarray:
    return s.at(s.expected_reciprocal_rank, k)


def _hit_rate(s: _RankingSums, k: int | None) -> np.ndarray:
    return (s.at(s.hits, k) > 0).astype(np.float64)


def _r_precision(s: _RankingSums, k: int | None) -> np.ndarray:
    r = s.n_relevant.astype(np.int64)
    column = np.clip(r, 1, s.hits.shape[1]) - 1
    hits_at_r = np.take_along_axis(s.hits, column[:, None], axis=1)[:, 0]
    return _safe_divide(hits_at_r, s.n_relevant)


@dataclass(frozen=True, slots=True)
class _Family:
    compute: Callable[[_RankingSums, int | None], np.ndarray]
    cutoff: str
    summary: str


METRIC_FAMILIES: dict[str, _Family] = {
    "precision": _Family(_precision, _CUTOFF_REQUIRED, "relevant in top k / k (trec_eval P_k)"),
    "recall": _Family(_recall, _CUTOFF_OPTIONAL, "relevant in top k / all relevant (trec_eval recall_k)"),
    "map": _Family(_average_precision, _CUTOFF_OPTIONAL, "AP cut at k over all relevant (trec_eval map_cut_k; map)"),
    "mrr": _Family(_reciprocal_rank, _CUTOFF_OPTIONAL, "1 / rank of first relevant within k (mrr = recip_rank)"),
    "ndcg": _Family(_ndcg, _CUTOFF_OPTIONAL, "DCG@k / ideal DCG@k (trec_eval ndcg_cut_k; ndcg)"),
    "err": _Family(_err, _CUTOFF_OPTIONAL, "Chapelle's expected reciprocal rank (Elasticsearch rank-eval)"),
    "hit_rate": _Family(_hit_rate, _CUTOFF_OPTIONAL, "1 if any relevant in top k (trec_eval success_k)"),
    "r_precision": _Family(_r_precision, _CUTOFF_NONE, "precision at R = all relevant (trec_eval Rprec)"),
    "map_hits": _Family(
        _average_precision_over_hits, _CUTOFF_OPTIONAL, "AP over relevant found in top k (seeds 002/003 MAP)"
    ),
    "recall_capped": _Family(
        _recall_capped, _CUTOFF_REQUIRED, "relevant in top k / min(k, all relevant) (seed 002 recall)"
    ),
}


def _grades_in_trec_order(
    scored: Sequence[Mapping[str, float]], judgments: Sequence[Mapping[str, float]]
) -> np.ndarray:
    """(Q, K) grades of each query's documents ranked by score descending, then docid descending.

    Without sorting whole rankings: only documents with a positive grade matter (every grade
    <= 0 is non-relevant and gainless in every metric), and such a document's 0-based rank is the
    number of documents of its query scoring strictly higher. When it shares its score with
    another document, trec_eval's docid order decides, and that query is ranked in full instead.
    """
    n = len(scored)
    lengths = np.fromiter(map(len, scored), np.int64, n)
    width = max(1, int(lengths.max(initial=0)))
    scores = np.full((n, width), -np.inf)
    present = np.arange(width) < lengths[:, None]
    scores[present] = np.fromiter(chain.from_iterable(s.values() for s in scored), np.float64, int(lengths.sum()))
    if not np.isfinite(scores[present]).all():
        raise ValueError("run scores must be finite numbers")
    rows: list[int] = []
    hit_scores: list[float] = []
    hit_grades: list[float] = []
    for row, (docs, judged) in enumerate(zip(scored, judgments, strict=True)):
        for doc, grade in judged.items():
            if grade > 0 and doc in docs:
                rows.append(row)
                hit_scores.append(docs[doc])
                hit_grades.append(grade)
    row_index = np.asarray(rows, dtype=np.int64)
    value = np.asarray(hit_scores, dtype=np.float64)
    higher = np.empty(len(rows), dtype=np.int64)
    same = np.empty(len(rows), dtype=np.int64)
    step = max(1, _COMPARE_BLOCK // width)
    for start in range(0, len(rows), step):
        block = scores[row_index[start : start + step]]
        threshold = value[start : start + step, None]
        higher[start : start + step] = np.count_nonzero(block > threshold, axis=1)
        same[start : start + step] = np.count_nonzero(block == threshold, axis=1)
    grades = np.zeros((n, width))
    untied = same == 1
    grades[row_index[untied], higher[untied]] = np.asarray(hit_grades, dtype=np.float64)[untied]
    trec_order = itemgetter(1, 0)  # (score, docid), reversed: both descending
    for row in np.unique(row_index[~untied]).tolist():
        ranked = sorted(scored[row].items(), key=trec_order, reverse=True)
        grades[row, : len(ranked)] = [judgments[row].get(doc, 0) for doc, _ in ranked]
    return grades


def _ideal_matrix(judgments: Sequence[Mapping[_Id, float]]) -> np.ndarray:
    positive = [[g for g in judged.values() if g > 0] for judged in judgments]
    return _rows_to_matrix([g for row in positive for g in row], [len(row) for row in positive])


def _rows_to_matrix(flat: Sequence[float], lengths: Sequence[int]) -> np.ndarray:
    """Left-aligned, 0-padded (Q, max length) matrix from rows concatenated in ``flat``."""
    lengths_array = np.asarray(lengths, dtype=np.int64)
    width = int(lengths_array.max(initial=0))
    matrix = np.zeros((len(lengths_array), max(width, 1)))
    matrix[np.arange(matrix.shape[1]) < lengths_array[:, None]] = flat
    return matrix


def _at_least_one_column(matrix: np.ndarray) -> np.ndarray:
    if matrix.ndim == 2 and matrix.shape[1] == 0:
        return np.zeros((matrix.shape[0], 1))
    return matrix
