"""The slowest tests of the last runs, from ``.cache/test-durations.json`` (tests/conftest.py writes it).

    python -m tests.support.durations            # the 25 slowest tests of the fast tier
    python -m tests.support.durations --slow 10  # the 10 slowest marked slow
    python -m tests.support.durations --over 5   # the fast-tier tests over 5 s (load-scaled, as --fast checks)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

FILE = Path(os.environ.get("EMBMON_TEST_DURATIONS")
            or Path(__file__).resolve().parents[2] / ".cache" / "test-durations.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("top", nargs="?", type=int, default=25)
    parser.add_argument("--slow", action="store_true", help="the tests marked slow instead")
    parser.add_argument("--over", type=float, help="only the tests over this many seconds, scaled by load per core")
    args = parser.parse_args(argv)
    times = json.loads(FILE.read_text())
    cores = os.cpu_count() or 1
    rows = [(k, t) for k, t in times.items() if bool(t.get("slow")) is args.slow]
    if args.over is not None:
        rows = [(k, t) for k, t in rows if t["wall_s"] > args.over * max(1.0, t.get("load1", 0.0) / cores)]
    rows.sort(key=lambda kv: -kv[1]["wall_s"])
    total = sum(t["wall_s"] for _, t in rows)
    print(f"{len(rows)} tests, {total:.0f} s of wall time together ({FILE})")
    for nodeid, t in rows[: args.top]:
        print(f"{t['wall_s']:7.1f} s wall {t.get('cpu_s', 0):6.1f} s CPU  load {t.get('load1', 0):4.1f}  {nodeid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
