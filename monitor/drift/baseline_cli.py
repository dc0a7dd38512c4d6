"""``embedding-monitor baseline``: pin, prepare, list and clear drift references.

* ``baseline capture --url http://HOST:9464 --token-file F --model M [--stream S]``: ask a running
  daemon to pin its current window(s) as the reference (``POST /admin/baseline``, bearer token);
* ``baseline capture --from vectors.npy --model M --stream S --state-dir DIR``: store a reference
  from an (n, d) matrix in a state directory (a daemon on DIR uses it from its next start), or
  ``--out FILE`` to write a reference file for ``run --reference``;
* ``baseline show --state-dir DIR [--json]``: the stored references and lagged snapshots, and
  any stored reference that cannot be read, with the reason (the daemon sets those aside);
* ``baseline clear --state-dir DIR --model M [--stream S]``: delete stored references (with the
  daemon stopped; it then falls back to its configured source at the next start).

Exit status: 0 success, 1 the daemon refused or could not be reached, 2 bad usage or input.

The CLI registers this command whenever it builds its parser, so importing this module stays
cheap (the standard library only); numpy and the drift modules load when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

DEFAULT_MAX_ROWS = 10_000


def add_baseline_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``baseline`` (with ``capture``, ``show``, ``clear``) on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "baseline", help="pin, prepare, list and clear drift references",
        description="Pin, prepare, list and clear drift references (docs/drift.md, \"In the daemon\").",
    )
    sub = parser.add_subparsers(dest="baseline_command", required=True, metavar="ACTION")

    capture = sub.add_parser(
        "capture",
        help="pin a running daemon's current window (--url), or build a reference from vectors (--from)",
    )
    where = capture.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the daemon's HTTP address, e.g. http://127.0.0.1:9464")
    where.add_argument("--from", dest="from_path", metavar="VECTORS.npy", help="an (n, d) float matrix")
    capture.add_argument("--model", help="model name (required with --url and --state-dir)")
    capture.add_argument("--stream", help="stream name (with --url: default every stream of the model)")
    capture.add_argument("--token-file", metavar="FILE", help="file holding the admin bearer token (with --url)")
    capture.add_argument("--cafile", metavar="FILE", help="CA bundle to verify an https daemon")
    capture.add_argument("--timeout", type=float, default=30.0, metavar="S", help="HTTP timeout (default 30)")
    out = capture.add_mutually_exclusive_group()
    out.add_argument("--state-dir", metavar="DIR", help="store the reference in this daemon state directory")
    out.add_argument("--out", metavar="FILE", help="write a reference .npz for `run --reference`")
    capture.add_argument(
        "--max-rows", type=int, default=DEFAULT_MAX_ROWS, metavar="N",
        help=f"keep a uniform sample of at most N rows (the centroid uses every row; default {DEFAULT_MAX_ROWS})",
    )
    capture.add_argument("--seed", type=int, default=0, help="seed of the row sample")
    capture.set_defaults(func=run_baseline)

    show = sub.add_parser("show", help="list the references stored in a state directory")
    show.add_argument("--state-dir", required=True, metavar="DIR")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=run_baseline)

    clear = sub.add_parser("clear", help="delete stored references (stop the daemon first)")
    clear.add_argument("--state-dir", required=True, metavar="DIR")
    clear.add_argument("--model", required=True)
    clear.add_argument("--stream", help="default: every stream of the model")
    clear.set_defaults(func=run_baseline)
    return parser


def run_baseline(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        if args.baseline_command == "capture":
            if args.url:
                return _capture_remote(args, stdout, stderr)
            return _capture_offline(args, stdout)
        if args.baseline_command == "show":
            return _show(Path(args.state_dir), args.json, stdout)
        return _clear(Path(args.state_dir), args.model, args.stream, stdout, stderr)
    except _Usage as exc:
        print(f"embedding-monitor baseline: {exc}", file=stderr)
        return 2


class _Usage(Exception):
    """Bad arguments or input: exit status 2."""


def _capture_remote(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    from monitor.drift.admin import BASELINE_PATH
    from monitor.server.admin_client import AdminCallFailed, fail, post_admin

    if not args.model:
        raise _Usage("--model is required with --url")
    if args.state_dir or args.out:
        raise _Usage("--state-dir and --out go with --from, not --url")
    query = {"model": args.model, **({"stream": args.stream} if args.stream else {})}
    try:
        answer = post_admin(args, BASELINE_PATH, query)
    except ValueError as exc:  # no or unreadable token file
        raise _Usage(str(exc)) from None
    except AdminCallFailed as exc:
        return fail("baseline", str(exc), stderr)
    for ref in answer.get("references", []):
        print(_line(ref), file=stdout)
    return 0


def _capture_offline(args: argparse.Namespace, stdout: TextIO) -> int:
    import numpy as np

    from monitor.drift.references.profile import open_matrix, profile_from_matrix
    from monitor.drift.references.store import ReferenceStore, StoredReference

    if not args.state_dir and not args.out:
        raise _Usage("--from needs --state-dir DIR or --out FILE")
    if args.state_dir and not (args.model and args.stream):
        raise _Usage("--state-dir needs --model and --stream")
    if args.max_rows < 2:
        raise _Usage("--max-rows must be at least 2")
    path = Path(args.from_path)
    if path.suffix != ".npy":
        raise _Usage(f"{path}: --from takes an .npy (n, d) matrix")
    try:
        matrix = open_matrix(path)
        profile = profile_from_matrix(
            matrix, max_rows=args.max_rows, captured_at=time.time(), source=f"file {path.name}",
            rng=np.random.default_rng(args.seed),
        )
    except (OSError, ValueError) as exc:
        raise _Usage(str(exc)) from None
    if args.out:
        out = Path(args.out)
        if out.suffix != ".npz":
            raise _Usage(f"{out}: the reference file must end in .npz")
        profile.to_npz(out)
        written = out
    else:
        written = ReferenceStore(Path(args.state_dir)).save(StoredReference(args.model, args.stream, profile, "file"))
    ref = StoredReference(args.model or "-", args.stream or "-", profile, "file", path=written)
    print(_line(ref.describe()), file=stdout)
    return 0


def _show(state_dir: Path, as_json: bool, stdout: TextIO) -> int:
    from monitor.drift.references.lagged import LAGGED_DIR, list_snapshots
    from monitor.drift.references.store import ReferenceStore

    readable, unreadable = ReferenceStore(state_dir).scan()
    refs = [r.describe() for r in readable.values()]
    problems = [{"path": str(path), "unreadable": reason} for path, reason in unreadable.items()]
    lagged: list[dict[str, Any]] = []  # rows of the JSON answer
    snapshots, _ = list_snapshots(state_dir / LAGGED_DIR)  # leftovers are the daemon's to remove
    for (model, stream), snaps in snapshots.items():
        if snaps:
            lagged.append({
                "model": model, "stream": stream,
                "snapshots": len(snaps), "oldest": snaps[0].taken_at, "newest": snaps[-1].taken_at,
                "bytes": sum(s.path.stat().st_size for s in snaps),
            })
    if as_json:
        print(json.dumps({"references": refs, "unreadable": problems, "lagged": lagged}, indent=2), file=stdout)
        return 0
    if not refs and not lagged and not problems:
        print(f"no references stored in {state_dir}", file=stdout)
    for ref in refs:
        print(_line(ref), file=stdout)
    for problem in problems:  # the daemon sets these aside at its next start
        print(f"{problem['path']}: unreadable ({problem['unreadable']})", file=stdout)
    for entry in lagged:
        print(
            f"{entry['model']}/{entry['stream']}: {entry['snapshots']} lagged snapshots from "
            f"{_when(entry['oldest'])} to {_when(entry['newest'])} ({entry['bytes']} bytes)",
            file=stdout,
        )
    return 0


def _clear(state_dir: Path, model: str, stream: str | None, stdout: TextIO, stderr: TextIO) -> int:
    from monitor.drift.references.store import ReferenceStore

    store = ReferenceStore(state_dir)
    targets = [k for k in store.load_all() if k[0] == model and (stream is None or k[1] == stream)]
    if not targets:
        what = f"{model}/{stream}" if stream else model
        print(f"embedding-monitor baseline: no stored reference for {what}", file=stderr)
        return 1
    for key in targets:
        store.delete(*key)
        print(f"deleted the reference of {key[0]}/{key[1]}", file=stdout)
    return 0


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _line(ref: dict[str, Any]) -> str:
    return (
        f"{ref['model']}/{ref['stream']}: {ref['origin']} reference, {ref['records']} records "
        f"({ref['sample_rows']} sampled, d={ref['dim']}), captured {_when(ref['captured_at'])}, "
        f"source {ref['source']!r}" + (f", {ref['path']}" if ref.get("path") else "")
    )
