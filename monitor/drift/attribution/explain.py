"""The answer to "what changed?": the last cycle's verdict, its regions ranked by their part of the MMD, exemplar ids.

Built from a published :class:`~monitor.drift.export.CycleResult` (never from live state), served
as JSON by ``GET /admin/drift/explain`` and printed by ``embedding-monitor drift explain``
(:mod:`monitor.drift.cli`). Standard library only; the CLI formats what the endpoint returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monitor.drift.export import CycleResult

NO_REGIONS = (
    "the reference has no regions: its sample is too small (fewer than 200 rows) or drift.regions.enabled is false"
)
NO_IDS = "no exemplar ids: the records carry no ids (binary batches, or JSON without an id field)"


def explanation(model: str, stream: str, cycle: CycleResult) -> dict[str, Any]:
    """One (model, stream)'s last cycle as plain JSON values (see docs/drift.md, "What moved")."""
    report = cycle.report
    out: dict[str, Any] = {
        "model": model,
        "stream": stream,
        "computed_at": cycle.computed_at,
        "reference_captured_at": cycle.reference_captured_at,
        "detected": cycle.detected,
        "flagged_by": cycle.flagged_by,
        "detected_tests": list(report.detected_tests),
        "evidence": None if cycle.evidence is None else {
            "rows": cycle.evidence.rows,
            "log_evidence": cycle.evidence.log_evidence,
            "log_threshold": cycle.evidence.log_threshold,
            "alarmed": cycle.evidence.alarmed,
        },
        "cycle_alpha": report.cycle_alpha,
        "window_rows": report.window_size,
        "tests": [
            {
                "test": r.test,
                "p_value": r.p_value,
                "threshold": r.threshold,
                "detected": r.detected,
                "p_value_floor": r.extra.get("p_value_floor"),
            }
            for r in report.results
        ],
        "cut": dict(report.cut),
        "errors": dict(report.errors),
        "regions": None,
        "notes": [],
    }
    regions = report.regions
    if regions is None:
        out["notes"].append(NO_REGIONS)
        return out
    out["regions"] = {
        "k": len(regions.regions),
        "alpha": regions.alpha,
        "reference_rows": regions.reference_rows,
        "window_rows": regions.window_rows,
        "shifted": list(regions.shifted),
        "novel_share": regions.novel_share,
        "novel_reference_share": regions.novel_reference_share,
        "novel_p_value": regions.novel_p_value,
        "novel_p_adjusted": regions.novel_p_adjusted,
        "novel_shifted": regions.novel_shifted,
        "novel_exemplars": list(regions.novel_exemplars),
        "ranked": [
            {
                "region": r.region,
                "reference_share": r.reference_share,
                "window_share": r.window_share,
                "change": r.change,
                "mmd_share": r.mmd_share,
                "p_value": r.p_value,
                "p_adjusted": r.p_adjusted,
                "shifted": r.shifted,
                "reference_exemplars": list(r.reference_exemplars),
                "window_exemplars": list(r.window_exemplars),
            }
            for r in regions.ranked()
        ],
    }
    if not any(r.window_exemplars or r.reference_exemplars for r in regions.regions):
        out["notes"].append(NO_IDS)
    return out
