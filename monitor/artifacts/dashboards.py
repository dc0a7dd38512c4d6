"""The five Grafana dashboards: what each shows, panel by panel.

Overview (start here), intrinsic health against each model's own baseline (and the canaries: did
the model change?), drift (and what moved: regions of the reference), retrieval quality with
confidence bands, and the monitor's own health (and, scaled out, the replicas and the reducer). They are
built with Grafana's own SDK, with the variables and annotations every board shares, in
:mod:`monitor.artifacts.panels`.
"""

from __future__ import annotations

from typing import Any

from monitor.artifacts.catalog import RETRIEVAL_TITLES, m
from monitor.artifacts.panels import MS, Override, Panel, Row, Target, dashboard
from monitor.artifacts.rules.model import RuleSet
from monitor.artifacts.rules.recording import INVALID_RECORDS_RATIO, recorded
from monitor.retrieval.families import PROBE_METRIC_FAMILIES

SUITE = 'test="suite"'
RET = 'probe=~"$probe", model=~"$model", slice=~"$slice", k=~"$k"'
PER_STREAM = "{{model}} / {{stream}}"  # the legend of a per-(model, stream) series
# The daemon's `job` label (embmon_job_*: refresh, drift, probe:<name>) as Prometheus stores it:
# `job` is a target label, so the scrape renames the daemon's to `exported_job` (honor_labels is
# off by default, and in the shipped ServiceMonitor and PodMonitor).
SCHEDULED_JOB = "exported_job"

_OK_BAD = {"0": ("OK", "green"), "1": ("FIRING", "red")}
_RED_ABOVE_0 = [(None, "green"), (0.5, "red")]


# field override: query B (a baseline, a threshold) drawn dashed
_DASHED_B = [Override("query", "B", (("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),))]


def _ms(metric: str, extra: str = "") -> str:
    sel = MS + (f", {extra}" if extra else "")
    return f"{m(metric)}{{{sel}}}"


def _per_stream(metric: str) -> Target:
    """The selected streams' ``metric``, averaged over the monitor's instances."""
    return Target(f"avg by (model, stream) ({_ms(metric)})", PER_STREAM)


def _baseline(metric: str, operation: str) -> str:
    """A recorded per-(model, stream) series of ``metric`` (its baseline, or a comparison with it)."""
    return f"{recorded(m(metric), operation)}{{{MS}}}"


def _records_rate(by: str = "") -> str:
    """Valid records per second of the selected streams, summed (``by`` these labels)."""
    total = f"sum by ({by}) " if by else "sum"
    return f"{total}(rate({_ms('embmon_records_total')}[$__rate_interval]))"


def _model(metric: str) -> str:
    """``metric`` of the selected models (canary series carry a model label only)."""
    return f'{m(metric)}{{model=~"$model"}}'


def _canary_mismatched() -> str:
    """1 per canary series with a counted mismatch in the last 10 minutes, else 0."""
    return f"increase({_model('embmon_canary_mismatches_total')}[10m]) > bool 0"


def overview(rules: RuleSet) -> dict[str, Any]:
    w = rules.thresholds.baseline_window
    job = rules.thresholds.job
    panels = [
        Panel("Firing embedding-monitor alerts", "none",
              [Target('count(ALERTS{alertname=~"EmbeddingMonitor.+", alertstate="firing"}) or vector(0)', "firing")],
              "Alerts from the generated rules that are firing now (Alertmanager has the details).",
              kind="stat", width=6, height=5, thresholds=[(None, "green"), (1, "red")]),
        Panel("Monitor targets up", "none", [Target(f'sum(up{{job="{job}"}})', "up")],
              "Scrape targets of the monitor that answer.", kind="stat", width=6, height=5,
              thresholds=[(None, "red"), (1, "green")]),
        Panel("Records / s", "cps", [Target(_records_rate(), "records/s")],
              "Valid embedding records ingested per second, all selected models.", kind="stat", width=6, height=5),
        Panel("Invalid records", "percentunit",
              [Target(f'max({INVALID_RECORDS_RATIO}{{stream=~"$stream"}})', "worst stream")],
              "Worst share of rejected records over 10 minutes.", kind="stat", width=6, height=5,
              thresholds=[(None, "green"), (0.05, "red")]),
        Panel("Collapse / drift / model-change verdict per model", "none",
              [Target(f"max by (model, stream) ({_ms('embmon_collapse_detected')})", "collapse {{model}} / {{stream}}"),
               Target(f"max by (model, stream) ({_ms('embmon_drift_detected', SUITE)})",
                      "drift {{model}} / {{stream}}"),
               Target(f"max by (model) ({_canary_mismatched()})", "model changed {{model}}")],
              "1 means the daemon's collapse check or the combined drift verdict flags the model, or one of its "
              "canaries mismatched its pinned vector in the last 10 minutes (the model changed).",
              kind="stat", width=24, height=5, mappings=_OK_BAD, thresholds=_RED_ABOVE_0),
        Panel(f"Effective-dimension ratio vs {w} baseline", "percentunit",
              [Target(_baseline("embmon_effective_dimension_ratio", f"ratio_median{w}"), PER_STREAM)],
              "Current effective-dimension ratio as a share of the model's own median; 100 % is normal.",
              min=0),
        Panel(f"Mean cosine vs {w} baseline", "none",
              [Target(_baseline("embmon_mean_cosine_similarity", f"delta_median{w}"), PER_STREAM)],
              "Mean pairwise cosine minus the model's own median; 0 is normal, a rise means vectors bunch up."),
        Panel("Retrieval quality (nDCG)", "percentunit",
              [Target(f'min by (model, k) ({m("embmon_retrieval_ndcg")}{{model=~"$model"}})', "{{model}} nDCG@{{k}}")],
              "Worst nDCG across probes and slices per model.", min=0, max=1),
        Panel("Records / s per model", "cps", [Target(_records_rate("model, stream"), PER_STREAM)],
              "Throughput per (model, stream)."),
    ]
    return dashboard("embmon-overview", "Embedding monitor / Overview",
                     "Is anything wrong, per model? Start here.", panels, tags=("overview",))


def intrinsic(rules: RuleSet) -> dict[str, Any]:
    w = rules.thresholds.baseline_window

    def with_baseline(title: str, metric: str, unit: str, desc: str) -> Panel:
        return Panel(title, unit, [
            _per_stream(metric),
            Target(_baseline(metric, f"median{w}"), f"{PER_STREAM} baseline"),
        ], desc, overrides=_DASHED_B)

    def plain(title: str, metric: str, unit: str, desc: str, **kw: Any) -> Panel:
        return Panel(title, unit, [_per_stream(metric)], desc, **kw)

    panels = [
        with_baseline("Partition isotropy", "embmon_partition_isotropy", "none",
                      "d·λmin/Σλ of the covariance eigenvalues: the smallest eigenvalue over the mean one "
                      "(1 = isotropic). Dashed: the model's median baseline."),
        with_baseline("Effective-dimension ratio", "embmon_effective_dimension_ratio", "percentunit",
                      "Participation ratio of the covariance spectrum over the dimension. Dashed: baseline."),
        with_baseline("Mean cosine similarity", "embmon_mean_cosine_similarity", "none",
                      "Mean pairwise cosine of the window. Dashed: baseline."),
        with_baseline("Top-10 variance ratio", "embmon_top10_variance_ratio", "percentunit",
                      "Share of the variance in the 10 largest principal directions. Dashed: baseline."),
        with_baseline("Effective rank", "embmon_effective_rank", "short",
                      "exp(entropy of the normalised singular values) (Roy & Vetterli, 2007). Dashed: baseline."),
        plain("Stable rank", "embmon_stable_rank", "short",
              "Σσ²/σmax² = Σλ/λmax: the total variance over the largest direction's (1 = one direction holds it all)."),
        plain("Dead dimensions", "embmon_dead_dimensions", "short", "Dimensions with near-zero variance."),
        plain("Collapse detected", "embmon_collapse_detected", "none", "1 when the daemon's collapse check fires.",
              mappings=_OK_BAD, min=0, max=1),
        plain("Uniformity", "embmon_uniformity", "none", "log E[exp(-2 |x - y|^2)]; lower is more spread out."),
        plain("Alignment", "embmon_alignment", "none", "E |x - x+|^2 over positive pairs; lower is better."),
        plain("Vector norm mean", "embmon_vector_norm_mean", "none", "Mean L2 norm of the window's vectors."),
        plain("Vector norm stddev", "embmon_vector_norm_stddev", "none", "Standard deviation of the L2 norms."),
        plain("Records in window", "embmon_window_records", "short", "Records in the sliding window the metrics use."),
        plain("Sample size", "embmon_sample_records", "short", "Reservoir sample used for the pairwise metrics."),
        plain("Effective dimension", "embmon_effective_dimension", "short", "Participation ratio, in dimensions."),
        plain("Dimension", "embmon_dimension", "short", "Nominal embedding dimension."),
        *_canary_panels(),
        *_serving_panels(),
    ]
    return dashboard("embmon-intrinsic", "Embedding monitor / Intrinsic health",
                     "Isotropy, dimension use and collapse per model and stream, against each model's own baseline; "
                     "the canaries and the serving probe: did the model or its endpoint change?",
                     panels, tags=("intrinsic",))


def _canary_panels() -> list[Panel | Row]:
    """Did the model change? Fixed items re-sent through the embedding service, against their pins."""
    return [
        Row("Canaries: did the model change?"),
        Panel("Lowest canary cosine", "none",
              [Target(f"min by (model) ({_model('embmon_canary_cosine_min')})", "{{model}}")],
              "Lowest cosine between a canary's embedding and its pinned vector over the window: 1 while the "
              "model is unchanged; below 1 - canaries.tolerance is a mismatch (alert: EmbeddingMonitorModelChanged). "
              "No line after a re-pin until the next canary arrives.", width=6, max=1),
        Panel("Canary mismatches / s", "cps",
              [Target(f"sum by (model) (rate({_model('embmon_canary_mismatches_total')}[$__rate_interval]))",
                      "{{model}} mismatched"),
               Target(f"sum by (model) (rate({_model('embmon_canary_records_total')}[$__rate_interval]))",
                      "{{model}} compared")],
              "Canary records whose cosine to their pin fell below 1 - canaries.tolerance, against all canary "
              "records compared. Healthy: 0 mismatched.", width=6, overrides=_DASHED_B),
        Panel("Time since the last canary", "s",
              [Target(f"time() - max by (model) ({_model('embmon_canary_last_seen_timestamp_seconds')})", "{{model}}")],
              "A model whose canaries stopped arriving is not checked: the producer's canary job is down.", width=6),
        Panel("Pinned canaries", "short",
              [Target(f"max by (model) ({_model('embmon_canary_pins')})", "{{model}}")],
              "Canary ids of the model with a pinned vector (a re-pin unpins those not seen since start).", width=6),
    ]


def _model_rate(metric: str, by: str) -> str:
    """Per-second rate of the selected models' counter ``metric``, summed by ``by``."""
    return f"sum by ({by}) (rate({_model(metric)}[$__rate_interval]))"


def _serving_panels() -> list[Panel | Row]:
    """Is the embedding endpoint conformant? The serving probe's checks, requests and latency (docs/canaries.md)."""
    deviation, tolerance = _model("embmon_serving_deviation"), _model("embmon_serving_tolerance")
    check = "{{model}} {{check}}"
    return [
        Row("Serving probe: does the endpoint serve the model conformantly?"),
        Panel("Conformance: deviation over tolerance per check", "none",
              [Target(f"max by (model, check) ({deviation} / {tolerance})", check)],
              "Each check's statistic of the last cycle over its tolerance: above 1 (red) the check fails "
              "(alert: EmbeddingMonitorServingNonconformant, with a counted violation in the last 10 minutes). "
              "repeat, batch and neighbour: 1 - cos; case, whitespace and prefix: the change from the pins; "
              "norm: the relative norm change.", width=8, min=0, thresholds=[(None, "green"), (1, "red")]),
        Panel("Deviation and tolerance per check", "none",
              [Target(f"max by (model, check) ({deviation})", check),
               Target(f"max by (model, check) ({tolerance})", f"{check} tolerance")],
              "The statistic each check measured (solid) and the tolerance it is compared with (dashed); "
              "0 is conformant.", width=8, min=0, overrides=_DASHED_B),
        Panel("Violations per hour by check", "short",
              [Target(f"sum by (model, check) (increase({_model('embmon_serving_violations_total')}[1h]))", check)],
              "Cycles in which a check failed. Healthy: 0.", width=8, min=0),
        Panel("Serving latency", "s",
              [Target(f"max by (model) ({_model('embmon_serving_latency_median_seconds')})", "{{model}} median"),
               Target(f"max by (model) ({_model('embmon_serving_latency_max_seconds')})", "{{model}} max"),
               Target(f"histogram_quantile(0.99, sum by (model, le) "
                      f"(rate({_model('embmon_serving_request_duration_seconds_bucket')}[$__rate_interval])))",
                      "{{model}} p99")],
              "Median (solid) and slowest (dashed) request of the last cycle, and the 99th percentile of the "
              "requests over the interval (OpenTelemetry's gen_ai.client.operation.duration buckets).", width=8,
              min=0, overrides=_DASHED_B),
        Panel("Requests, errors and unusable vectors / s", "cps",
              [Target(_model_rate("embmon_serving_requests_total", "model"), "{{model}} requests"),
               Target(_model_rate("embmon_serving_errors_total", "model, reason"), "{{model}} error {{reason}}"),
               Target(_model_rate("embmon_serving_invalid_vectors_total", "model, reason"),
                      "{{model}} invalid {{reason}}")],
              "Requests the probe sent, those that failed by reason (connect, timeout, rate_limited, auth, ...), "
              "and returned vectors that cannot be used by reason (empty, zero, non_finite, wrong_dimension). "
              "Healthy: no errors, no invalid vectors.", width=8, min=0),
        Panel("Cycles / s by outcome", "cps",
              [Target(_model_rate("embmon_serving_cycles_total", "model, outcome"), "{{model}} {{outcome}}")],
              "ok; failed: a request failed; skipped: backing off after failures.", width=8, min=0),
        Panel("Time since the last good cycle, and back-off", "s",
              [Target(f"time() - max by (model) ({_model('embmon_serving_last_success_timestamp_seconds')})",
                      "{{model}} since success"),
               Target(f"max by (model) ({_model('embmon_serving_backoff_seconds')})", "{{model}} back-off")],
              "A probe that cannot reach the endpoint checks nothing: the age grows and the probe waits longer "
              "than its interval (dashed) before it tries again.", width=12, min=0, overrides=_DASHED_B),
        Panel("Colliding canary texts", "short",
              [Target(f"max by (model) ({_model('embmon_serving_collisions')})", "{{model}}")],
              "Pairs of distinct canary texts (or of their upper-cased forms) with identical vectors: an "
              "endpoint that truncates or ignores its input. Healthy: 0.", width=12, min=0),
    ]


def _regions(metric: str) -> str:
    return f"max by (model, stream, region) ({_ms(metric)})"


def _what_moved_panels() -> list[Panel | Row]:
    """Per region of the reference: its share of the reference and of the window; what is new."""
    window, reference = _regions("embmon_drift_region_window_ratio"), _regions("embmon_drift_region_reference_ratio")
    region = "{{model}} / {{stream}} region {{region}}"
    return [
        Row("What moved: regions of the reference (embedding-monitor drift explain)"),
        Panel("Region shares: window vs reference", "percentunit",
              [Target(window, f"{region} window"), Target(reference, f"{region} reference")],
              "Share of the window sample (solid) and of the held-out reference (dashed) in each k-means region "
              "of the reference, at each drift cycle. `embedding-monitor drift explain` names the exemplar ids.",
              min=0, overrides=_DASHED_B),
        Panel("Region share change (window - reference)", "percentunit",
              [Target(f"{window} - {reference}", region)],
              "Positive: the region gained share (what arrived); negative: it lost share."),
        Panel("Novel share", "percentunit", [_per_stream_max("embmon_drift_novel_ratio")],
              "Share of the window farther from every region than 99% of the reference: about 0.01 when nothing "
              "new arrived; a new topic the reference never had raises it.", width=8, min=0),
        Panel("Regions shifted", "short", [_per_stream_max("embmon_drift_regions_shifted")],
              "Regions whose share change is significant at the cycle's alpha after Benjamini-Hochberg.",
              width=8, min=0),
        Panel("Region p-values (BH-adjusted)", "none",
              [Target(f"min by (model, stream, region) ({_ms('embmon_drift_region_p_value')})", region),
               Target(f"max by (model, stream) ({_ms('embmon_drift_threshold', SUITE)})",
                      "{{model}} / {{stream}} cycle alpha")],
              "Fisher's exact test of each region's share change, adjusted across regions; below the cycle's "
              "alpha (dashed) the region has shifted.", width=8, min=0, max=1, overrides=_DASHED_B),
        Row("Cycle budget: could the tests decide?"),
        Panel("Tests cut short by the time budget (per hour)", "short",
              [Target(f"sum by (model, stream, test) (increase({_ms('embmon_drift_tests_cut_total')}[1h]))",
                      "{{model}} / {{stream}} {{test}}")],
              "Drift tests the cycle's time budget skipped or truncated: healthy is 0. A cut test has a higher "
              "p-value floor or no p-value (it counts as p = 1).", min=0),
        Panel("Costly tests screened out by the staged cycle (per hour)", "short",
              [Target(f"sum by (model, stream, test) (increase({_ms('embmon_drift_tests_screened_total')}[1h]))",
                      "{{model}} / {{stream}} {{test}}")],
              "The classifier and the MMD run only when KS, the centroid or a screen has a p-value at most "
              "drift.screen_level (embmon_drift_screen_p_value). Healthy: on a quiet stream they are screened out "
              "in almost every cycle (their series are absent then); they run when something moves.", min=0),
        Panel("p-value floor vs threshold", "none",
              [Target(f"max by (model, stream, test) ({_ms('embmon_drift_p_value_floor')})",
                      "{{model}} / {{stream}} {{test}} floor"),
               Target(f"max by (model, stream, test) ({_ms('embmon_drift_threshold')})",
                      "{{model}} / {{stream}} {{test}} threshold")],
              "Smallest p-value each test could give at the last cycle (1/(1 + permutations) for a permutation "
              "test, 0 for the others). A floor above the threshold (dashed) means the test could not have "
              "detected drift.", min=0, max=1, overrides=_DASHED_B),
    ]


def _per_stream_max(metric: str) -> Target:
    return Target(f"max by (model, stream) ({_ms(metric)})", PER_STREAM)


def drift(rules: RuleSet) -> dict[str, Any]:
    del rules
    dd, pv, th = m("embmon_drift_detected"), m("embmon_drift_p_value"), m("embmon_drift_threshold")
    panels = [
        Panel("Drift verdict per test", "none",
              [Target(f"max by (model, stream, test) ({dd}{{{MS}}})", "{{model}} / {{stream}} {{test}}")],
              "1 = drifted; `suite` (the tests' combined verdict) or `evidence` (the accumulating detector's "
              "alarm) is what the alerts use.", mappings=_OK_BAD, min=0, max=1),
        Panel("p-values and thresholds", "none",
              [Target(f"max by (model, stream, test) ({pv}{{{MS}}})", "{{model}} / {{stream}} {{test}} p"),
               Target(f"max by (model, stream, test) ({th}{{{MS}}})", "{{model}} / {{stream}} {{test}} threshold")],
              "Per-test p-value against its (corrected) threshold; below the threshold means drift.",
              min=0, max=1, overrides=_DASHED_B),
        Panel("MMD²", "none", [_per_stream("embmon_drift_mmd2")],
              "Squared maximum mean discrepancy between the window and the reference. Only in cycles whose "
              "screen passed (the staged cycle: a quiet cycle skips the MMD; drift.screen_level)."),
        Panel("Drifted components", "percentunit",
              [_per_stream("embmon_drift_drifted_components_ratio")],
              "Share of (projected) components whose KS test rejects.", min=0, max=1),
        Panel("Centroid cosine distance", "none",
              [_per_stream("embmon_drift_centroid_cosine_distance")],
              "Cosine distance between window and reference centroids."),
        Panel("Domain-classifier AUC", "none",
              [_per_stream("embmon_drift_classifier_auc")],
              "0.5 = indistinguishable from the reference; near 1 = clearly different. Only in cycles whose "
              "screen passed (the staged cycle; drift.screen_level).", min=0.4, max=1),
        Panel("Change points (per hour)", "short",
              [Target(f"sum by (model, stream, signal) (increase({_ms('embmon_drift_change_points_total')}[1h]))",
                      "{{model}} / {{stream}} {{signal}}")],
              "Streaming change-point detections; each one is also an annotation."),
        Panel("Accumulated evidence (log R) vs its alarm line", "none",
              [Target(f"max by (model, stream) ({_ms('embmon_drift_log_evidence')})", "{{model}} / {{stream}} log R"),
               Target(f"max by (model, stream) ({_ms('embmon_drift_log_evidence_threshold')})",
                      "{{model}} / {{stream}} log A")],
              "The accumulating detector's log R_t, cycle by cycle: it adds up a shift too small for one window and "
              "alarms when it reaches log A (dashed), then restarts. Healthy: well below the line, wandering."
              , overrides=_DASHED_B),
        Panel("Evidence alarms (per day)", "short",
              [Target(f"sum by (model, stream) (increase({_ms('embmon_drift_evidence_alarms_total')}[1d]))",
                      PER_STREAM)],
              "Alarms of the accumulating detector; each flags the cycle's verdict. Healthy: 0.", min=0),
        Panel("Reference window", "short",
              [Target(f"max by (model, stream) ({_ms('embmon_reference_records')})", "{{model}} / {{stream}} records")],
              "Records in the pinned reference."),
        Panel("Reference age", "s",
              [Target(f"time() - max by (model, stream) ({_ms('embmon_reference_timestamp_seconds')})", PER_STREAM)],
              "How long ago the reference was pinned (re-pin: see the runbook)."),
        *_what_moved_panels(),
    ]
    return dashboard("embmon-drift", "Embedding monitor / Drift",
                     "Distribution drift of each model's embeddings against its reference, and what moved.", panels,
                     tags=("drift",))


# a confidence band: series named lower and upper, drawn as a shaded area between them
_HIDDEN = (("custom.lineWidth", 0), ("custom.hideFrom", {"legend": True, "tooltip": False, "viz": False}))
_BAND = [Override("name", "lower", _HIDDEN),
         Override("name", "upper", (*_HIDDEN, ("custom.fillOpacity", 20), ("custom.fillBelowTo", "lower")))]
# queries B and C (an interval's bounds) drawn dashed
_DASHED_BC = [Override("query", q, _DASHED_B[0].properties) for q in ("B", "C")]


def _band(metric: str, title: str, desc: str) -> Panel:
    base = m(metric)
    return Panel(title, "percentunit", [
        Target(f"{base}{{{RET}}}", "{{probe}} {{model}} {{slice}} @{{k}}"),
        Target(f"{m(base + '_ci_lower')}{{{RET}}}", "lower"),
        Target(f"{m(base + '_ci_upper')}{{{RET}}}", "upper"),
    ], desc + " Shaded: the probe's confidence interval (the band is drawn when one probe, model,"
       " slice and k are selected).",
        min=0, max=1, overrides=_BAND)


def retrieval(rules: RuleSet) -> dict[str, Any]:
    del rules
    titles = {metric: f"{RETRIEVAL_TITLES[metric]}@k" for metric in PROBE_METRIC_FAMILIES}
    panels: list[Panel | Row] = [
        _band(f"embmon_retrieval_{metric}", titles[metric], f"{titles[metric]} from the probe's labelled queries.")
        for metric in PROBE_METRIC_FAMILIES
    ]
    panels.append(_band("embmon_retrieval_ann_recall", "ANN recall@k",
                        "Share of the exact k nearest neighbours the ANN index returns (targets 0.90-0.95)."))
    pm = 'probe=~"$probe", model=~"$model"'
    panels += [
        Panel("Queries per probe run", "short",
              [Target(f'{m("embmon_retrieval_queries")}{{{pm}, slice=~"$slice"}}', "{{probe}} {{model}} {{slice}}")],
              "Labelled queries behind the estimates (the CI narrows with more)."),
        Panel("Click-through rate", "percentunit",
              [Target(f"{m('embmon_retrieval_click_through_rate')}{{{RET}}}", "{{probe}} {{model}} {{slice}} @{{k}}")],
              "Clicks per impression at k, from interaction events.", min=0, max=1),
        Panel("Zero-result queries", "percentunit",
              [Target(f'{m("embmon_retrieval_zero_result_ratio")}{{{pm}, slice=~"$slice"}}',
                      "{{probe}} {{model}} {{slice}}")],
              "Share of queries that returned nothing.", min=0, max=1),
        Panel("Catalog coverage", "percentunit",
              [Target(f"{m('embmon_retrieval_catalog_coverage_ratio')}{{{pm}}}", "{{probe}} {{model}}")],
              "Share of the catalog that appears in any result list.", min=0, max=1),
        Panel("Exposure Gini", "none", [Target(f"{m('embmon_retrieval_gini')}{{{pm}}}", "{{probe}} {{model}}")],
              "Inequality of item exposure (0 = even, 1 = one item gets everything).", min=0, max=1),
        Panel("Popularity bias", "none",
              [Target(f"{m('embmon_retrieval_popularity_bias')}{{{pm}}}", "{{probe}} {{model}}")],
              "Mean popularity of recommended items relative to the catalog."),
    ]
    panels += _index_panels()
    return dashboard("embmon-retrieval", "Embedding monitor / Retrieval quality",
                     "Retrieval probes: accuracy with confidence bands, ANN recall, beyond-accuracy metrics; "
                     "the index that serves the queries.",
                     panels, retrieval=True, tags=("retrieval",))


def _index_panels() -> list[Panel | Row]:
    """The vector store itself (monitor/index/, docs/index.md): production search against exact, census."""
    sel = 'model=~"$model"'
    legend = "{{probe}} {{model}} {{scope}}"

    def index(metric: str, extra: str = "") -> str:
        return f"{m(metric)}{{{sel}{', ' + extra if extra else ''}}}"

    def rate(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({m(metric)}[$__rate_interval]))"

    return [
        Row("Index: the vector store that serves the queries"),
        Panel("Index recall@k (all queries)", "percentunit",
              [Target(index("embmon_index_recall_ratio", 'scope="all"'), "{{probe}} {{model}} @{{k}}"),
               Target(index("embmon_index_recall_lower_ratio", 'scope="all"'), "lower"),
               Target(index("embmon_index_recall_upper_ratio", 'scope="all"'), "upper"),
               Target(index("embmon_index_recall_p5_ratio", 'scope="all"'), "p5 {{probe}} @{{k}}"),
               Target(index("embmon_index_recall_p10_ratio", 'scope="all"'), "p10 {{probe}} @{{k}}")],
              "Production search (the engine's settings and filter) against the engine's exact search with the "
              "same filter, on sampled live queries. Shaded: the bootstrap interval (drawn when one probe and "
              "model are selected); its upper bound below the target fires EmbeddingMonitorIndexRecallLow. "
              "p5 and p10: the tail of the per-query recall.", width=8, min=0, max=1,
              overrides=_BAND),
        Panel("Recall@k per scope, with intervals", "percentunit",
              [Target(index("embmon_index_recall_ratio", 'scope!="all"'), legend),
               Target(index("embmon_index_recall_lower_ratio", 'scope!="all"'), f"{legend} lower"),
               Target(index("embmon_index_recall_upper_ratio", 'scope!="all"'), f"{legend} upper")],
              "The worst scopes by the upper bound of their interval, by name, and the rest pooled as other; "
              "dashed: the bounds of each scope's bootstrap interval.", width=8, min=0, max=1,
              overrides=_DASHED_BC),
        Panel("Under-return per scope", "percentunit",
              [Target(index("embmon_index_under_return_ratio", 'scope!="all"'), legend)],
              "Share of a scope's queries served fewer rows than exist under their filter (0 when healthy; "
              "alert: EmbeddingMonitorIndexUnderReturn, on scopes with enough queries).",
              width=8, min=0, max=1),
        Panel("Queries and flagged scopes", "short",
              [Target(index("embmon_index_queries"), "{{probe}} {{scope}} queries"),
               Target(index("embmon_index_scope_flagged"), "{{probe}} {{scope}} flagged"),
               Target(index("embmon_index_scopes_hidden"), "{{probe}} scopes pooled as other")],
              "Queries behind each scope's estimates (the interval narrows with more), 1 for a scope whose "
              "recall is significantly below the rest or which mostly under-returns, and the scopes pooled "
              "into other.", width=8, min=0),
        Panel("Tie-aware recall@k", "percentunit",
              [Target(index("embmon_index_epsilon_recall_ratio"), legend)],
              "Served results within (1 + epsilon) of the exact k-th distance: near recall@k, unless ties "
              "at the k-th distance make plain recall look worse than the search is.", width=8, min=0, max=1),
        Panel("Distance inflation", "none",
              [Target(index("embmon_index_distance_inflation"), legend)],
              "Mean served k-th distance over the exact k-th distance: 1 is as near; above 1 the missed "
              "neighbours were replaced by farther ones.", width=8),
        Panel("Recall lost, by part", "percentunit",
              [Target(index("embmon_index_recall_loss_ratio"), "{{probe}} {{part}}")],
              "1 - recall split into filter (filtered vs unfiltered twins), quantization (exact search in the "
              "quantized space) and graph (the rest).", width=8, min=0, max=1),
        Panel("Stale share of the index, with interval", "percentunit",
              [Target(index("embmon_index_stale_ratio"), "{{probe}} {{model}}"),
               Target(index("embmon_index_stale_lower_ratio"), "{{probe}} {{model}} lower"),
               Target(index("embmon_index_stale_upper_ratio"), "{{probe}} {{model}} upper")],
              "Sampled stored vectors that differ from their id's latest vector, with the bounds of the Wilson "
              "interval (dashed); the lower bound above the tolerated share fires EmbeddingMonitorIndexStale.",
              width=8, min=0, max=1,
              overrides=_DASHED_BC),
        Panel("Generations in the index", "percentunit",
              [Target(index("embmon_index_generation_share_ratio"), "{{probe}} {{generation}}")],
              "Share of the sampled stored vectors in each generation: current, and stale_1, stale_2, ... for "
              "each older model or recipe found (a re-embedding that has not finished).", width=8, min=0, max=1),
        Panel("Missing, orphan and degenerate rows", "percentunit",
              [Target(index("embmon_index_missing_ratio"), "missing {{probe}}"),
               Target(index("embmon_index_orphan_ratio"), "orphan {{probe}}"),
               Target(index("embmon_index_degenerate_ratio"), "{{kind}} {{probe}}")],
              "Stream ids the index lacks, index ids the stream never carried, zero/NaN/duplicate rows.",
              width=8, min=0, max=1),
        Panel("Census: rows and ids compared", "short",
              [Target(index("embmon_index_rows"), "{{probe}} {{model}} rows"),
               Target(index("embmon_index_census_ids"), "{{probe}} {{model}} ids compared")],
              "Rows of the index as the engine counts them, and the stored vectors the last census compared "
              "with their latest vector (the sample behind the stale share).", width=8, min=0),
        Panel("Hubness", "none",
              [Target(index("embmon_index_hubness_skewness"), "{{probe}} {{model}} skewness"),
               Target(index("embmon_index_hub_occurrence_ratio"), "{{probe}} {{model}} top hub share")],
              "Skewness of the k-occurrence over sampled stored rows (near 0 is even; a large value means a few "
              "hubs are everyone's neighbours), and the share of k-NN lists holding the most frequent neighbour.",
              width=8),
        Panel("Index probe cycles / s by outcome", "cps",
              [Target(rate("embmon_index_probe_runs_total", "probe, outcome"), "{{probe}} {{outcome}}"),
               Target(rate("embmon_index_queries_skipped_total", "probe, reason"), "{{probe}} skipped {{reason}}")],
              "Cycles by outcome (success, partial, failure, timeout, backoff), and sampled queries the probe "
              "could not use, by reason.", width=6, min=0),
        Panel("Index probe duration and age", "s",
              [Target(f"max by (probe) ({m('embmon_index_probe_duration_seconds')})", "{{probe}} last cycle"),
               Target(f"time() - max by (probe) ({m('embmon_index_probe_last_success_timestamp_seconds')})",
                      "{{probe}} since success")],
              "Wall time of the last cycle, and how long ago the probe last completed one (dashed; alert: "
              "EmbeddingMonitorIndexProbeStale).", width=6, min=0, overrides=_DASHED_B),
        Panel("Index probe cost per second", "short",
              [Target(rate("embmon_index_searches_total", "probe, kind"), "{{probe}} {{kind}} searches"),
               Target(rate("embmon_index_rows_read_total", "probe"), "{{probe}} rows read"),
               Target(rate("embmon_index_errors_total", "probe, reason"), "{{probe}} errors {{reason}}"),
               Target(rate("embmon_index_census_errors_total", "probe, reason"),
                      "{{probe}} census dropped {{reason}}")],
              "What the probe costs the engine (exact searches are bounded per cycle by the budget), its "
              "failures by reason, and censuses dropped while the recall was still published.", width=6),
        Panel("Index probe CPU", "percentunit",
              [Target(rate("embmon_index_probe_cpu_seconds_total", "probe"), "{{probe}}")],
              "CPU of the probe's cycles in the monitor, in cores.", width=6),
    ]


def monitor_health(rules: RuleSet) -> dict[str, Any]:
    job = rules.thresholds.job
    runs = m("embmon_probe_runs_total")
    panels = [
        Panel("Records / s", "cps", [Target(_records_rate("model, stream"), PER_STREAM)],
              "Valid records ingested per second."),
        Panel("Invalid records / s by reason", "cps",
              [Target(f'sum by (stream, reason) '
                      f'(rate({m("embmon_records_invalid_total")}{{stream=~"$stream"}}[$__rate_interval]))',
                      "{{stream}} {{reason}}")],
              "Rejected records per second, by rejection reason."),
        Panel("Invalid-record ratio", "percentunit",
              [Target(f'{INVALID_RECORDS_RATIO}{{stream=~"$stream"}}', "{{stream}}")],
              "Share of rejected records over 10 minutes (alert: EmbeddingMonitorInvalidRecordsHigh).", min=0),
        Panel("Consumer lag", "short",
              [Target(f"sum by (instance, topic) ({m('embmon_consumer_lag_records')})", "{{instance}} {{topic}}")],
              "Records behind the end of each topic."),
        Panel("Source up", "none", [Target(f"{m('embmon_source_up')}", "{{instance}}")],
              "1 while the source (Kafka, file, synthetic) is readable.",
              mappings={"0": ("DOWN", "red"), "1": ("UP", "green")},
              min=0, max=1),
        Panel("Scrape targets up", "none", [Target(f'up{{job="{job}"}}', "{{instance}}")],
              "Prometheus' view of the monitor targets.", min=0, max=1),
        Panel("Refresh duration", "s", [
            Target(f"histogram_quantile({q}, sum by (le) "
                   f"(rate({m('embmon_refresh_duration_seconds_bucket')}[$__rate_interval])))", name)
            for q, name in (("0.5", "p50"), ("0.99", "p99"))
        ], "Time to recompute the intrinsic metrics of all windows."),
        Panel("Metrics age", "s",
              [Target(f"time() - max by (model, stream) ({_ms('embmon_metrics_last_update_timestamp_seconds')})",
                      PER_STREAM)],
              "Seconds since the last refresh published metrics."),
        Panel("Job runs / s by outcome", "cps",
              [Target(f"sum by ({SCHEDULED_JOB}, outcome) (rate({m('embmon_job_runs_total')}[$__rate_interval]))",
                      f"{{{{{SCHEDULED_JOB}}}}} {{{{outcome}}}}")],
              "Scheduled jobs (refresh, drift, probes) by outcome."),
        Panel("Job duration p99", "s",
              [Target(f"histogram_quantile(0.99, sum by ({SCHEDULED_JOB}, le) "
                      f"(rate({m('embmon_job_duration_seconds_bucket')}[$__rate_interval])))",
                      f"{{{{{SCHEDULED_JOB}}}}}")],
              "99th percentile duration of each scheduled job."),
        Panel("Probe runs / s by outcome", "cps",
              [Target(f"sum by (probe, outcome) (rate({runs}[$__rate_interval]))", "{{probe}} {{outcome}}")],
              "Retrieval probe runs by outcome (success, failure, timeout)."),
        Panel("Probe duration", "s", [Target(f"{m('embmon_probe_duration_seconds')}", "{{probe}}")],
              "Duration of the last run of each probe."),
        Panel("Time since last probe success", "s",
              [Target(f"time() - {m('embmon_probe_last_success_timestamp_seconds')}", "{{probe}}")],
              "Age of the last successful run of each probe."),
        Panel("Build", "none", [Target(f"{m('embmon_build_info')}", "{{instance}} {{version}}", instant=True)],
              "Running versions.", kind="table"),
        *_state_panels(),
        *_scale_out_panels(),
    ]
    return dashboard("embmon-self", "Embedding monitor / Monitor health",
                     "The monitor's own health: throughput, invalid records, lag, refresh and probe durations; "
                     "scaled out, the replicas' publications and the reducer's merge.",
                     panels, tags=("self",))


def _state_panels() -> list[Panel | Row]:
    """Is the monitor current (records and sources progress) and did it keep its state across restarts?"""
    return [
        Row("Sources and state: is the monitor current, and did it keep its state?"),
        Panel("Time since the last record", "s",
              [Target(f"time() - max by (model, stream) ({_ms('embmon_last_record_timestamp_seconds')})", PER_STREAM)],
              "A stream whose records stopped arriving (alert: EmbeddingMonitorNoRecentRecords).", width=8, min=0),
        Panel("Time since each source progressed", "s",
              [Target(f"time() - max by (topic) ({m('embmon_source_last_progress_timestamp_seconds')})", "{{topic}}")],
              "Since the consumer was last caught up on the topic or applied records from it: it grows while "
              "records wait and none are applied (alert: EmbeddingMonitorSourceStalled).", width=8, min=0),
        Panel("Source read failures / s", "cps",
              [Target(f"sum by (instance, reason) (rate({m('embmon_source_errors_total')}[$__rate_interval]))",
                      "{{instance}} {{reason}}")],
              "Failed reads from the record source, by reason. Healthy: 0.", width=8, min=0),
        Panel("Checkpoint and refresh age", "s",
              [Target(f"max by (instance) ({m('embmon_checkpoint_age_seconds')})", "{{instance}} checkpoint"),
               Target(f"max by (instance) ({m('embmon_refresh_age_seconds')})", "{{instance}} refresh")],
              "Seconds since the last checkpoint was written (alert: EmbeddingMonitorCheckpointStale): what a "
              "restart now would lose; and since the window metrics were last refreshed (alert: "
              "EmbeddingMonitorRefreshStale): how old every gauge is.", width=12, min=0),
        Panel("Checkpoint and state files refused", "short",
              [Target(f"sum by (instance, reason) ({m('embmon_checkpoint_restore_failures_total')})",
                      "{{instance}} restore refused: {{reason}}"),
               Target(f"sum by (instance, file) ({m('embmon_state_files_rejected_total')})",
                      "{{instance}} state file moved aside: {{file}}"),
               Target(f"sum by (instance, stage) ({m('embmon_checkpoint_write_failures_total')})",
                      "{{instance}} write failed: {{stage}}")],
              "Since start-up: checkpoints rejected at start-up (alert: EmbeddingMonitorCheckpointRejected), "
              "state files moved aside (alert: EmbeddingMonitorStateFileRejected), and checkpoints that could "
              "not be written. Healthy: 0.", width=12, min=0),
    ]


def _scale_out_panels() -> list[Panel | Row]:
    """Replicas publishing their partial state, the reducers merging it (empty for a single daemon)."""
    def rate(metric: str, by: str) -> str:
        return f"sum by ({by}) (rate({m(metric)}[$__rate_interval]))"

    return [
        Row("Scale-out: replicas and reducers"),
        Panel("Replica publication age", "s",
              [Target(f"time() - max by (instance) ({m('embmon_partials_last_publish_timestamp_seconds')})",
                      "{{instance}}")],
              "Seconds since each replica's newest publication reached the broker: within two checkpoint "
              "intervals when healthy.", width=8),
        Panel("Partial age at the reducer", "s",
              [Target(f"max by (replica) ({m('embmon_reducer_partial_age_seconds')})", "{{replica}}")],
              "Seconds since the replica captured the newest publication the reducer applied; the reducer marks "
              "it stale past scale_out.stale_after_seconds (alert: EmbeddingMonitorReplicaStale).", width=8),
        Panel("Replicas merged by state", "short",
              [Target(f"sum by (state) ({m('embmon_reducer_replicas')})", "{{state}}")],
              "Replicas whose publications the reducer merges: live should equal the replicas you run.",
              width=8, min=0),
        Panel("Partials published: bytes / s", "Bps",
              [Target(rate("embmon_partials_published_bytes_total", "instance"), "{{instance}}")],
              "Bytes each replica writes to the partials topic.", width=8),
        Panel("Partials published: records / s", "cps",
              [Target(rate("embmon_partials_published_total", "instance, kind"), "{{instance}} {{kind}}"),
               Target(rate("embmon_partials_publish_failures_total", "instance"), "{{instance}} failed")],
              "Publications per replica by kind (subwindow chunks, tombstones, manifests), and failed ones "
              "(alert: EmbeddingMonitorPartialsPublishFailing).", width=8),
        Panel("Reducer: partials applied and ignored / s", "cps",
              [Target(rate("embmon_reducer_partials_applied_total", "kind"), "applied {{kind}}"),
               Target(rate("embmon_reducer_partials_ignored_total", "reason"), "ignored {{reason}}")],
              "What the reducer merged, and what it did not by reason: duplicate and superseded are harmless; "
              "window_mismatch, dim_mismatch, replica_limit and corrupt are refusals "
              "(alert: EmbeddingMonitorPartialsRefused).", width=8),
        Panel("Records per replica in the merged windows", "short",
              [Target(f"max by (replica) ({m('embmon_reducer_replica_window_records')})", "{{replica}}")],
              "How the partitions and the traffic spread over the replicas; per stream their sum is "
              "embmon_window_records.", min=0),
        Panel("Stale replicas", "none",
              [Target(f"max by (replica) ({m('embmon_reducer_replica_stale')})", "{{replica}}")],
              "1 while the reducer has applied no publication of the replica for scale_out.stale_after_seconds; "
              "its older state stays merged until it leaves the window.",
              min=0, max=1, mappings={"0": ("LIVE", "green"), "1": ("STALE", "red")}),
        Panel("Streams per reducer", "short",
              [Target(f"count by (instance) ({_ms('embmon_reducer_stream_owned')})", "{{instance}}"),
               Target(f"max by (instance) ({m('embmon_reducer_partitions_owned')})", "{{instance}} partitions")],
              "Streams and partials partitions each reducer merges and exports; a group shares them, and "
              "after a reducer dies the others take its partitions over (runbook: Reducer fail-over).",
              width=8, min=0),
        Panel("Reducer rebalances", "short",
              [Target(f"sum by (instance) (increase({m('embmon_reducer_rebalances_total')}[$__rate_interval]))",
                      "{{instance}}")],
              "Changes of the partials partitions each reducer owns: a reducer joined, left or died. A steady "
              "rate means reducers restart or fall out of the group.", width=8, min=0),
        Panel("Which reducer exports which stream", "none",
              [Target(f"max by (model, stream, instance) ({_ms('embmon_reducer_stream_owned')})",
                      "{{model}} {{stream}} {{instance}}", instant=True)],
              "One row per (model, stream) and the reducer that owns it; a stream on two rows is exported twice "
              "(alert: EmbeddingMonitorStreamMergedTwice), one ingested and on no row is not merged "
              "(alert: EmbeddingMonitorStreamNotMerged).", kind="table", width=8),
    ]


BUILDERS = {
    "overview": overview,
    "intrinsic": intrinsic,
    "drift": drift,
    "retrieval": retrieval,
    "monitor-health": monitor_health,
}


def all_dashboards(rules: RuleSet) -> dict[str, dict[str, Any]]:
    """File stem -> dashboard JSON model."""
    return {f"embedding-monitor-{name}": build(rules) for name, build in BUILDERS.items()}
