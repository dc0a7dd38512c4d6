"""``embedding-monitor canary``: re-pin a model's canaries after an intended change, list the pins.

* ``canary repin --url http://HOST:9464 --token-file F --model M``: the running daemon pins each
  canary of M to its latest arrival (``POST /admin/canaries/repin``); the daemon logs it;
* ``canary show --state-dir DIR [--json]``: the pins stored in a state directory.

Exit status: 0 success, 1 the daemon refused or could not be reached, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from monitor.server.admin_client import AdminCallFailed, add_admin_flags, fail, post_admin


def add_canary_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "canary", help="re-pin or list canary vectors", description="Re-pin or list canary vectors (docs/canaries.md)."
    )
    sub = parser.add_subparsers(dest="canary_command", required=True, metavar="ACTION")
    repin = sub.add_parser("repin", help="pin a running daemon's canaries of a model to their latest arrival")
    add_admin_flags(repin)
    repin.add_argument("--model", required=True)
    repin.set_defaults(func=run_canary)
    show = sub.add_parser("show", help="list the canary pins stored in a state directory")
    show.add_argument("--state-dir", required=True, metavar="DIR")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=run_canary)
    return parser


def run_canary(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    if args.canary_command == "repin":
        try:
            answer = post_admin(args, "/admin/canaries/repin", {"model": args.model})
        except ValueError as exc:
            print(f"embedding-monitor canary: {exc}", file=stderr)
            return 2
        except AdminCallFailed as exc:
            return fail("canary", str(exc), stderr)
        print(f"{answer['model']}: re-pinned {len(answer['repinned'])} canaries "
              f"{answer['repinned']}; unpinned until their next arrival: {answer['unpinned']}", file=stdout)
        return 0
    from monitor.canary.pins import PinStore

    store = PinStore(Path(args.state_dir))
    try:
        pins = store.load()
    except ValueError as exc:
        print(f"embedding-monitor canary: canary pins {store.path} are unusable ({exc}); the daemon sets them "
              "aside at its next start", file=stderr)
        return 2
    listing = {model: sorted(ids) for model, ids in sorted(pins.items())}
    if args.json:
        print(json.dumps(listing, indent=2), file=stdout)
    else:
        for model, ids in listing.items():
            print(f"{model}: {len(ids)} pinned: {', '.join(ids)}", file=stdout)
        if not listing:
            print("no canary pins stored", file=stdout)
    return 0
