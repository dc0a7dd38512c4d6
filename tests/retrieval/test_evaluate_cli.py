"""The ``evaluate`` command: table and JSON output, --compare, --k expansion, exit 2 on bad input;
trec_eval's ``-q`` layout and ``-M`` depth against pytrec_eval, and ERR/nDCG against gdeval's definition."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval

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
        "depth": None,
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


# --- trec_eval's -q layout and -M depth, against pytrec_eval ----------------------------------------

# our name -> pytrec_eval's (trec_eval's) measure name
TREC_NAMES = {
    "map": "map",
    "ndcg": "ndcg",
    "ndcg@10": "ndcg_cut_10",
    "precision@5": "P_5",
    "recall@100": "recall_100",
    "mrr": "recip_rank",
    "r_precision": "Rprec",
}
# trec_eval's per-query printf: "%-22s\t%s\t%6.4f\n"
TREC_EVAL_LINE = re.compile(r"^(?P<measure>\S+) *\t(?P<query>\S+)\t(?P<value>\d\.\d{4})$")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """The real command, in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "monitor.retrieval.evaluate", *argv], capture_output=True, text=True, timeout=60
    )


def _trec_eval(qrels_path, run, measures=None):
    """pytrec_eval (trec_eval's C code) on the qrels file and a run dict (every measure by default)."""
    measures = TREC_NAMES.values() if measures is None else measures
    return pytrec_eval.RelevanceEvaluator(read_qrels(qrels_path), set(measures)).evaluate(run)


def test_per_query_prints_trec_eval_q_layout_with_pytrec_eval_values(files):
    done = _cli("--qrels", files["qrels"], "--run", files["weak"], "-q", "--metrics", *TREC_NAMES)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 59 * len(TREC_NAMES) + len(TREC_NAMES)  # per query, then one 'all' line per measure
    parsed = [TREC_EVAL_LINE.match(line) for line in lines]
    assert all(parsed), [line for line, match in zip(lines, parsed, strict=True) if not match]
    for line in lines:
        assert len(line.split("\t")[0]) == 22  # left-justified, padded to 22 like "%-22s"
    queries = [m["query"] for m in parsed[: -len(TREC_NAMES)]]
    # each query's measures together, in the order asked for; queries in strcmp order, as trec_eval
    assert queries[:: len(TREC_NAMES)] == sorted(set(queries))
    assert [m["measure"] for m in parsed[: len(TREC_NAMES)]] == list(TREC_NAMES)
    trec = _trec_eval(files["qrels"], read_run(files["weak"]))
    for m in parsed[: -len(TREC_NAMES)]:
        assert m["value"] == f"{trec[m['query']][TREC_NAMES[m['measure']]]:6.4f}", m.group(0)
    tail = parsed[-len(TREC_NAMES) :]
    assert [(m["measure"], m["query"]) for m in tail] == [(name, "all") for name in TREC_NAMES]
    for m in tail:
        mean = np.mean([values[TREC_NAMES[m["measure"]]] for values in trec.values()])
        assert m["value"] == f"{mean:6.4f}"


def test_depth_equals_pytrec_eval_on_the_run_cut_to_depth(tmp_path, files):
    # scores in 4 levels: many ties, so which documents survive the cut depends on the docid tie-break
    rng = np.random.default_rng(5)
    run = {
        qid: {f"d{d}": float(rng.integers(0, 4)) for d in rng.choice(40, size=30, replace=False)}
        for qid in read_qrels(files["qrels"])
    }
    path = tmp_path / "tied_run.txt"
    write_run(path, run)
    depth = 7
    # trec_eval's order, written out independently: score descending, then docid descending
    cut = {
        qid: dict(sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)[:depth])
        for qid, scores in run.items()
    }
    trec = _trec_eval(files["qrels"], cut)
    whole = _trec_eval(files["qrels"], run)
    for flag in ("-M", "--depth"):
        done = _cli("--qrels", files["qrels"], "--run", str(path), flag, str(depth), "-q", "--json",
                    "--metrics", *TREC_NAMES, "--resamples", "10")  # fmt: skip
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["settings"]["depth"] == depth
        per_query = report["run"]["per_query"]
        assert list(per_query) == sorted(trec)
        for qid, values in per_query.items():
            for name, value in values.items():
                assert value == pytest.approx(trec[qid][TREC_NAMES[name]], abs=1e-9), (qid, name)
        # the cut changed something: the whole run scores differently on some queries
        assert any(
            abs(per_query[qid]["map"] - whole[qid]["map"]) > 1e-6 for qid in per_query
        )


def test_depth_shows_in_the_table_header(files):
    done = _cli("--qrels", files["qrels"], "--run", files["weak"], "--depth", "20", "--metrics", "map")
    assert done.returncode == 0, done.stderr
    assert "depth: 20" in done.stdout.splitlines()[0]


def test_per_query_json_carries_both_runs_and_text_with_compare_is_refused(capsys, files):
    argv = ["--qrels", files["qrels"], "--run", files["weak"], "--compare", files["strong"], "--metrics", "mrr"]
    report, _ = _json(capsys, [*argv, "--per-query"])
    assert list(report["run"]["per_query"]) == list(report["compare"]["per_query"])
    assert len(report["run"]["per_query"]) == report["queries"] == 59
    means = [np.mean([v["mrr"] for v in report[key]["per_query"].values()]) for key in ("run", "compare")]
    assert means == [pytest.approx(report[key]["metrics"]["mrr"]["mean"], abs=1e-12) for key in ("run", "compare")]
    assert main([*argv, "-q"]) == 2
    captured = capsys.readouterr()
    assert "--per-query prints one run" in captured.err and captured.out == ""


def test_comments_blank_lines_and_extra_run_columns_read_as_trec_eval_reads_them(tmp_path, files):
    plain = _cli("--qrels", files["qrels"], "--run", files["weak"], "-q", "--metrics", "ndcg@10", "map")
    noisy_qrels, noisy_run = tmp_path / "qrels.txt", tmp_path / "run.txt"
    noisy_qrels.write_text("# judged by two assessors\n\n" + Path(files["qrels"]).read_text() + "   # end\n")
    run_lines = [line + " extra columns\n" for line in Path(files["weak"]).read_text().splitlines()]
    noisy_run.write_text("# system: weak\n" + "\n".join(run_lines[:100]) + "\n#mid\n" + "".join(run_lines[100:]))
    noisy = _cli("--qrels", str(noisy_qrels), "--run", str(noisy_run), "-q", "--metrics", "ndcg@10", "map")
    assert noisy.returncode == plain.returncode == 0, noisy.stderr
    assert noisy.stdout == plain.stdout


def test_malformed_line_after_comments_names_its_physical_line(tmp_path, files):
    bad = tmp_path / "run.txt"
    bad.write_text("# header\n\nq1 Q0 d1 1 0.5 t extra\nq1 Q0 d2 2 0.4\n")
    done = _cli("--qrels", files["qrels"], "--run", str(bad))
    assert done.returncode == 2
    assert f"{bad}:4: expected 6 fields" in done.stderr and done.stdout == ""


# --- ERR's top grade: gdeval.pl ---------------------------------------------------------------------


def _gdeval(qrels, run, k):
    """gdeval.pl (TREC Web track 2010-14), written from its definition, per topic: (ndcg@k, err@k).

    Judgments are 0..4 (gdeval refuses more); only positive ones count. A topic is scored when it has a
    positive judgment and a ranking. The run is ranked by score descending, then docid descending.
    nDCG@k: gain 2^g - 1, discount 1/log2(rank + 1), over the ideal ordering of the positive judgments.
    ERR@k: stop probability R = (2^g - 1) / 2^4; sum over ranks of R / rank times P(not stopped before).
    """
    scored = {}
    for topic, judged in qrels.items():
        positive = {doc: grade for doc, grade in judged.items() if grade > 0}
        if not positive or topic not in run:
            continue
        ranked = [doc for doc, _ in sorted(run[topic].items(), key=lambda item: (item[1], item[0]), reverse=True)]
        gains = [positive.get(doc, 0) for doc in ranked[:k]]
        ideal = sorted(positive.values(), reverse=True)[:k]
        dcg = sum((2**g - 1) / math.log2(rank + 2) for rank, g in enumerate(gains))
        ideal_dcg = sum((2**g - 1) / math.log2(rank + 2) for rank, g in enumerate(ideal))
        err, not_stopped = 0.0, 1.0
        for rank, g in enumerate(gains, start=1):
            stop = (2**g - 1) / 2**4
            err += not_stopped * stop / rank
            not_stopped *= 1 - stop
        scored[topic] = (dcg / ideal_dcg, err)
    return scored


@pytest.fixture(scope="module")
def graded_0_to_4(tmp_path_factory):
    """Numeric topics (as gdeval requires), grades 0..4 with every topic holding a 4, score ties."""
    rng = np.random.default_rng(11)
    root = tmp_path_factory.mktemp("gdeval")
    qrels, run = {}, {}
    for topic in range(101, 141):
        docs = [f"doc{d}" for d in rng.choice(60, size=15, replace=False)]
        qrels[str(topic)] = {doc: int(rng.integers(0, 5)) for doc in docs}
        qrels[str(topic)][docs[0]] = 4
        ranked = rng.choice(60, size=30, replace=False)
        run[str(topic)] = {f"doc{d}": float(rng.integers(0, 10)) / 2 for d in ranked}
    write_qrels(root / "qrels.txt", qrels)
    write_run(root / "run.txt", run)
    return qrels, run, str(root / "qrels.txt"), str(root / "run.txt")


@pytest.mark.parametrize("k", [5, 20])
def test_max_grade_4_with_exponential_gain_is_gdeval(graded_0_to_4, k):
    qrels, run, qrels_path, run_path = graded_0_to_4
    expected = _gdeval(qrels, run, k)
    assert len(expected) == 40
    done = _cli("--qrels", qrels_path, "--run", run_path, "--metrics", f"ndcg@{k}", f"err@{k}",
                "--max-grade", "4", "--gain", "exponential", "-q", "--json", "--resamples", "10")  # fmt: skip
    assert done.returncode == 0, done.stderr
    per_query = json.loads(done.stdout)["run"]["per_query"]
    assert set(per_query) == set(expected)
    for topic, (ndcg, err) in expected.items():
        assert per_query[topic][f"ndcg@{k}"] == pytest.approx(ndcg, abs=1e-12), topic
        assert per_query[topic][f"err@{k}"] == pytest.approx(err, abs=1e-12), topic

    # the default top grade, 3, is not gdeval's: stop probabilities of grades 1-3 double, a 4 is clipped to 3
    default = _cli("--qrels", qrels_path, "--run", run_path, "--metrics", f"err@{k}", "-q", "--json",
                   "--resamples", "10")  # fmt: skip
    default_err = json.loads(default.stdout)["run"]["per_query"]
    reached = [topic for topic, (_, err) in expected.items() if err > 0]
    assert len(reached) > 20
    assert all(abs(default_err[topic][f"err@{k}"] - expected[topic][1]) > 1e-4 for topic in reached)


def test_help_says_the_err_default_and_the_trec_eval_flags():
    done = _cli("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "gdeval.pl fixes 4" in text and "(default: 3.0)" in text
    assert "-M N, --depth N" in text and "trec_eval -M" in text
    assert "-q, --per-query" in text and "trec_eval -q" in text
