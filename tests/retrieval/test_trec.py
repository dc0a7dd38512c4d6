"""TREC qrels/run files: round trips, trec_eval's ordering on write, what trec_eval skips or ignores
(comment and blank lines, run columns after the tag), file:line errors on bad lines."""

from __future__ import annotations

import gzip

import pytest

from monitor.retrieval.trec import TrecFormatError, read_qrels, read_run, write_qrels, write_run


def test_qrels_round_trip(tmp_path):
    qrels = {"q1": {"d1": 2, "d2": 0}, "q_2": {"d9": 1}}
    path = tmp_path / "qrels.txt"
    write_qrels(path, qrels)
    assert path.read_text() == "q1 0 d1 2\nq1 0 d2 0\nq_2 0 d9 1\n"
    assert read_qrels(path) == qrels


def test_run_is_written_in_trec_eval_order_and_reads_back_the_same_doubles(tmp_path):
    run = {"q1": {"a": 0.1, "b": 1 / 3, "c": 1 / 3, "d": -2.5e-17}}
    path = tmp_path / "run.txt"
    write_run(path, run, tag="sys")
    lines = path.read_text().splitlines()
    assert [line.split()[2] for line in lines] == ["c", "b", "a", "d"]  # ties: docid descending
    assert [line.split()[3] for line in lines] == ["1", "2", "3", "4"]
    assert {line.split()[5] for line in lines} == {"sys"}
    assert read_run(path) == {"q1": {"c": 1 / 3, "b": 1 / 3, "a": 0.1, "d": -2.5e-17}}


def test_whitespace_blank_lines_and_ignored_columns(tmp_path):
    path = tmp_path / "run.txt"
    path.write_text("q1\tQ0  d1 7 2.5 tag\n\n   \nq1 Q0 d2 1 1e-3 other\n")
    assert read_run(path) == {"q1": {"d1": 2.5, "d2": 0.001}}
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 iter7 d1 -1\r\nq1 0 d2 3\r\n")
    assert read_qrels(qrels) == {"q1": {"d1": -1, "d2": 3}}


def test_comment_lines_are_skipped_but_a_hash_inside_a_line_is_data(tmp_path):
    # trec_eval skips lines starting with '#' (after blanks, in run files); ids like 'doc#13' are common
    run = tmp_path / "run.txt"
    run.write_text(
        "# run: bm25\n  # indented comment\nq1 Q0 doc#13 1 2.5 tag\n#q1 Q0 d9 2 9.0 tag\nq#2 Q0 d2 1 1 tag\n"
    )
    assert read_run(run) == {"q1": {"doc#13": 2.5}, "q#2": {"d2": 1.0}}
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("# qid iter docid grade\n\nq1 0 doc#13 2\n# q1 0 d9 3\n\t\nq1 0 d2 0\n")
    assert read_qrels(qrels) == {"q1": {"doc#13": 2, "d2": 0}}


def test_run_columns_after_the_tag_are_ignored_as_trec_eval_ignores_them(tmp_path):
    path = tmp_path / "run.txt"
    path.write_text("q1 Q0 d1 1 2.5 tag 0.93 note\nq1 Q0 d2 2 1.5 tag\n")
    assert read_run(path) == {"q1": {"d1": 2.5, "d2": 1.5}}


def test_gzip_files(tmp_path):
    path = tmp_path / "run.txt.gz"
    write_run(path, {"q": {"d": 1.5}})
    with gzip.open(path, "rt") as handle:
        assert handle.read() == "q Q0 d 1 1.5 embmon\n"
    assert read_run(path) == {"q": {"d": 1.5}}


@pytest.mark.parametrize(
    ("reader", "content", "line", "reason"),
    [
        (read_qrels, "q1 0 d1 1\nq1 0 d2\n", 2, "expected 4 fields"),
        (read_qrels, "q1 0 d1 1\n\nq1 0 d2 1 extra\n", 3, "found 5"),  # trec_eval rejects it too
        (read_qrels, "# header\n\nq1 0 d1 1\nq1 0 d2\n", 4, "expected 4 fields"),  # comments count as lines
        (read_qrels, "q1 0 d1 high\n", 1, "grade 'high' is not an integer"),
        (read_qrels, "q1 0 d1 1.5\n", 1, "not an integer"),
        (read_qrels, "q1 0 d1 1\nq1 0 d1 2\n", 2, "judged twice"),
        (read_run, "q1 Q0 d1 1 0.5\n", 1, "expected 6 fields"),
        (read_run, "# c\nq1 Q0 d1 1 0.5 t x y\n#\nq1 Q0 d2 2\n", 4, "more are ignored), found 4"),
        (read_run, "q1 Q0 d1 1 0.5 t\nq1 Q0 d2 first 0.4 t\n", 2, "rank 'first' is not an integer"),
        (read_run, "q1 Q0 d1 1 high t\n", 1, "score 'high' is not a number"),
        (read_run, "q1 Q0 d1 1 nan t\n", 1, "not finite"),
        (read_run, "q1 Q0 d1 1 inf t\n", 1, "not finite"),
        (read_run, "q1 Q0 d1 1 0.5 t\nq2 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", 3, "listed twice"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, reader, content, line, reason):
    path = tmp_path / "trec.txt"
    path.write_text(content)
    with pytest.raises(TrecFormatError) as caught:
        reader(path)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert reason in str(caught.value)
    assert (caught.value.path, caught.value.line_number) == (str(path), line)


def test_binary_garbage_is_a_format_error_not_a_crash(tmp_path):
    path = tmp_path / "run.txt"
    path.write_bytes(b"q1 Q0 d1 1 0.5 t\n\xff\xfe\x00garbage\n")
    with pytest.raises(TrecFormatError, match="not UTF-8"):
        read_run(path)


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_qrels(tmp_path / "absent.txt")


@pytest.mark.parametrize("bad", ["", "two words", "tab\tin"])
def test_writers_refuse_ids_that_would_break_the_format(tmp_path, bad):
    with pytest.raises(ValueError, match="whitespace"):
        write_run(tmp_path / "run.txt", {"q": {bad: 1.0}})
    with pytest.raises(ValueError, match="whitespace"):
        write_qrels(tmp_path / "qrels.txt", {bad: {"d": 1}})
