"""Reference-model agreement (seed 003): does the candidate find the reference model's neighbours?

A shadow deployment embeds the same documents with two models. Each run takes the ids present in
both models' window samples (the *shared* ids; each model may have its own dimension), samples
``queries`` of them (seeded), and ranks the shared ids for each query in both spaces by exact
k-NN (the query itself excluded). The reference's top k is the relevant set
(``qrels_from_reference``; binary, or graded with rank 1 = k), so with R = k:

* ``recall@k`` = overlap / k (seed 003's Recall@k);
* ``ndcg@k``, ``mrr@k``: trec_eval's definitions (seed 003's are the same for binary grades);
* ``map@k``: trec_eval's ``map_cut`` (divides by R = k; seed 003's MAP divides by the hits found,
  our ``map_hits``, so it reads higher).

The Spearman correlation of pairwise similarities compares the two models' similarity scores
over ``pairs`` random pairs of shared ids (seed 003's training metric).

Identical models agree perfectly (1.0 everywhere); a candidate that orders neighbourhoods
differently scores lower. Against a different-architecture reference, "healthy" is the value
measured when the candidate was accepted: alert on a drop from it, not on an absolute number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.stats import spearmanr

from monitor.deadline import Deadline
from monitor.retrieval.metrics import RankedResults, evaluate, qrels_from_reference
from monitor.retrieval.probes.base import ConfiguredProbe, ProbeResult, identified_rows, sample, summarise
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.knn import exact_topk, prepare

if TYPE_CHECKING:
    from monitor.component import MonitorContext
    from monitor.retrieval.settings import AgreementProbeSettings, ProbeSettings
    from monitor.state.window import WindowSnapshot


def shared_rows(reference: WindowSnapshot, candidate: WindowSnapshot) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Ids present in both samples (sorted) and their rows in each sample."""
    ref_ids, ref_rows = identified_rows(reference.sample_ids)
    cand_ids, cand_rows = identified_rows(candidate.sample_ids)
    ref_at = dict(zip(ref_ids, ref_rows.tolist(), strict=True))
    cand_at = dict(zip(cand_ids, cand_rows.tolist(), strict=True))
    shared = sorted(set(ref_at) & set(cand_at))
    return (
        shared,
        np.asarray([ref_at[i] for i in shared], dtype=np.int64),
        np.asarray([cand_at[i] for i in shared], dtype=np.int64),
    )


def agreement_per_query(
    reference: np.ndarray,
    candidate: np.ndarray,
    query_rows: np.ndarray,
    ks: list[int],
    families: list[str],
    *,
    similarity: str = "cosine",
    graded: bool = False,
    block_size: int = 8192,
    device: str | None = "cpu",
    check: object = None,
) -> dict[str, np.ndarray]:
    """Per-query ``<family>@k`` of the candidate's ranking against the reference's top k.

    ``reference`` and ``candidate`` hold the same documents in the same row order (dimensions may
    differ); ``query_rows`` are the rows used as queries (each excluded from its own ranking).
    """
    max_k = max(ks)
    kwargs = {"similarity": similarity, "block_size": block_size, "device": device, "check": check}
    ref_top = exact_topk(reference[query_rows], reference, max_k, exclude=query_rows, **kwargs)  # type: ignore[arg-type]
    cand_top = exact_topk(candidate[query_rows], candidate, max_k, exclude=query_rows, **kwargs)  # type: ignore[arg-type]
    ref_rankings = [[j for j in row if j >= 0] for row in ref_top.indices.tolist()]
    cand_rankings = [[j for j in row if j >= 0] for row in cand_top.indices.tolist()]
    out: dict[str, np.ndarray] = {}
    for k in ks:
        qrels = qrels_from_reference([r[:k] for r in ref_rankings], depth=k, graded=graded)
        results = RankedResults.from_lists([c[:k] for c in cand_rankings], qrels)
        out.update(evaluate(results, [f"{family}@{k}" for family in families], max_grade=k if graded else 3))
    return out


def similarity_spearman(
    reference: np.ndarray, candidate: np.ndarray, pairs: int, rng: np.random.Generator, similarity: str = "cosine"
) -> tuple[float, int]:
    """Spearman ρ between the two models' similarities of ``pairs`` random distinct pairs."""
    n = reference.shape[0]
    if n < 3:
        return float("nan"), 0
    first = rng.integers(0, n, size=pairs)
    second = (first + rng.integers(1, n, size=pairs)) % n  # never equal to first
    ref = prepare(reference, similarity)
    cand = prepare(candidate, similarity)
    ref_sim = np.einsum("ij,ij->i", ref[first], ref[second], dtype=np.float64)
    cand_sim = np.einsum("ij,ij->i", cand[first], cand[second], dtype=np.float64)
    if similarity == "l2":
        ref_sim = -np.einsum("ij,ij->i", ref[first] - ref[second], ref[first] - ref[second])
        cand_sim = -np.einsum("ij,ij->i", cand[first] - cand[second], cand[first] - cand[second])
    if np.ptp(ref_sim) == 0 or np.ptp(cand_sim) == 0:
        return float("nan"), pairs
    return float(spearmanr(ref_sim, cand_sim).statistic), pairs


class ReferenceAgreementProbe(ConfiguredProbe["AgreementProbeSettings"]):
    kind = "agreement"

    def __init__(self, spec: AgreementProbeSettings, context: MonitorContext, shared: ProbeSettings):
        super().__init__(spec, context, shared)

    def run(self, deadline: Deadline) -> ProbeResult:
        windows = self.context.latest_windows()
        ref_key = (self.spec.reference.model, self.spec.reference.stream)
        cand_key = (self.spec.candidate.model, self.spec.candidate.stream)
        model = self.spec.model
        missing = [f"{m}/{s}" for m, s in (ref_key, cand_key) if (m, s) not in windows]
        if missing:
            return ProbeResult(queries=((model, "all", 0),), notes=(f"no window yet for {', '.join(missing)}",))
        reference, candidate = windows[ref_key], windows[cand_key]
        ids, ref_rows, cand_rows = shared_rows(reference, candidate)
        needed = self.spec.max_k + 1
        if len(ids) < needed:
            return ProbeResult(
                queries=((model, "all", 0),),
                notes=(f"{len(ids)} ids in both samples; at least {needed} are needed",),
            )
        ref = reference.sample[ref_rows]
        cand = candidate.sample[cand_rows]
        rng = np.random.default_rng(self.shared.statistics.seed)
        n_queries = min(self.spec.queries, len(ids))
        query_rows = np.sort(rng.choice(len(ids), size=n_queries, replace=False))
        per_query = agreement_per_query(
            ref, cand, query_rows, self.spec.k, self.spec.metrics,
            similarity=self.spec.similarity, graded=self.spec.graded,
            block_size=self.shared.knn_block_size, device=self.device, check=deadline.check,
        )
        deadline.check()
        summary = summarise(per_query, [None] * n_queries, probe=self.name, model=model, stats=self.shared.statistics)
        rho, _ = similarity_spearman(ref, cand, self.spec.pairs, rng, self.spec.similarity)
        samples = list(summary.samples)
        if not np.isnan(rho):
            samples.append(sample("retrieval_similarity_spearman", rho, probe=self.name, model=model))
        elif len(ids) >= 3:
            raise ProbeError("pairwise similarities are constant in one model: Spearman is undefined")
        return ProbeResult(tuple(summary.estimates), tuple(summary.queries), tuple(samples),
                           (f"{len(ids)} ids in both samples",))
