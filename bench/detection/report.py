"""From the workers' results to the figures: tables (markdown) and the delay plot.

Definitions (per method and case; a *cycle* is one decision of a batch method, ``n / 4`` records):

- false alarms: the share of null decisions that fired (batch), or alarms per cycle of null stream
  (online); ARL₀ = 1 / that rate, in cycles (independent decisions; 95% Clopper-Pearson bounds);
- matched operating point: the method's own score above the (1 − 1%) quantile of its null scores
  (every method then raises a false alarm in 1% of cycles: ARL₀ = 100 cycles);
- delay: cycles from the change to the first decision that fires (the window holds ``min(1, k/4)``
  post-change records at decision k); a replicate with none within the horizon is *missed*;
  mean delay over the detected replicates (95% bootstrap interval), median over all (missed = ∞);
- power: the share of replicates detected by the first full window (k ≤ 4) at the matched rate;
- capymoa's drift-detection evaluation (after Bifet et al., "Measuring concept change"): MTFA (mean
  time between false alarms, = ARL₀), MTD (mean time to detection), MDR (missed detection rate) and
  MTR = MTFA / MTD × (1 − MDR) (larger is better), at the matched operating point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench.detection.protocol import COST_DECISIONS, FILL

SHARES = ("share1", "share2", "share5", "share10", "share20", "share30")
OTHERS = ("unseen", "swap", "pooling", "norm", "spread")
MATCHED = "matched"


def clopper(alarms: int, n: int) -> tuple[float, float]:
    low = float(stats.beta.ppf(0.025, alarms, n - alarms + 1)) if alarms else 0.0
    high = float(stats.beta.ppf(0.975, alarms + 1, n - alarms)) if alarms < n else 1.0
    return low, high


def decided(record: dict[str, Any], point: str, threshold: float) -> bool:
    if point == MATCHED:
        return bool(record["score"] > threshold)
    return bool(record["decided"].get(point, False))


def points_of(result: dict[str, Any]) -> list[str]:
    null = result["cases"].get("null") or []
    return sorted(null[0][0]["decided"]) if null else []


def null_rate(result: dict[str, Any], case: str, point: str) -> tuple[int, int]:
    records = result["cases"].get(case, [])
    threshold = result.get("thresholds", {}).get(case, math.inf)
    return sum(decided(r[0], point, threshold) for r in records), len(records)


def delays(result: dict[str, Any], case: str, point: str) -> list[float]:
    """Cycles to the first firing decision per replicate (inf: missed)."""
    n = case.split("_n")[1] if "_n" in case else None
    threshold = result.get("thresholds", {}).get(f"null_n{n}" if n else "null", math.inf)
    out = []
    for records in result["cases"].get(case, []):
        first = next((r["k"] for r in records if decided(r, point, threshold)), math.inf)
        out.append(float(first))
    return out


def online_delays(result: dict[str, Any], case: str, per_cycle: int) -> list[float]:
    return [math.ceil((r["alarms"][0] + 1) / per_cycle) if r["alarms"] else math.inf
            for r in result["cases"].get(case, [])]


def online_null(result: dict[str, Any], per_cycle: int) -> tuple[int, float]:
    records = result["cases"].get("online_null", [])
    alarms = sum(len(r["alarms"]) for r in records)
    cycles = sum(r["records"] for r in records) / per_cycle
    return alarms, cycles


def evidence_null(result: dict[str, Any]) -> tuple[int, int]:
    """The accumulating detector's own false alarms and cycles before any change: every null
    replicate's cycles, and every shift replicate's cycles before the change (its warm-up)."""
    alarms = cycles = 0
    for case, replicates in result["cases"].items():
        for records in replicates:
            info = records[0].get("info", {}) if records else {}
            if "evidence_cycles" not in info:
                continue
            if case.startswith("null"):
                alarms += info["evidence_alarms"]
                cycles += info["evidence_cycles"]
            else:
                alarms += info["evidence_alarms"] - int(info["evidence"])
                cycles += info["evidence_cycles"] - 1
    return alarms, cycles


def capped_mean(values: Sequence[float], horizon: int) -> str:
    """The mean delay with a miss counted as the horizon, and how many were found."""
    if not values:
        return "–"
    capped = [min(v, horizon) for v in values]
    found = sum(math.isfinite(v) for v in values)
    return f"{np.mean(capped):.1f} ({found}/{len(values)})"


def summary(values: Sequence[float], seed: int = 0) -> dict[str, Any]:
    found = np.array([v for v in values if math.isfinite(v)])
    missed = len(values) - len(found)
    out: dict[str, Any] = {"replicates": len(values), "missed": missed,
                           "median": float(np.median(values)) if len(values) else math.nan}
    if len(found):
        rng = np.random.default_rng(seed)
        boots = rng.choice(found, size=(2000, len(found))).mean(axis=1)
        out.update(mean=float(found.mean()), low=float(np.quantile(boots, 0.025)),
                   high=float(np.quantile(boots, 0.975)))
    else:
        out.update(mean=math.nan, low=math.nan, high=math.nan)
    return out


def fmt_delay(s: dict[str, Any]) -> str:
    if not s["replicates"]:
        return "–"
    if math.isnan(s["mean"]):
        return f"missed {s['missed']}/{s['replicates']}"
    median = "∞" if math.isinf(s["median"]) else f"{s['median']:g}"
    text = f"{s['mean']:.1f} [{s['low']:.1f}, {s['high']:.1f}], med {median}"
    return text + (f", missed {s['missed']}/{s['replicates']}" if s["missed"] else "")


def fmt_rate(alarms: int, n: int) -> str:
    if not n:
        return "–"
    low, high = clopper(alarms, n)
    arl = "∞" if alarms == 0 else f"{n / alarms:,.0f}"
    return f"{alarms}/{n} ({100 * alarms / n:.1f}%; ARL₀ {arl} [≥ {1 / high:,.0f}])"


def fmt_cost(cost: dict[str, Any], label: str) -> str:
    entry = cost.get(label)
    if not entry:
        return "–"
    return f"{fmt_seconds(entry['seconds'])}, {entry['peak_bytes'] / 2**20:,.0f} MiB"


def fmt_seconds(seconds: float) -> str:
    return f"{1000 * seconds:,.0f} ms" if seconds >= 0.01 else f"{1000 * seconds:.1f} ms"


def fmt_fit(cost: dict[str, Any], label: str) -> str:
    entry = cost.get(label) or {}
    return fmt_seconds(entry["fit_seconds"]) if "fit_seconds" in entry else "–"


def default_point(result: dict[str, Any]) -> str:
    points = points_of(result)
    return "60s" if "60s" in points else points[0] if points else "default"


def rows_for(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(label, result, operating point) rows: the suite at 5 s and 60 s, its 900 s run, the peers' defaults."""
    rows = []
    for result in results:
        if result.get("kind") != "batch" or "error" in result:
            continue
        for point in points_of(result):
            label = (result["method"] if point in ("default", "week")
                     else f"{result['method'].split(' 900s')[0]} ({point})")
            rows.append((label, result, point))
    return rows


def tables(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    every = [r for r in results if r.get("kind") == "batch" and "error" not in r]
    batch = [r for r in every if "week_threshold" not in r]  # a week's operating point: own-rule tables only
    online = [r for r in results if r.get("kind") == "online" and "error" not in r]
    failed = [r for r in results if "error" in r]
    per_cycle = int(meta["n"]) // FILL
    out: list[str] = []
    cases = [c for c in (*SHARES, *OTHERS) if c in meta["cases"]]

    out.append(f"**False alarms on null replicates** (n = {meta['n']}; each tool's own decision rule; the "
               "suite at a false alarm a week: α = 8.3e-6 per 5 s cycle, 9.9e-5 per 60 s cycle, "
               "1.5e-3 per 900 s cycle)\n")
    grid = sorted({int(meta["n"]), *map(int, meta.get("grid", ()))})
    others = [n for n in grid if n != int(meta["n"])]
    out.append("| " + " | ".join(["method (decision)", "false alarms (share; ARL₀ cycles [95% lower bound])",
                                  *(f"at n = {n}" for n in others)]) + " |")
    out.append("|---" * (len(others) + 2) + "|")
    for label, result, point in rows_for(every):
        at_n = [fmt_rate(*null_rate(result, f"null_n{n}", point)) for n in others]
        out.append("| " + " | ".join([label, fmt_rate(*null_rate(result, "null", point)), *at_n]) + " |")
    for result in online:
        alarms, cycles = online_null(result, per_cycle)
        arl = "∞" if alarms == 0 else f"{cycles / alarms:,.0f}"
        out.append(f"| {result['method']} (online) | {alarms} in {cycles:,.0f} cycles (ARL₀ {arl}) |"
                   + " |" * len(others))
    for result in every:
        alarms, cycles = evidence_null(result)
        if cycles:
            out.append(f"| {result['method']}: its accumulating detector alone, every cycle before a change | "
                       f"{alarms} in {cycles:,} cycles (bound: {cycles / 20_160:.2f} at A = 20,160) |"
                       + " |" * len(others))
    out.append("")

    horizon = int(meta["horizon"])
    out.append(f"**At a false alarm a week** (ARL₀ ≥ 10,080 cycles of 60 s) **with a miss counted as the horizon** "
               f"({horizon} cycles): mean cycles to detection (found of replicates). The suite at its 60 s budget, "
               "the suite with the accumulating detector (each at half of it), and the peers whose threshold was "
               "set at a week from fresh null decisions; the online detectors at their defaults, whose false "
               "alarms are in the table above\n")
    out.append("| method | " + " | ".join(case_label(c) for c in cases) + " |")
    out.append("|---" * (len(cases) + 1) + "|")
    for label, result, point in rows_for(every):
        if point not in ("60s", "week"):
            continue
        out.append(f"| {label} | " + " | ".join(capped_mean(delays(result, c, point), horizon) for c in cases) + " |")
    for result in online:
        out.append(f"| {result['method']} (online, its default) | "
                   + " | ".join(capped_mean(online_delays(result, c, per_cycle), horizon) for c in cases) + " |")
    out.append("")

    out.append("**Delay at the matched false-alarm rate** (1% of decisions, ARL₀ = 100 cycles, from each "
               "method's own null scores): mean cycles to detection [95% interval], median, missed of "
               f"{meta['replicates']} (horizon {meta['horizon']} cycles; the window is full at cycle {FILL})\n")
    out.append("| method | " + " | ".join(case_label(c) for c in cases) + " |")
    out.append("|---" * (len(cases) + 1) + "|")
    for result in batch:
        cells = [fmt_delay(summary(delays(result, c, MATCHED))) for c in cases]
        out.append(f"| {result['method']} | " + " | ".join(cells) + " |")
    out.append("")

    weeks = "; ".join(f"{r['method']}: its score above {r['week_threshold']:.4g}, the 1 − 1/10,080 quantile of "
                      f"{r['week_nulls']:,} fresh null decisions (the matched 1% threshold: "
                      f"{r['thresholds'].get('null', math.nan):.4g})" for r in every if "week_threshold" in r)
    out.append("**Delay at each tool's own decision rule** (its default threshold; the suite at its budget"
               + (f"; at the suite's 60 s budget, a false alarm a week, ARL₀ = 10,080 cycles: {weeks}" if weeks else "")
               + ")\n")
    out.append("| method (decision) | " + " | ".join(case_label(c) for c in cases) + " |")
    out.append("|---" * (len(cases) + 1) + "|")
    for label, result, point in rows_for(every):
        cells = [fmt_delay(summary(delays(result, c, point))) for c in cases]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    for result in online:
        cells = [fmt_delay(summary(online_delays(result, c, per_cycle))) for c in cases]
        out.append(f"| {result['method']} (online) | " + " | ".join(cells) + " |")
    out.append("")

    out.append("**Power at the matched rate** (detected by the first full window, k ≤ 4) **and capymoa's "
               "measures** (MTFA = 100 cycles by construction; MTD in cycles; MDR; MTR = MTFA/MTD·(1−MDR)) "
               "over the shift cases with δ ≥ 5%, unseen, swap, pooling, norm and spread\n")
    out.append("| method | " + " | ".join(case_label(c) for c in cases) + " | MTD | MDR | MTR |")
    out.append("|---" * (len(cases) + 4) + "|")
    for result in batch:
        cells = []
        for c in cases:
            d = delays(result, c, MATCHED)
            cells.append(f"{sum(v <= FILL for v in d)}/{len(d)}" if d else "–")
        pooled = [v for c in cases if c not in ("share1", "share2") for v in delays(result, c, MATCHED)]
        found = [v for v in pooled if math.isfinite(v)]
        mtd = float(np.mean(found)) if found else math.nan
        mdr = 1 - len(found) / len(pooled) if pooled else math.nan
        mtr = 100 / mtd * (1 - mdr) if found else 0.0
        out.append(f"| {result['method']} | " + " | ".join(cells) + f" | {mtd:.2f} | {mdr:.2f} | {mtr:.0f} |")
    out.append("")

    out.append("**Sample-size grid** (δ = 10%, matched rate 1% from the grid's own null replicates): power "
               "(detected by k ≤ 4) and mean delay\n")
    out.append("| method | " + " | ".join(f"n = {n}" for n in grid) + " |")
    out.append("|---" * (len(grid) + 1) + "|")
    for result in batch:
        cells = []
        for n in grid:
            case = "share10" if n == int(meta["n"]) else f"share10_n{n}"
            d = delays(result, case, MATCHED)
            s = summary(d)
            cells.append(f"{sum(v <= FILL for v in d)}/{len(d)}, {s['mean']:.1f}" if d else "–")
        out.append(f"| {result['method']} | " + " | ".join(cells) + " |")
    out.append("")

    out.append("**Cost per decision** (median of {k} decisions on n = {n} window rows against n reference rows, "
               "after the fit; the peak resident memory the decision added; the fit once per reference), each "
               "method timed alone, one after another, on the 2-core machine of the run line above (one thread each)\n"
               .format(n=meta["cost_n"], k=COST_DECISIONS))
    out.append("| method | d = 384 | d = 768 | fit, d = 384 |")
    out.append("|---|---|---|---|")
    for result in sorted(batch, key=lambda r: (r["cost"].get("d384") or {}).get("seconds", math.inf)):
        out.append(f"| {result['method']} | {fmt_cost(result['cost'], 'd384')} | {fmt_cost(result['cost'], 'd768')} "
                   f"| {fmt_fit(result['cost'], 'd384')} |")
    for result in online:
        timed = result["cost"].get("online") or {}
        per = result["cost"].get("seconds_per_record", {})
        mean = timed.get("seconds_per_record", float(np.mean(list(per.values()))) if per else math.nan)
        if math.isfinite(mean):
            timed_where = "" if timed else " (timed in the cases, the machine shared)"
            out.append(f"| {result['method']} (online) | {1e6 * mean:,.1f} µs per record "
                       f"({fmt_seconds(mean * per_cycle)} per cycle of {per_cycle}){timed_where} | | "
                       f"{fmt_fit(result['cost'], 'online') if timed else result.get('cost_error', '–')} |")
    out.extend(f"| {r['method']} | {r['cost_error']} | | |" for r in results
               if "cost_error" in r and r.get("kind") != "online" and "week_threshold" not in r)
    out.append("")

    if failed:
        out.append("**Not run**: " + "; ".join(f"{r['method']}: {r['error']}" for r in failed) + "\n")
    return "\n".join(out)


def case_label(case: str) -> str:
    return f"δ {case[len('share'):]}%" if case.startswith("share") else case


def explanation_rows(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Point 5: does the explanation name the injected class, at the suite's first verdict or the next cycle?"""
    out = ["| case | suite: verdicts | named the injected class | by a region | by the novel share | "
           "DriftLens (matched rate): blamed the injected class |", "|---|---|---|---|---|---|"]
    suite = next((r for r in results if r.get("method") == "embedding-monitor" and "cases" in r), None)
    lens = next((r for r in results if r.get("method") == "DriftLens" and "cases" in r), None)
    for case in (*SHARES, "unseen"):
        if suite is None or case not in suite["cases"]:
            continue
        delta = 0.10 if case == "unseen" else int(case[len("share"):]) / 100
        verdicts = named = by_region = by_novel = 0
        for records in suite["cases"][case]:
            first = next((i for i, r in enumerate(records) if r["decided"].get("60s")), None)
            if first is None:
                continue
            verdicts += 1
            region_hit = novel_hit = False
            for r in records[first:first + 2]:
                hit = names_injected(r.get("info", {}).get("explanation") or {}, delta)
                region_hit |= hit[0]
                novel_hit |= hit[1]
            by_region += region_hit
            by_novel += novel_hit
            named += region_hit or novel_hit
        blamed = "–"
        if lens is not None and case in lens["cases"]:  # at the matched rate: its own threshold never fires here
            threshold = lens.get("thresholds", {}).get("null", math.inf)
            hits = [next((r.get("info", {}).get("explanation", {}).get("named") for r in recs
                          if decided(r, MATCHED, threshold)), None) for recs in lens["cases"][case]]
            fired = [h for h in hits if h is not None]
            blamed = f"{sum(fired)}/{len(fired)} of its detections"
        out.append(f"| {case_label(case)} | {verdicts}/{len(suite['cases'][case])} | {named}/{verdicts} | "
                   f"{by_region} | {by_novel} | {blamed} |")
    return "\n".join(out)


def names_injected(explained: dict[str, Any], delta: float) -> tuple[bool, bool]:
    """(by a region, by the novel share): does this explanation name the injected class?"""
    purities = list(explained.get("named_purity", [])) + [explained.get("first_purity", 0.0)]
    novel = bool(explained.get("novel_shifted")) and (
        explained.get("novel_share", 0.0) - explained.get("novel_reference_share", 0.0) >= delta / 2)
    return any(p >= 0.6 for p in purities), novel


def exemplars_show_injected(explained: dict[str, Any]) -> bool:
    """Are most of the first region's window exemplars (what the on-call reads beside it) rows of the
    injected class? False when there is no first region or it has no exemplars."""
    shown = explained.get("first_exemplars", 0)
    return bool(shown) and 2 * explained.get("first_exemplars_injected", 0) > shown


def explain_at_defaults_rows(results: list[dict[str, Any]]) -> str:
    """Point 5 at the daemon's default sizes, per cap on the number of regions (suite_worker.explain_at_defaults)."""
    found = next((r for r in results if r.get("kind") == "explain" and r.get("cases")), None)
    if found is None:
        return ""
    caps = found["caps"]
    reference, window = found["sizes"]
    out = [f"**What moved at the daemon's default sizes** ({reference:,} reference rows with their regions, a "
           f"{window:,}-row window wholly after the change, the suite at a 60 s cycle with its defaults; one "
           "replicate per seen class): the verdicts, and how often the explanation named the injected class, as "
           "the daemon shows it (behind the verdict) and ungated (the ranking and the regions Benjamini-Hochberg "
           "names, whatever the verdict), with `drift.regions.max_regions` at "
           + " and ".join(map(str, caps)) + " (k regions)\n",
           "| case | verdicts | " + " | ".join(f"named, {c} regions (behind the verdict; ungated)" for c in caps)
           + f" | the first region's window exemplars mostly the injected class, {caps[-1]} regions (behind the "
           "verdict; ungated) | classes never named (ungated, largest cap) |",
           "|---" * (len(caps) + 4) + "|"]
    for case, records in found["cases"].items():
        delta = 0.10 if case == "unseen" else int(case[len("share"):]) / 100
        cells = []
        for cap in caps:
            gated = sum(any(names_injected(r[f"gated{cap}"], delta)) for r in records)
            ungated = sum(any(names_injected(r[f"ungated{cap}"], delta)) for r in records)
            k = sorted({r[f"ungated{cap}"].get("k") for r in records})
            cells.append(f"{gated}/{len(records)}; {ungated}/{len(records)} (k = {', '.join(map(str, k))})")
        shown = [sum(exemplars_show_injected(r[f"{gate}{caps[-1]}"]) for r in records) for gate in ("gated", "ungated")]
        cells.append(f"{shown[0]}/{len(records)}; {shown[1]}/{len(records)}")
        missed = [r["class"] for r in records if not any(names_injected(r[f"ungated{caps[-1]}"], delta))]
        missed_text = ", ".join(f"`{c}`" for c in missed) if case != "unseen" else f"{len(missed)} of {len(records)}"
        out.append(f"| {case_label(case)} | {sum(r['detected'] for r in records)}/{len(records)} | "
                   + " | ".join(cells) + f" | {missed_text} |")
    return "\n".join(out) + "\n"


def plot(results: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Mean delay (missed replicates counted at the horizon + 1) against δ, one line per method: at the
    matched rate (every method, 1% false alarms per decision) and at the suite's budget (a false alarm a
    week at a 60 s cycle: the suite's own rule and each peer measured there)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizon = int(meta["horizon"])
    xs = [int(c[len("share"):]) for c in SHARES if c in meta["cases"]]
    batch = [r for r in results if r.get("kind") == "batch" and "error" not in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    colours = {r["method"]: f"C{i % 10}" for i, r in enumerate(batch)}  # a method's colour, in both panels

    def line(ax: Any, result: dict[str, Any], point: str, label: str) -> None:
        ys = []
        for x in xs:
            d = delays(result, f"share{x}", point)
            ys.append(float(np.mean([min(v, horizon + 1) for v in d])) if d else math.nan)
        style = "-o" if label.startswith("embedding-monitor") else "--."
        ax.plot(xs, ys, style, label=label, linewidth=2.5 if style == "-o" else 1.2, color=colours[result["method"]])

    for result in batch:
        if "week_threshold" not in result:
            line(left, result, MATCHED, result["method"])
    for result in batch:
        if result["method"].startswith("embedding-monitor") and "60s" in points_of(result) \
                and result["method"] != "embedding-monitor every test":  # its delays are the staged suite's
            line(right, result, "60s", f"{result['method']} (its 60 s rule)")
        elif "week_threshold" in result:
            line(right, result, "week", result["method"])
    for ax, title in ((left, "at equal ARL₀ = 100 cycles (1% false alarms per decision)"),
                      (right, "at equal ARL₀ = a week of 60 s cycles (10,080)")):
        ax.axhline(horizon + 1, color="grey", linewidth=0.8, linestyle=":")
        ax.text(xs[0], horizon + 1.05, "missed (horizon + 1)", color="grey", fontsize=8)
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x}%" for x in xs])
        ax.minorticks_off()  # the log axis's minor labels (3 × 10⁰ ...) say nothing here
        ax.set_xlabel(f"δ: one class's share raised by (WordNet glosses, all-MiniLM-L6-v2, n = {meta['n']})")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7, ncol=1, loc="lower left")
        ax.grid(alpha=0.3)
    left.set_ylabel("mean detection delay (cycles; window full at 4)")
    fig.suptitle("Delay against shift size at equal false-alarm rates")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
