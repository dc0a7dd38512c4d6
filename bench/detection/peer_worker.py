"""The peers that clash with the project's pins, in ``.venv-peers`` (``scripts/setup peers``).

- Evidently 0.7's embedding drift methods, called as its ``EmbeddingsDrift`` metric calls them
  (``evidently.legacy.metrics.data_drift.embedding_drift_methods``; the report around them is left
  out, which only flatters their cost): ``model`` (a classifier's ROC AUC; Evidently's default,
  with its bootstrap when the reference has fewer than 1,000 rows, as the metric does), ``mmd``
  (threshold 0.015), ``ratio`` (share of drifted components, threshold 0.2) and ``distance``
  (Euclidean distance of the means, threshold 0.2): each at its default threshold, and tuned (the
  runner's matched threshold on the null replicates' scores).
- NannyML's multivariate drift by data reconstruction (PCA keeping 65% of the variance, the
  error's alert band at 3 standard deviations of the reference chunks'), chunks of n/5 rows; the
  score is the largest chunk error of the window, the default decision any chunk's alert.
- DriftLens 0.1.2 (per-batch and per-label Fréchet distances in PCA spaces): the baseline on one
  half of the reference, its threshold from 10 windows of n rows drawn with replacement from the
  other half in its class proportions (the top 1% of their distances, as in its examples). Its
  labels are a nearest-centroid classifier's predictions (fitted on the reference's classes):
  DriftLens watches a classifier's output. The per-label distances (each standardised by its
  threshold windows') name the class it blames. DriftLens runs 100 null replicates, not 200 (a fit
  per replicate: ~0.3 s of CPU per threshold window).

Run: ``.venv-peers/bin/python -m bench.detection.peer_worker PLAN OUT [methods...]``.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

# no usage telemetry: NannyML reports to Segment and Evidently to its own collector unless told not to
os.environ.update(NML_DISABLE_USAGE_LOGGING="1", DO_NOT_TRACK="1", EVIDENTLY_DISABLE_TELEMETRY="1")

import numpy as np

from bench.detection import protocol

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def frame(rows: np.ndarray) -> Any:
    import pandas as pd

    return pd.DataFrame(rows.astype(np.float64), columns=[f"e{i}" for i in range(rows.shape[1])])


def evidently_method(kind: str) -> tuple[Any, Any]:
    from evidently.legacy.metrics.data_drift import embedding_drift_methods as methods

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray) -> Any:
        if kind == "model":
            return methods.model(bootstrap=len(reference) < 1000), reference
        return getattr(methods, kind)(), reference

    def decide(state: Any, window: np.ndarray, seed: int) -> protocol.Score:
        method, reference = state
        score, drifted, _ = method(frame(window), frame(reference))
        return float(score), {"default": bool(drifted)}

    return fit, decide


def nannyml_method() -> tuple[Any, Any]:
    import nannyml as nml

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray) -> Any:
        columns = [f"e{i}" for i in range(reference.shape[1])]
        calculator = nml.DataReconstructionDriftCalculator(column_names=columns, chunk_size=max(len(reference) // 5, 2))
        calculator.fit(frame(reference))
        return calculator

    def decide(calculator: Any, window: np.ndarray, seed: int) -> protocol.Score:
        table = calculator.calculate(frame(window)).filter(period="analysis").to_df()
        errors = table[("reconstruction_error", "value")].to_numpy(dtype=float)
        alerts = table[("reconstruction_error", "alert")].to_numpy(dtype=bool)
        return float(np.max(errors)), {"default": bool(alerts.any())}

    return fit, decide


def nearest_centroid(reference: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    classes = np.unique(labels)
    centres = np.stack([reference[labels == c].mean(axis=0) for c in classes])
    return classes, centres


def driftlens_method(plan: protocol.Plan) -> tuple[Any, Any]:
    from driftlens.driftlens import DriftLens

    def predict(state: dict[str, Any], rows: np.ndarray) -> np.ndarray:
        return state["classes"][np.argmax(rows @ state["centres"].T, axis=1)]

    def fit(reference: np.ndarray, seed: int, ids: np.ndarray) -> Any:
        classes, centres = nearest_centroid(reference, plan.label_of(ids))  # the reference's own classes
        state: dict[str, Any] = {"classes": classes, "centres": centres}
        half = len(reference) // 2
        base, held = reference[:half], reference[half:]
        for _ in range(10):  # DriftLens fits a PCA per label, in the baseline and in every threshold window:
            # keep the labels predicted 3 times or more in both halves
            predicted_base, predicted_held = predict(state, base), predict(state, held)
            kept = np.array([min(int((predicted_base == c).sum()), int((predicted_held == c).sum())) >= 3
                             for c in state["classes"]])
            if kept.all():
                break
            state.update(classes=state["classes"][kept], centres=state["centres"][kept])
        predicted_base, predicted_held = predict(state, base), predict(state, held)
        label_list = [int(c) for c in state["classes"]]  # the labels kept above
        smallest = min(int((predicted_base == c).sum()) for c in label_list)
        batch_pc = int(min(150, half - 1, reference.shape[1]))
        label_pc = int(max(1, min(75, smallest - 1)))
        lens = DriftLens(label_list)
        lens.estimate_baseline(E=base, Y=predicted_base, label_list=label_list, batch_n_pc=batch_pc,
                               per_label_n_pc=label_pc)
        np.random.seed(seed)
        per_batch, per_label = lens.random_sampling_threshold_estimation(
            label_list=label_list, E=held, Y=predicted_held, batch_n_pc=batch_pc, per_label_n_pc=label_pc,
            window_size=len(reference), n_samples=THRESHOLD_WINDOWS, flag_shuffle=True, flag_replacement=True,
            # its balanced sampling draws without replacement whatever the flag says, and a class has fewer
            # rows than a window's share of it: the proportional sampling (the held half's own shares) honours it
            proportional_flag=True,
            proportions_dict={str(c): float(np.mean(predicted_held == c)) for c in label_list})
        state.update(lens=lens, threshold=float(per_batch[int(len(per_batch) * 0.01)]),
                     label_stats={c: (float(np.mean(v)), float(np.std(v)) or 1.0) for c, v in per_label.items()})
        return state

    def decide(state: Any, window: np.ndarray, seed: int, ids: np.ndarray | None = None,
               injected: list[int] | None = None) -> tuple[float, dict[str, bool], dict[str, Any]]:
        labels = predict(state, window)
        try:
            distances = state["lens"].compute_window_distribution_distances(window, labels)
        except (np.linalg.LinAlgError, ValueError):  # a label with fewer than 3 rows in the window (or none)
            distances = guarded_distances(state["lens"], window, labels)
        score = float(distances["per-batch"])
        info: dict[str, Any] = {}
        if injected is not None:
            z = {int(c): (float(distances["per-label"][str(c)]) - m) / s for c, (m, s) in state["label_stats"].items()}
            blamed = max(z, key=lambda c: z[c])
            info["explanation"] = {"blamed": blamed, "named": bool(blamed in injected), "z": z[blamed]}
        return score, {"default": score > state["threshold"]}, info

    return fit, decide


THRESHOLD_WINDOWS = 10  # its threshold estimation costs ~0.3 s of CPU per window of 1,000 rows, at every fit
DRIFTLENS_NULLS = 100  # null replicates for DriftLens (each needs a fit): 100, not 200

def guarded_distances(lens: Any, window: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """DriftLens's own per-batch and per-label Fréchet distances (``DriftLens._compute_frechet_distribution_distances``,
    through its baseline and distance functions), skipping the labels with fewer than 3 rows in the window, where
    it raises (an empty PCA input, or a covariance whose square root fails): their distance is reported as 0."""
    from driftlens import _frechet_drift_distance as fdd

    baseline = lens.baseline
    reduced = baseline.get_batch_PCA_model().transform(window)
    out: dict[str, Any] = {"per-batch": fdd.frechet_distance(
        baseline.get_batch_mean_vector(), fdd.get_mean(reduced), baseline.get_batch_covariance_matrix(),
        fdd.get_covariance(reduced)), "per-label": {}}
    for label in lens.label_list:
        rows = window[labels == label]
        distance = 0.0
        if len(rows) >= 3:
            part = baseline.get_PCA_model_by_label(label).transform(rows)
            try:
                distance = fdd.frechet_distance(
                    baseline.get_mean_vector_by_label(label), fdd.get_mean(part),
                    baseline.get_covariance_matrix_by_label(label), fdd.get_covariance(part))
            except (np.linalg.LinAlgError, ValueError):
                distance = 0.0
        out["per-label"][str(label)] = distance
    return out


WEEK = 10_080  # 60 s cycles in a week: the suite's budget at a 60 s cycle is ARL₀ = 10,080 cycles
# The (1 - 1/10,080) quantile from 10 × 10,080 nulls: about 10 of them above it, so the threshold's
# false-alarm rate is within about ±60% of a week's (95%). From 10,080 or 20,160 nulls the quantile is
# their largest or second largest, whose rate varies tenfold: one such draw (the reduced run of
# f767160) set a threshold that 2 of 200,000 fresh nulls exceed, a false alarm in ten weeks.
WEEK_NULLS = 10 * WEEK


def week_method(kind: str, plan: protocol.Plan) -> tuple[Any, Any, dict[str, Any]]:
    """Evidently ``kind`` at the suite's budget (a false alarm a week at a 60 s cycle): its threshold
    is the (1 - 1/10,080) quantile of its score over :data:`WEEK_NULLS` (or the plan's ``week_nulls``:
    the quick run's 10,080, only for the quantile to exist) fresh null decisions (an
    n-row reference and an n-row window of the base traffic each, drawn as the plan's nulls are).
    Only a peer cheap enough for 20,160 decisions gets this operating point."""
    from bench.detection.streams import Traffic

    fit, decide = evidently_method(kind)
    traffic = Traffic.from_plan(plan)
    rng = np.random.default_rng(WEEK)
    n = int(plan.meta["n"])
    scores = [decide(fit(plan.rows[traffic.base(rng, n)], i, None), plan.rows[traffic.base(rng, n)], i)[0]
              for i in range(int(plan.meta.get("week_nulls", WEEK_NULLS)))]
    threshold = float(np.quantile(scores, 1 - 1 / WEEK, method="higher"))

    def decide_week(state: Any, window: np.ndarray, seed: int) -> protocol.Score:
        score = decide(state, window, seed)[0]
        return score, {"week": score > threshold}

    return fit, decide_week, {"week_threshold": threshold, "week_nulls": len(scores),
                              "week_null_share_above": float(np.mean(np.asarray(scores) > threshold))}


WEEK_METHODS = ("Evidently distance at a week",)  # its mmd: 90 ms a decision, 30 min for the nulls
METHODS = ("Evidently model", "Evidently mmd", "Evidently ratio", "Evidently distance", "NannyML", "DriftLens",
           *WEEK_METHODS)


def main() -> None:
    plan, out, methods = protocol.main_args()
    results = []
    for name in methods or METHODS:
        try:
            if name in WEEK_METHODS:
                if protocol.phase() == "cost":  # its decisions cost what the method's own do
                    protocol.write(out, results)
                    continue
                fit, decide, week = week_method(name.split()[1], plan)
                n = int(plan.meta["n"])  # the threshold is for n rows: the main cases only
                main_cases = protocol.Plan(plan.rows, plan.labels, plan.classes, plan.seen, plan.meta,
                                           {c: i for c, i in plan.cases.items() if int(i["n"]) == n})
                result = protocol.run_batch(main_cases, name, fit, decide, lambda s, d: all(d.values()),
                                            progress=lambda partial: protocol.write(out, [*results, partial]))
                results.append({**result, **week})
                protocol.write(out, results)
                continue
            if name.startswith("Evidently"):
                fit, decide = evidently_method(name.split()[1])
                explain = False
            elif name == "NannyML":
                fit, decide = nannyml_method()
                explain = False
            else:
                fit, decide = driftlens_method(plan)
                explain = True
            results.append(protocol.run_batch(plan, name, fit, decide, lambda s, d: all(d.values()),
                                              protocol.cost_rows(plan), explain=explain,
                                              null_limit=DRIFTLENS_NULLS if name == "DriftLens" else None,
                                              progress=lambda partial: protocol.write(out, [*results, partial])))
        except Exception as error:  # one peer failing must not lose the others' results
            logging.getLogger(__name__).exception("%s failed", name)
            results.append({"method": name, "kind": "batch", "error": f"{type(error).__name__}: {error}"})
        protocol.write(out, results)


if __name__ == "__main__":
    main()
