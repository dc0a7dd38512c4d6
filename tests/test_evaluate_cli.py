"""The ``evaluate`` command: table and JSON output, --compare, --k expansion, exit 2 on bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from monitor.retrieval.evaluate import add_evaluate_parser, main
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.trec import read_qrels, read_run, write_qrels, write_run


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """60 judged queries; run ``weak`` lacks one of them, ``strong`` ranks relevant documents higher."""
    rng = np.random.default_rng(42)
    root = tmp_path_factory.mktemp("trec")
    qrels = {
        f"q{q}": {f"d{d}": int(rng.integers(0, 4)) for d in rng.choice(40, size=8, replace=False)} for q in range(60)
    }
    weak, strong = {}, {}
    for qid, judged in qrels.items():
        noise = rng.normal(size=40)
        grades = np.array([judged.get(f"d{d}", 0) for d in range(40)])
        if qid != "q0":
            weak[qid] = {f"d{d}": float(noise[d] + 0.2 * grades[d]) for d in range(40)}
        strong[qid] = {f"d{d}": float(noise[d] + 1.5 * grades[d]) for d in range(40)}
    strong["unjudged"] = {"d1": 1.0}
    paths = {"qrels": root / "qrels.txt", "weak": root / "weak.txt", "strong": root / "strong.txt"}
    write_qrels(paths["qrels"], qrels)
    write_run(paths["weak"], weak, tag="weak")
    write_run(paths["strong"], strong, tag="strong")
    return {name: str(path) for name, path in paths.items()}


def _json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_module_prints_a_table(files):
    completed = subprocess.run(
        [sys.executable, "-m", "monitor.retrieval.evaluate", "--qrels", files["qrels"], "--run", files["weak"]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("metric"))
    assert lines[header].split() == ["metric", "mean", "ci_lower", "ci_upper", "queries"]
    rows = [line.split() for line in lines[header + 1 :]]
    assert [row[0] for row in rows] == ["ndcg@10", "recall@100", "map@100", "mrr@10", "precision@10"]
    for _, mean, lower, upper, n in rows:
        assert float(lower) <= float(mean) <= float(upper)
        assert n == "59"
    assert "1 judged query without a ranking: skipped" in completed.stderr


def test_module_exits_2_naming_file_and_line(tmp_path, files):
    bad = tmp_path / "bad_run.txt"
    bad.write_text("q1 Q0 d1 1 0.5 t\nq1 Q0 d2 1 0.5\n")
    completed = subprocess.run(
        [sys.executable, "-m", "monitor.retrieval.evaluate", "--qrels", files["qrels"], "--run", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert f"{bad}:2: expected 6 fields" in completed.stderr
    assert completed.stdout == ""


def test_json_means_are_the_engine_means(capsys, files):
    argv = ["--qrels", files["qrels"], "--run", files["weak"], "--metrics", "ndcg@10", "r_precision"]
    report, _ = _json(capsys, argv)
    results = RankedResults.from_run(read_run(files["weak"]), read_qrels(files["qrels"]))
    expected = evaluate(results, ["ndcg@10", "r_precision"])
    assert report["queries"] == 59
    for name, values in expected.items():
        metric = report["run"]["metrics"][name]
        assert metric["mean"] == pytest.approx(values.mean(), abs=1e-12)
        assert metric["ci_lower"] < metric["mean"] < metric["ci_upper"]
        assert metric["n_queries"] == 59
    assert report["settings"] == {
        "relevance_threshold": 1.0,
        "gain": "linear",
        "max_grade": 3.0,
        "resamples": 1000,
        "confidence": 0.95,
        "seed": 0,
        "all_queries": False,
    }
    assert "compare" not in report


def test_k_expands_families_and_engine_options_pass_through(capsys, files):
    report, _ = _json(
        capsys,
        [
            "--qrels", files["qrels"], "--run", files["weak"],
            "--metrics", "ndcg", "err", "mrr@3",
            "--k", "5", "10",
            "--gain", "exponential", "--max-grade", "4", "--relevance-threshold", "2",
            "--resamples", "200", "--confidence", "0.9", "--seed", "3",
        ],
    )  # fmt: skip
    assert list(report["run"]["metrics"]) == ["ndcg@5", "ndcg@10", "err@5", "err@10", "mrr@3"]
    results = RankedResults.from_run(read_run(files["weak"]), read_qrels(files["qrels"]))
    expected = evaluate(
        results, ["ndcg@10", "err@5", "mrr@3"], gain="exponential", max_grade=4, relevance_threshold=2
    )
    for name, values in expected.items():
        assert report["run"]["metrics"][name]["mean"] == pytest.approx(values.mean(), abs=1e-12)
    assert report["settings"]["resamples"] == 200 and report["settings"]["confidence"] == 0.9


def test_compare_finds_the_stronger_run_significant(capsys, files):
    argv = ["--qrels", files["qrels"], "--run", files["weak"], "--compare", files["strong"]]
    argv += ["--metrics", "ndcg@10", "mrr"]
    report, err = _json(capsys, argv)
    assert report["queries"] == 59  # q0 is only in the strong run: left out of both
    assert "in only one of the two runs" in err
    assert "without judgments: ignored" in err
    for name in ("ndcg@10", "mrr"):
        difference = report["difference"][name]
        a, b = report["run"]["metrics"][name], report["compare"]["metrics"][name]
        assert difference["mean_difference"] == pytest.approx(b["mean"] - a["mean"], abs=1e-12)
        assert 0 < difference["ci_lower"] < difference["ci_upper"]
        assert difference["p_value"] == pytest.approx(1 / 1001)
        assert difference["p_value_bh"] <= 0.05 and difference["significant"] is True

    assert main(argv) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.startswith("metric"))
    columns = ["metric", "A", "A_ci", "B", "B_ci", "diff", "diff_ci", "p", "p_bh", "significant", "queries"]
    assert header.split() == columns
    ndcg_row = next(line for line in table.splitlines() if line.startswith("ndcg@10"))
    assert ndcg_row.split()[-2:] == ["yes", "59"]


def test_a_run_compared_with_itself_is_not_significant(capsys, files):
    report, _ = _json(capsys, ["--qrels", files["qrels"], "--run", files["weak"], "--compare", files["weak"]])
    for difference in report["difference"].values():
        assert difference["mean_difference"] == 0.0
        assert difference["p_value"] == 1.0 and difference["significant"] is False


def test_all_queries_scores_the_missing_query_as_zero(capsys, files):
    argv = ["--qrels", files["qrels"], "--run", files["weak"], "--metrics", "mrr"]
    default, _ = _json(capsys, argv)
    complete, err = _json(capsys, [*argv, "--all-queries"])
    assert (default["queries"], complete["queries"]) == (59, 60)
    default_mrr, complete_mrr = default["run"]["metrics"]["mrr"]["mean"], complete["run"]["metrics"]["mrr"]["mean"]
    assert complete_mrr == pytest.approx(default_mrr * 59 / 60)
    assert "scored 0 (--all-queries)" in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--metrics", "ndcg@10", "bleu"], "unknown metric family 'bleu'"),
        (["--metrics", "precision"], "precision needs a cutoff"),
        (["--qrels", "/nonexistent/qrels.txt"], "cannot read /nonexistent/qrels.txt"),
    ],
)
def test_bad_metrics_and_missing_files_exit_2(capsys, files, extra, message):
    argv = ["--qrels", files["qrels"], "--run", files["weak"], *extra]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_no_shared_queries_exit_2(capsys, tmp_path, files):
    qrels = tmp_path / "other_qrels.txt"
    write_qrels(qrels, {"elsewhere": {"d1": 1}})
    assert main(["--qrels", str(qrels), "--run", files["weak"]]) == 2
    assert "no query of" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["--resamples", "0"], ["--confidence", "1.5"], ["--k", "ten"], ["--gain", "cubic"]])
def test_bad_option_values_exit_2(capsys, files, bad):
    with pytest.raises(SystemExit) as caught:
        main(["--qrels", files["qrels"], "--run", files["weak"], *bad])
    assert caught.value.code == 2
    assert "error: argument" in capsys.readouterr().err


def test_registers_on_a_subparsers_object(capsys, files):
    parser = argparse.ArgumentParser(prog="embedding-monitor")
    add_evaluate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["evaluate", "--qrels", files["qrels"], "--run", files["weak"], "--metrics", "hit_rate@1"])
    assert args.command == "evaluate"
    assert args.func(args) == 0
    assert "hit_rate@1" in capsys.readouterr().out
