"""What moved: the explanation of a real topic shift, its delay, the endpoint over HTTP and the CLI.

Real MiniLM embeddings of real sentences (tests/support/topics.py): the stream switches to two
help topics its reference never had, from half-way through a cycle (``TopicStream`` in
tests/support/drift.py). The explanation must name what moved (shifted regions or the novel share) and
point at the new items by their ids, within two cycles; on unchanged data it names nothing at
more than its rate (tests/drift/test_null_rate.py counts that).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from monitor.cli.main import main
from monitor.config import load_settings
from tests.support import daemons, topics
from tests.support.drift import MODEL, STREAM, TopicStream
from tests.support.imports import loaded_after
from tests.support.waiting import wait_until

TOKEN = "explain-admin-token-0123456789"


def explain(stream: TopicStream) -> dict[str, Any]:
    status, _, body = stream.h.routes["/admin/drift/explain"]({"QUERY_STRING": f"model={MODEL}&stream={STREAM}"})
    assert status == 200, body
    [entry] = json.loads(body)["explanations"]
    return entry


def new_topic_share(ids: list[str]) -> float:
    return sum(topics.topic_of(i) in topics.NEW_TOPICS for i in ids) / max(1, len(ids))


@pytest.mark.slow
@pytest.mark.parametrize("interval", [5.0, 900.0])
def test_a_topic_shift_is_explained_with_the_new_items_within_two_cycles(tmp_path: Path, interval: float) -> None:
    stream = TopicStream(tmp_path / "state", interval, seed=3)
    try:
        stream.feed(None, 3000, interval)  # the reference
        for _ in range(2):
            stream.feed(None, 1500, interval)
            stream.cycle()
            quiet = explain(stream)
            assert quiet["regions"]["shifted"] == [] and not quiet["regions"]["novel_shifted"]
        stream.feed(None, 750, interval / 2, batches=5)
        stream.feed("topic_shift", 750, interval / 2, batches=5)
        named_at = None
        for cycle in (1, 2):
            stream.cycle()
            entry = explain(stream)
            regions = entry["regions"]
            if regions["shifted"] or regions["novel_shifted"]:
                named_at = cycle
                break
            stream.feed("topic_shift", 1500, interval)
    finally:
        stream.close()
    assert named_at is not None, "the explanation named nothing within 2 cycles"
    assert entry["detected"]
    gained = [r for r in regions["ranked"] if r["shifted"] and r["change"] > 0]
    # the ids a person would open are the new topic's sentences: the novel items, and the window's
    # least familiar items of the regions that gained share
    assert new_topic_share(regions["novel_exemplars"]) == 1.0
    for ids in [regions["novel_exemplars"]] + [r["window_exemplars"] for r in regions["ranked"]]:
        assert len(set(ids)) == len(ids)  # records repeat in the stream; exemplars do not
    window_ids = [i for r in gained for i in r["window_exemplars"]]
    assert not gained or new_topic_share(window_ids) >= 0.8
    # the reference exemplars say what each region was about: the usual topics
    reference_ids = [i for r in regions["ranked"] for i in r["reference_exemplars"]]
    assert reference_ids and new_topic_share(reference_ids) == 0.0
    print(f"interval {interval:g}s: explanation named "
          f"{len(regions['shifted'])} region(s), novel {regions['novel_share']:.2f}, at cycle {named_at}")


def daemon_settings(state_dir: Path) -> Any:
    return load_settings(
        overrides={
            "source": "synthetic",
            "synthetic": {"models": [{"name": "m", "dim": 16}], "stream": "docs", "rate": 500.0, "batch_size": 25,
                          "phases": [{"kind": "healthy", "seconds": 600.0}]},
            "window": {"seconds": 2.0, "subwindows": 2, "reservoir_size": 300},
            "refresh_seconds": 0.5,
            "state_dir": str(state_dir),
            "http": {"host": "127.0.0.1", "port": 0, "admin_token": TOKEN},
            "drift": {"interval_seconds": 1.0, "false_alarm_every": "1h", "reference": {"records": 300},
                      "reference_sample_size": 200, "window_sample_size": 200, "threads": 1},
        }
    )


def test_drift_explain_asks_a_running_daemon(
    state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with daemons.monitor(daemon_settings(state_dir)) as monitor:
        url = f"http://127.0.0.1:{monitor.http.port}"
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        args = ["drift", "explain", "--url", url, "--token-file", str(token), "--model", "m"]

        def answered() -> bool:
            return main([*args, "--json"]) == 0

        wait_until(answered, timeout=30, interval=0.5, message="an explanation after the first drift cycle")
        answer = json.loads(capsys.readouterr().out)
        [entry] = answer["explanations"]
        assert (entry["model"], entry["stream"]) == ("m", "docs")
        assert entry["regions"]["k"] >= 2 and len(entry["regions"]["ranked"]) == entry["regions"]["k"]
        assert any("no exemplar ids" in note for note in entry["notes"])  # binary batches carry no ids
        assert main(args) == 0
        table = capsys.readouterr().out
        assert table.startswith("m/docs  cycle at ") and "region  of MMD  reference  window  change" in table
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-admin-token-at-all")
        assert main(["drift", "explain", "--url", url, "--token-file", str(wrong), "--model", "m"]) == 1
        assert "answered 401" in capsys.readouterr().err
        assert main(["drift", "explain", "--url", url, "--token-file", str(token), "--model", "other"]) == 1
        assert "answered 404" in capsys.readouterr().err
        assert main(["drift", "explain", "--url", url, "--model", "m"]) == 2  # no token file


def test_the_drift_command_registers_without_numpy() -> None:
    code = """
        import argparse
        from monitor.drift.cli import add_drift_parser
        add_drift_parser(argparse.ArgumentParser().add_subparsers())
    """
    assert loaded_after(code, ("numpy",)) == []
