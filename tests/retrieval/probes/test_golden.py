"""Golden-set probe: file format, request templates, response paths, and the probe end to end
against a real HTTP search server (stdlib ``http.server``), over the window sample, and with text
queries embedded by all-MiniLM-L6-v2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitor.config import ConfigError, load_settings
from monitor.retrieval.metrics import RankedResults, evaluate
from monitor.retrieval.probes.component import ProbeComponent
from monitor.retrieval.probes.deadline import ProbeError
from monitor.retrieval.probes.golden import load_golden
from monitor.retrieval.probes.ids_path import extract_ids, parse_ids_path
from monitor.retrieval.probes.request_template import RequestTemplate
from monitor.retrieval.stats import bootstrap_ci
from tests.support.probes import (
    SearchServer,
    collect,
    cosine_ranking,
    probe_context,
    window_of,
)
from tests.support.realdata import minilm_encode, minilm_path
from tests.support.scrape import value

K = 10


# ---------------------------------------------------------------------------- file format
def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "not JSON"),
        ({"query_id": "q", "vector": [1.0]}, "qrels must be a non-empty object"),
        ({"query_id": "q", "qrels": {"d": 1}}, "give a vector or a text"),
        ({"query_id": True, "qrels": {"d": 1}, "text": "t"}, "query_id must be"),
        ({"query_id": "q", "qrels": {"d": "high"}, "text": "t"}, "grade of 'd' must be a finite number"),
        ({"query_id": "q", "qrels": {"d": 1}, "vector": [0.0, 0.0]}, "finite and non-zero"),
        ({"query_id": "q", "qrels": {"d": 1}, "text": "t", "slice": "has space"}, "slice must be a label-safe string"),
        ({"query_id": "q", "qrels": {"d": 1}, "text": "t", "score": 3}, "unknown fields"),
    ],
)
def test_a_bad_golden_line_names_the_file_and_line(tmp_path: Path, row: Any, message: str) -> None:
    path = write_jsonl(tmp_path / "golden.jsonl", [{"query_id": "ok", "qrels": {"d": 1}, "text": "fine"}, row])
    with pytest.raises(ValueError, match=rf"golden\.jsonl:2: .*{message}"):
        load_golden(path)


def test_repeated_ids_and_mixed_dimensions_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=":2: query_id 'a' repeated"):
        load_golden(write_jsonl(tmp_path / "a.jsonl", [{"query_id": "a", "qrels": {"d": 1}, "text": "x"}] * 2))
    rows = [{"query_id": "a", "qrels": {"d": 1}, "vector": [1, 2]}, {"query_id": "b", "qrels": {"d": 1}, "vector": [1]}]
    with pytest.raises(ValueError, match=":2: vector has 1 components, earlier ones 2"):
        load_golden(write_jsonl(tmp_path / "b.jsonl", rows))
    query = load_golden(
        write_jsonl(tmp_path / "c.jsonl", [{"query_id": 7, "qrels": {"d": 2}, "text": "x", "slice": "tail"}])
    )[0]
    assert (query.query_id, dict(query.qrels), query.slice, query.vector) == ("7", {"d": 2.0}, "tail", None)


# ---------------------------------------------------------------------------- templates and paths
def test_template_values_are_json_encoded_never_pasted() -> None:
    template = RequestTemplate('{"q": "{{text}}", "v": {{vector}}, "size": {{k}}, "note": "id={{query_id}} k={{k}}"}')
    nasty = 'a "quoted" text}, "size": 9999, "x": "{{k}}'
    body = json.loads(template.render({"text": nasty, "vector": [0.25, -1.0], "k": 3, "query_id": "q-1"}))
    assert body == {"q": nasty, "v": [0.25, -1.0], "size": 3, "note": "id=q-1 k=3"}
    as_mapping = RequestTemplate({"query": {"knn": {"vector": "{{vector}}", "k": "{{k}}"}}})
    assert json.loads(as_mapping.render({"vector": [1.0], "k": 5, "text": "", "query_id": "q"})) == {
        "query": {"knn": {"vector": [1.0], "k": 5}}}
    assert template.names == {"text", "vector", "k", "query_id"}


def test_bad_templates_fail_at_start_up() -> None:
    with pytest.raises(ValueError, match="unknown placeholders \\['size'\\]"):
        RequestTemplate('{"n": {{size}}}')
    with pytest.raises(ValueError, match="not JSON"):
        RequestTemplate('{"n": {{k}}')
    with pytest.raises(ConfigError, match="request_template is required for POST"):
        load_settings(overrides={"probes": {"golden": [{
            "name": "g", "file": __file__, "model": "m",
            "retriever": {"kind": "http", "url": "http://127.0.0.1:1/s", "ids_path": "ids[*]"}}]}})


def test_ids_paths_follow_fields_lists_and_indexes() -> None:
    doc = {"hits": {"hits": [{"_id": "a"}, {"_id": 2}]}, "pages": [{"ids": ["x", "y"]}, {"ids": ["z"]}]}
    assert extract_ids(doc, parse_ids_path("hits.hits[*]._id")) == ["a", "2"]
    assert extract_ids(doc, parse_ids_path("pages[*].ids[*]")) == ["x", "y", "z"]
    assert extract_ids(doc, parse_ids_path("pages[1].ids[0]")) == ["z"]
    assert extract_ids(["p", "q"], parse_ids_path("[*]")) == ["p", "q"]
    with pytest.raises(ProbeError, match="no field 'hits'"):
        extract_ids({"took": 3}, parse_ids_path("hits.hits[*]._id"))
    with pytest.raises(ProbeError, match="not a string or integer"):
        extract_ids({"ids": [{"nested": 1}]}, parse_ids_path("ids[*]"))
    with pytest.raises(ValueError, match="cannot parse"):
        parse_ids_path("hits..[x]")


# ---------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def collection() -> dict[str, Any]:
    """400 documents in 16 topics; 90 queries near a document, judged on it (2) and 3 topic mates (1)."""
    rng = np.random.default_rng(8)
    topics = rng.integers(0, 16, 400)
    centres = rng.standard_normal((16, 16))
    docs = (centres[topics] + 0.8 * rng.standard_normal((400, 16))).astype(np.float32)
    ids = [f"doc-{i}" for i in range(400)]
    queries = []
    for n, source in enumerate(rng.choice(400, 90, replace=False)):
        mates = rng.choice(np.flatnonzero(topics == topics[source]), 3)
        qrels = {ids[m]: 1 for m in mates} | {ids[source]: 2}
        vector = docs[source] + 0.5 * rng.standard_normal(16)
        queries.append({"query_id": f"q{n}", "vector": vector.round(5).tolist(), "qrels": qrels,
                        "slice": "head" if n < 60 else "tail", "text": f'query "{n}" {{k}}'})
    return {"docs": docs, "ids": ids, "queries": queries}


def expected_metrics(collection: dict[str, Any], ks: list[int]) -> dict[str, dict[str, Any]]:
    """The engine on rankings computed here (float64 brute force), overall and per slice."""
    queries = collection["queries"]
    ranked = [[collection["ids"][i] for i in cosine_ranking(np.asarray(q["vector"]), collection["docs"], max(ks))]
              for q in queries]
    names = [f"{f}@{k}" for f in ("precision", "recall", "map", "mrr", "ndcg", "err", "hit_rate") for k in ks]
    per_query = evaluate(RankedResults.from_lists(ranked, [q["qrels"] for q in queries]), names)
    out = {"all": bootstrap_ci(per_query, resamples=500, seed=0)}
    for name in ("head", "tail"):
        members = np.array([q["slice"] == name for q in queries])
        out[name] = {m: v[members] for m, v in per_query.items()}
    # an independent hand computation of two of them
    precision = [
        len(set(r[:5]) & {d for d, g in q["qrels"].items() if g >= 1}) / 5 for r, q in zip(ranked, queries, strict=True)
    ]
    first = [
        next((1 / (i + 1) for i, d in enumerate(r[:K]) if d in q["qrels"]), 0.0)
        for r, q in zip(ranked, queries, strict=True)
    ]
    np.testing.assert_allclose(per_query["precision@5"], precision)
    np.testing.assert_allclose(per_query[f"mrr@{K}"], first)
    return out


def golden_settings(tmp_path: Path, golden: Path, retriever: dict[str, Any], **extra: Any) -> Any:
    return load_settings(overrides={
        "state_dir": str(tmp_path / "state"),
        "probes": {"device": "cpu", "statistics": {"resamples": 500, "min_slice_queries": 40},
                   "golden": [{"name": "golden", "file": str(golden), "model": "m", "k": [5, K],
                               "retriever": retriever, "timeout_seconds": 60, **extra}]},
    })


def check_exported(samples: dict, expected: dict[str, dict[str, Any]], n_queries: int) -> None:  # type: ignore[type-arg]
    for name, ci in expected["all"].items():
        family, k = name.split("@")
        labels = {"probe": "golden", "model": "m", "slice": "all", "k": k}
        assert value(samples, f"embmon_retrieval_{family}", **labels) == pytest.approx(ci.mean, abs=1e-12), name
        assert value(samples, f"embmon_retrieval_{family}_ci_lower", **labels) == pytest.approx(ci.lower, abs=1e-12)
        assert value(samples, f"embmon_retrieval_{family}_ci_upper", **labels) == pytest.approx(ci.upper, abs=1e-12)
    for slice_ in ("head", "tail"):
        for name, values in expected[slice_].items():
            family, k = name.split("@")
            got = value(samples, f"embmon_retrieval_{family}", probe="golden", model="m", slice=slice_, k=k)
            assert got == pytest.approx(values.mean(), abs=1e-12), (slice_, name)
    assert value(samples, "embmon_retrieval_queries", probe="golden", model="m", slice="all") == n_queries
    assert value(samples, "embmon_retrieval_queries", probe="golden", model="m", slice="head") == 60
    assert value(samples, "embmon_retrieval_queries", probe="golden", model="m", slice="tail") == 30
    # tail has 30 queries, under min_slice_queries = 40: flagged
    assert value(samples, "embmon_retrieval_slice_warnings", probe="golden", model="m", kind="small_slice") == 1
    assert value(samples, "embmon_probe_runs_total", probe="golden", outcome="success") == 1


def test_golden_set_against_a_real_http_search_server(tmp_path: Path, collection: dict[str, Any]) -> None:
    golden = write_jsonl(tmp_path / "golden.jsonl", collection["queries"])
    with SearchServer(collection["ids"], collection["docs"]) as server:
        settings = golden_settings(tmp_path, golden, {
            "kind": "http", "url": server.url, "ids_path": "hits.hits[*]._id", "request_timeout_seconds": 5,
            "request_template": '{"query": {"match": {"body": "{{text}}"}}, "vector": {{vector}}, "k": {{k}}}',
        })
        component = ProbeComponent(probe_context(settings))
        component.run_probe("golden")
    assert len(server.requests) == len(collection["queries"])
    first = server.requests[0]
    assert first["query"]["match"]["body"] == 'query "0" {k}' and first["k"] == K  # text arrived intact
    assert first["vector"] == pytest.approx(collection["queries"][0]["vector"], abs=1e-6)
    check_exported(collect(component), expected_metrics(collection, [5, K]), len(collection["queries"]))


def test_golden_set_over_the_window_sample(tmp_path: Path, collection: dict[str, Any]) -> None:
    golden = write_jsonl(tmp_path / "golden.jsonl", collection["queries"])
    settings = golden_settings(tmp_path, golden, {"kind": "knn", "stream": "documents"})
    window = window_of(collection["docs"], collection["ids"])
    component = ProbeComponent(probe_context(settings, {("m", "documents"): window}))
    component.run_probe("golden")
    check_exported(collect(component), expected_metrics(collection, [5, K]), len(collection["queries"]))


@pytest.mark.slow  # 5.8 s on the 2-core machine, 3.3 s of it CPU (.cache/test-durations.json)
def test_text_queries_are_embedded_with_the_configured_encoder(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 (offline) embeds documents and query texts; the probe ranks the sample."""
    path = minilm_path()
    docs = ["The cat sat on the warm windowsill.", "Interest rates rose by half a point.",
            "The striker scored twice in the final.", "Bake the bread for forty minutes.",
            "The telescope observed a distant galaxy.", "Vaccines train the immune system."]
    queries = [
        ("q0", "a kitten resting by the window", "doc-0"),
        ("q1", "central bank raises borrowing costs", "doc-1"),
        ("q2", "football match goals", "doc-2"),
        ("q3", "how long to cook a loaf", "doc-3"),
        ("q4", "astronomy and stars far away", "doc-4"),
        ("q5", "how immunisation works", "doc-5"),
    ]
    doc_vectors = minilm_encode(tuple(docs), normalize=True)
    query_vectors = minilm_encode(tuple(t for _, t, _ in queries), normalize=True)
    golden = write_jsonl(
        tmp_path / "golden.jsonl", [{"query_id": q, "text": t, "qrels": {d: 1}} for q, t, d in queries]
    )
    ids = [f"doc-{i}" for i in range(len(docs))]
    settings = golden_settings(tmp_path, golden, {"kind": "knn"}, encoder={"path": str(path)})
    component = ProbeComponent(probe_context(settings, {("m", "documents"): window_of(doc_vectors, ids)}))
    component.run_probe("golden")
    ranked = [[ids[i] for i in cosine_ranking(v, doc_vectors, K)] for v in query_vectors]
    expected = evaluate(RankedResults.from_lists(ranked, [{d: 1} for _, _, d in queries]), [f"mrr@{K}", "ndcg@5"])
    samples = collect(component)
    labels = {"probe": "golden", "model": "m", "slice": "all"}
    assert value(samples, "embmon_retrieval_mrr", **labels, k=str(K)) == pytest.approx(
        expected[f"mrr@{K}"].mean(), abs=1e-9
    )
    assert value(samples, "embmon_retrieval_ndcg", **labels, k="5") == pytest.approx(
        expected["ndcg@5"].mean(), abs=1e-9
    )
    assert expected[f"mrr@{K}"].mean() > 0.8  # a real model finds these (paraphrase) documents


def test_text_only_queries_without_an_encoder_are_a_configuration_error(tmp_path: Path) -> None:
    golden = write_jsonl(tmp_path / "golden.jsonl", [{"query_id": "q", "text": "hello", "qrels": {"d": 1}}])
    settings = golden_settings(tmp_path, golden, {"kind": "knn"})
    with pytest.raises(ConfigError, match="have only a text .* configure probes.golden\\[golden\\].encoder"):
        ProbeComponent(probe_context(settings))
