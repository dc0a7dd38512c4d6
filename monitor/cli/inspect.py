"""``embedding-monitor inspect``: the daemon's metric code on a file, offline.

Reads an ``.npy`` (n, d) matrix or a JSONL file of embedding events (decoded by the same decoder
as the live path) and prints the intrinsic metrics of each (model, stream), as a table or JSON
whose keys are the gauge names without the ``embmon_`` prefix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monitor.config import ConfigError, Settings, load_settings
from monitor.decoding.decoder import Decoder, RawMessage
from monitor.quality.intrinsic import IntrinsicReport, report_from_matrix

JSONL_CHUNK = 5000


def run_inspect(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    path = Path(args.path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    reports, invalid = inspect_file(path, settings)
    if args.model:
        reports = {k: v for k, v in reports.items() if k[0] == args.model}
    if not reports:
        rejected = f" (rejected: {_counts(invalid)})" if invalid else ""
        for_model = f" for model {args.model}" if args.model else ""
        print(f"embedding-monitor: {path}: no usable embeddings{for_model}{rejected}", file=sys.stderr)
        return 2
    if args.json:
        for (model, stream), report in sorted(reports.items()):
            print(json.dumps({"model": model, "stream": stream, **report_dict(report)}, sort_keys=False))
    else:
        print(format_table(reports))
    if invalid:
        print(f"invalid records: {_counts(invalid)}", file=sys.stderr)
    return 0


def _counts(invalid: Counter[str]) -> str:
    return ", ".join(f"{reason}={n}" for reason, n in sorted(invalid.items()))


def inspect_file(path: Path, settings: Settings) -> tuple[dict[tuple[str, str], IntrinsicReport], Counter[str]]:
    """Reports per (model, stream) and the invalid-record counts by reason."""
    groups: dict[tuple[str, str], list[np.ndarray]] = defaultdict(list)
    pair_groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    invalid: Counter[str] = Counter()
    decoder = Decoder(settings.limits)
    if path.suffix == ".npy":
        try:
            matrix = np.load(path, allow_pickle=False)
        except EOFError:
            raise ConfigError(f"{path}: empty file, not an .npy matrix") from None
        except (ValueError, OSError) as exc:  # a truncated header or data section, not .npy at all
            raise ConfigError(f"{path}: not a readable .npy file ({exc})") from None
        if matrix.ndim != 2 or matrix.dtype.kind not in "fiu":
            raise ConfigError(f"{path}: expected a numeric (n, d) matrix, got shape {matrix.shape} {matrix.dtype}")
        rows = np.ascontiguousarray(matrix, dtype="<f4")
        headers = (("model", b"default"), ("dim", str(rows.shape[1]).encode()))
        step = max(1, settings.limits.max_rows_per_message)
        chunks = [(rows[i : i + step].tobytes(), headers) for i in range(0, rows.shape[0], step)]
        _decode_chunk(decoder, chunks, groups, pair_groups, invalid)
    else:
        with path.open("rb") as handle:
            chunk: list[tuple[bytes, tuple]] = []
            for line in handle:
                if line.strip():
                    chunk.append((line.strip(), ()))
                if len(chunk) >= JSONL_CHUNK:
                    _decode_chunk(decoder, chunk, groups, pair_groups, invalid)
                    chunk = []
            _decode_chunk(decoder, chunk, groups, pair_groups, invalid)
    reports = {}
    for key, parts in groups.items():
        matrix = np.concatenate(parts) if len(parts) > 1 else parts[0]
        pair_ids = [p for part in pair_groups[key] for p in part] if pair_groups.get(key) else None
        if pair_ids is not None and all(p is None for p in pair_ids):
            pair_ids = None
        reports[key] = report_from_matrix(matrix, settings=settings.quality, pair_ids=pair_ids)
    return reports, invalid


def _decode_chunk(
    decoder: Decoder,
    chunk: Sequence[RawMessage],
    groups: dict[tuple[str, str], list[np.ndarray]],
    pair_groups: dict[tuple[str, str], list[Any]],
    invalid: Counter[str],
) -> None:
    if not chunk:
        return
    result = decoder.decode_embeddings(chunk)
    for batch in result.batches:
        key = (batch.model, batch.stream)
        groups[key].append(batch.vectors)
        pair_groups[key].append(batch.pair_ids if batch.pair_ids is not None else (None,) * batch.size)
    for (_stream, reason), count in result.rejected.items():
        invalid[reason] += count


def report_dict(report: IntrinsicReport) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in dataclasses.fields(report):
        value = getattr(report, field.name)
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        elif isinstance(value, (float, np.floating)):
            value = None if math.isnan(value) else float(value)
        elif isinstance(value, np.integer):
            value = int(value)
        out[field.name] = value
    return out


def format_table(reports: dict[tuple[str, str], IntrinsicReport]) -> str:
    blocks = []
    for (model, stream), report in sorted(reports.items()):
        rows = [f"model={model} stream={stream}"]
        for name, value in report_dict(report).items():
            shown = "-" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))
            rows.append(f"  {name:<28}{shown}")
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks)
