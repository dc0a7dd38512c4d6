"""The demo's live view: hand-made status snapshots drawn as plain lines and as a rich table."""

from __future__ import annotations

import io
import math

from rich.console import Console

from monitor.cli.demo_view import (
    DemoStatus,
    DriftView,
    JobCounts,
    ModelView,
    RegionView,
    StreamView,
    plain_lines,
    render,
)
from monitor.retrieval.probes.base import Estimate

TOPIC = DriftView(
    detected=True, p_value=2.4e-11, threshold=3.9e-6, tests=("ks", "classifier"),
    top_region=RegionView(region=5, reference_share=0.06, window_share=0.34, p_adjusted=1e-40, shifted=True,
                          exemplars=("topic-8812", "topic-9104"), mmd_share=0.58),
    novel_share=0.29,
)
QUIET = DriftView(detected=False, p_value=0.61, threshold=3.9e-6, tests=(), top_region=None, novel_share=0.0)


def status(**changes: object) -> DemoStatus:
    base = DemoStatus(
        elapsed=212.4,
        phase="topic_shift",
        phase_left=17.6,
        streams=(
            StreamView("minilm-demo", "documents", 15000, 0.2641, 345.04, False, TOPIC),
            StreamView("mpnet-demo", "documents", 15000, 0.2270, 681.7, False, QUIET),
            StreamView("mpnet-demo", "catalog", 120, math.nan, math.nan, False, None, "capturing its reference"),
        ),
        models=(
            ModelView(
                "minilm-demo",
                0.0312,
                True,
                16,
                Estimate("ann_recall", "minilm-demo", "all", 10, 0.948, 0.943, 0.953),
                Estimate("ndcg", "minilm-demo", "all", 10, 0.63, 0.6, 0.66),
            ),
            ModelView("mpnet-demo", None, False, 0, None, None),
        ),
        invalid={"non_finite": 40, "decode_error": 2, "wrong_dimension": 0},
        jobs=JobCounts(runs=310, skipped=1, overran=2),
        notes=("log: /tmp/embmon-demo-x.log",),
    )
    return DemoStatus(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def drawn(status: DemoStatus, width: int = 200) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(render(status))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def test_plain_lines_say_every_verdict_one_line_per_stream_and_model() -> None:
    lines = plain_lines(status())
    assert lines[0] == (
        "[t=212s] phase topic_shift (18s left) | invalid records 42 (decode_error 2, non_finite 40) | "
        "jobs 310 run, 1 skipped, 2 overran"
    )
    assert lines[1] == (
        "  minilm-demo/documents: 15000 records, isotropy 0.264, eff. rank 345.0, collapse no | "
        "drift YES p=2.4e-11 < 3.9e-06 (ks, classifier) | region 5 6%->34% (58% of MMD, p=1e-40) "
        "e.g. topic-8812, topic-9104; novel 29%"
    )
    assert lines[2] == (
        "  mpnet-demo/documents: 15000 records, isotropy 0.227, eff. rank 681.7, collapse no | drift no p=0.61"
    )
    assert lines[3] == (
        "  mpnet-demo/catalog: 120 records, isotropy -, eff. rank -, collapse no | drift - (capturing its reference)"
    )
    assert lines[4] == (
        "  minilm-demo: canary min cos 0.0312 CHANGED (16 mismatches since start) | "
        "ANN recall@10 0.948 [0.943, 0.953] | nDCG@10 0.630 [0.600, 0.660]"
    )
    assert lines[5] == "  mpnet-demo: canary - | ANN recall - | nDCG -"
    assert len(lines) == 6


def test_a_healthy_snapshot_has_no_alarm_words() -> None:
    calm = status(
        phase="healthy", phase_left=None, invalid={}, jobs=JobCounts(40, 0, 0),
        streams=(StreamView("m", "documents", 900, 0.3, 80.0, False, QUIET),),
        models=(ModelView("m", 0.99999, False, 0, None, None),),
    )
    text = "\n".join(plain_lines(calm))
    assert "phase healthy |" in text and "invalid records 0" in text and "0 skipped, 0 overran" in text
    for alarm in ("YES", "CHANGED", "region"):
        assert alarm not in text


def test_the_rich_view_shows_the_same_values_as_the_plain_lines() -> None:
    text = drawn(status())
    for cell in (
        "phase: topic_shift (18s left)", "invalid records 42", "1 skipped, 2 overran",
        "minilm-demo/documents", "0.264", "345.0", "YES p=2.4e-11 < 3.9e-06 (ks, classifier)",
        "region 5 6%->34%", "topic-8812", "novel 29%", "no p=0.61", "(capturing its reference)",
        "min cos 0.0312 CHANGED", "@10 0.948 [0.943, 0.953]", "@10 0.630 [0.600, 0.660]",
        "log: /tmp/embmon-demo-x.log",
    ):
        assert cell in text, cell
    assert text.count("minilm-demo") == 2  # one stream row, one model row


def test_the_rich_view_fits_a_narrow_terminal_without_losing_rows() -> None:
    text = drawn(status(), width=100)
    assert max(len(line) for line in text.splitlines()) <= 100
    for row in ("minilm-demo/documents", "mpnet-demo/documents", "mpnet-demo/catalog"):
        assert row.split("/")[0] in text
