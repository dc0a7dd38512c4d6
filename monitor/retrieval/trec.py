"""TREC qrels and run files: the interchange format of trec_eval, pytrec_eval, ranx and most IR toolkits.

qrels: ``qid iteration docid grade`` (the iteration column is ignored, usually ``0``).
run:   ``qid Q0 docid rank score tag`` (the rank column is ignored: trec_eval re-sorts by score;
       columns after the tag are ignored, as trec_eval ignores them).

Read as trec_eval reads them: fields are separated by any whitespace, blank lines and ``#``
comment lines (the first non-blank character is ``#``) are skipped; a ``#`` inside a line is
data (document ids such as ``doc#3`` are common). ``.gz`` files are read and written compressed.
A malformed line raises ``TrecFormatError`` naming ``file:line`` and what is wrong with it, so a
bad file fails loudly instead of silently losing queries.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "run.txt"
>>> write_run(path, {"q1": {"d1": 0.5, "d2": 0.9}}, tag="demo")
>>> print(path.read_text(), end="")
q1 Q0 d2 1 0.9 demo
q1 Q0 d1 2 0.5 demo
>>> read_run(path)
{'q1': {'d2': 0.9, 'd1': 0.5}}
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import IO, Literal

__all__ = ["TrecFormatError", "read_qrels", "read_run", "write_qrels", "write_run"]

PathLike = str | os.PathLike[str]


class TrecFormatError(ValueError):
    """A qrels/run file that cannot be read; ``str()`` is ``file:line: what is wrong``."""

    def __init__(self, path: PathLike, line_number: int, message: str) -> None:
        self.path = os.fspath(path)
        self.line_number = line_number
        self.reason = message
        super().__init__(f"{self.path}:{line_number}: {message}")


def read_qrels(path: PathLike) -> dict[str, dict[str, int]]:
    """Read ``qid iteration docid grade`` lines into ``{qid: {docid: grade}}``.

    Grades are integers (as trec_eval requires); a document judged twice for one query is an
    error rather than a silent overwrite.
    """
    qrels: dict[str, dict[str, int]] = {}
    for line_number, fields in _fields(path, expected=4, layout="qid iteration docid grade", extra_ok=False):
        qid, _iteration, docid, grade_text = fields
        try:
            grade = int(grade_text)
        except ValueError:
            raise TrecFormatError(path, line_number, f"grade {grade_text!r} is not an integer") from None
        judged = qrels.setdefault(qid, {})
        if docid in judged:
            raise TrecFormatError(path, line_number, f"document {docid!r} judged twice for query {qid!r}")
        judged[docid] = grade
    return qrels


def read_run(path: PathLike) -> dict[str, dict[str, float]]:
    """Read ``qid Q0 docid rank score tag`` lines into ``{qid: {docid: score}}``.

    Scores must be finite numbers; the rank must be an integer but is otherwise ignored (the
    ranking comes from the scores, as in trec_eval). Fields after the tag are ignored, as in
    trec_eval. A document listed twice for one query is an error.
    """
    run: dict[str, dict[str, float]] = {}
    for line_number, fields in _fields(path, expected=6, layout="qid Q0 docid rank score tag", extra_ok=True):
        qid, _q0, docid, rank_text, score_text = fields[:5]
        try:
            int(rank_text)
        except ValueError:
            raise TrecFormatError(path, line_number, f"rank {rank_text!r} is not an integer") from None
        try:
            score = float(score_text)
        except ValueError:
            raise TrecFormatError(path, line_number, f"score {score_text!r} is not a number") from None
        if not math.isfinite(score):
            raise TrecFormatError(path, line_number, f"score {score_text!r} is not finite")
        scores = run.setdefault(qid, {})
        if docid in scores:
            raise TrecFormatError(path, line_number, f"document {docid!r} listed twice for query {qid!r}")
        scores[docid] = score
    return run


def write_qrels(path: PathLike, qrels: Mapping[str, Mapping[str, int]]) -> None:
    """Write ``qid 0 docid grade`` lines, queries and documents in the mapping's order."""
    with _open(path, "w") as out:
        for qid, judged in qrels.items():
            for docid, grade in judged.items():
                _check_token(qid, "query id")
                _check_token(docid, "document id")
                out.write(f"{qid} 0 {docid} {int(grade)}\n")


def write_run(path: PathLike, run: Mapping[str, Mapping[str, float]], *, tag: str = "embmon") -> None:
    """Write ``qid Q0 docid rank score tag`` lines, each query ranked in trec_eval's order.

    Scores are written with ``repr`` so they read back as the same doubles.
    """
    _check_token(tag, "run tag")
    with _open(path, "w") as out:
        for qid, scores in run.items():
            _check_token(qid, "query id")
            ranked = sorted(scores.items(), key=itemgetter(1, 0), reverse=True)
            for rank, (docid, score) in enumerate(ranked, start=1):
                _check_token(docid, "document id")
                out.write(f"{qid} Q0 {docid} {rank} {float(score)!r} {tag}\n")


def _fields(path: PathLike, *, expected: int, layout: str, extra_ok: bool) -> Iterator[tuple[int, list[str]]]:
    """The fields of each data line with its 1-based number; blank and ``#`` lines are skipped.

    ``extra_ok``: more than ``expected`` fields are allowed (the run's trailing columns).
    """
    with _open(path, "r") as lines:
        line_number = 0
        while True:
            line_number += 1
            try:
                line = next(lines)
            except StopIteration:
                return
            except UnicodeDecodeError as error:
                raise TrecFormatError(path, line_number, f"not UTF-8 text ({error.reason})") from None
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) < expected or (len(fields) > expected and not extra_ok):
                more = "; more are ignored" if extra_ok else ""
                raise TrecFormatError(
                    path,
                    line_number,
                    f"expected {expected} fields ({layout}{more}), found {len(fields)}: {line.strip()!r}",
                )
            yield line_number, fields


def _open(path: PathLike, mode: Literal["r", "w"]) -> IO[str]:
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, "rt" if mode == "r" else "wt", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _check_token(value: str, what: str) -> None:
    if not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} must be non-empty and contain no whitespace")
