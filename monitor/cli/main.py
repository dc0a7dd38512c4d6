"""``embedding-monitor`` command line: run, demo, inspect, evaluate, ...

Exit status: 0 success, 1 runtime failure, 2 bad configuration or usage (the message names the
field or argument at fault).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monitor import __version__
from monitor.errors import ConfigError

if TYPE_CHECKING:
    from monitor.config import Settings

logger = logging.getLogger("monitor")

# The daemon each ``scale_out.role`` runs, by name (as uvicorn names its protocols): the core never
# names a role, and the classes load only when one runs.
ROLES = {
    "single": "monitor.daemon.service:Monitor",
    "replica": "monitor.scaleout.replica:Replica",
    "reducer": "monitor.scaleout.reducer:Reducer",
}


def role_class(role: str) -> Any:
    """The daemon class of ``role`` (a key of :data:`ROLES`), imported now."""
    import importlib

    module, _, name = ROLES[role].partition(":")
    return getattr(importlib.import_module(module), name)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """The common daemon flags; each maps onto one settings field (see docs/usage.md "Configuration")."""
    g = parser.add_argument_group("configuration (flags override EMBMON_* environment, which overrides --config)")
    g.add_argument("--config", metavar="FILE", help="YAML settings file")
    g.add_argument("--source", choices=["kafka", "file", "synthetic"], help="record source (default kafka)")
    g.add_argument("--file", metavar="PATH", dest="file_path", help="file to replay (.jsonl or .npy) for --source file")
    g.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    g.add_argument("--embeddings-topic", metavar="TOPIC")
    g.add_argument("--interactions-topic", metavar="TOPIC")
    g.add_argument("--group-id", metavar="ID", help="Kafka consumer group")
    g.add_argument("--metrics-port", type=int, metavar="PORT", help="HTTP port for /metrics, /healthz, /readyz")
    g.add_argument("--state-dir", metavar="DIR", help="where references and checkpoints live")
    g.add_argument("--refresh-seconds", type=float, metavar="S", help="window-metric refresh interval")
    g.add_argument("--reservoir-size", type=int, metavar="N", help="uniform sample size per (model, stream)")
    g.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any kafka-python consumer setting, repeatable (e.g. security_protocol=SASL_SSL)",
    )
    g.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    g.add_argument(
        "--role",
        choices=["single", "replica", "reducer"],
        help="single process (default), one of N replicas publishing partial state, or the reducer merging it "
        "(docs/deployment.md, \"Scaling out\")",
    )
    g.add_argument("--replica-id", metavar="ID", help="a replica's stable, unique id (default: the host name)")
    g.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="[MODEL[/STREAM]=]FILE",
        help="pin a drift reference (.npz from `baseline capture`, or an .npy (n, d) matrix): FILE for every "
        "(model, stream) of its dimension, MODEL[/STREAM]=FILE for one model or stream; repeatable",
    )
    g.add_argument(
        "--reference-records",
        type=int,
        metavar="N",
        help="when no reference is pinned or stored, the first N records of each (model, stream) form it "
        "(default 5000)",
    )


def settings_from_args(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> Settings:
    """Settings from ``defaults`` < --config < the environment < the flags; raises ConfigError."""
    from monitor.config import load_settings, nested_override, parse_kafka_option
    from monitor.drift.settings import reference_overrides

    options = dict(parse_kafka_option(text) for text in args.kafka_option)
    try:
        reference = reference_overrides(getattr(args, "reference", None), getattr(args, "reference_records", None))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    overrides = nested_override(
        [
            ("source", args.source),
            ("file.path", args.file_path),
            ("kafka.bootstrap_servers", args.bootstrap_servers),
            ("kafka.embeddings_topic", args.embeddings_topic),
            ("kafka.interactions_topic", args.interactions_topic),
            ("kafka.group_id", args.group_id),
            ("kafka.options", options or None),
            ("http.port", args.metrics_port),
            ("state_dir", args.state_dir),
            ("refresh_seconds", args.refresh_seconds),
            ("window.reservoir_size", args.reservoir_size),
            ("log_level", args.log_level),
            ("scale_out.role", getattr(args, "role", None)),
            ("scale_out.replica_id", getattr(args, "replica_id", None)),
            ("drift.reference", reference or None),
        ]
    )
    return load_settings(args.config, overrides, defaults=defaults)


def cmd_run(args: argparse.Namespace) -> int:
    from monitor.extras import require_extras
    from monitor.logs import configure_logging

    settings = settings_from_args(args)
    if settings.scale_out.role != "reducer":  # the reducer only merges: it runs no device work
        require_extras(settings)  # torch / sentence-transformers, where the settings need them
    configure_logging(settings.log_level)
    logger.info("settings: %s", settings.redacted())
    daemon = role_class(settings.scale_out.role)
    from monitor.daemon.lifecycle import StopRequest, stop_signals

    stop = StopRequest()
    # a signal while the daemon is being built (imports, a checkpoint restored) stops it cleanly too:
    # without handlers yet, SIGTERM's default would kill the process with no shutdown at all;
    # a second one ends it at once
    with stop_signals(stop):
        if daemon.serves_port_while_building:
            return daemon(settings, early_port=True, stop_request=stop).serve()
        return daemon(settings, stop_request=stop).serve()


def cmd_demo(args: argparse.Namespace) -> int:
    import tempfile

    from monitor.cli.demo import DEMO_SETTINGS, run_demo
    from monitor.daemon.lifecycle import StopRequest, stop_signals
    from monitor.extras import require_extras

    # A fresh state directory per run (removed at exit), so no earlier run's references leak in;
    # --state-dir, EMBMON_STATE_DIR or the config file choose a lasting one instead. The signal
    # handlers come first: a Ctrl-C while the demo is being built still removes the directory.
    stop = StopRequest()
    with stop_signals(stop):
        fresh = tempfile.mkdtemp(prefix="embmon-demo-")
        try:
            settings = settings_from_args(args, defaults={**DEMO_SETTINGS, "state_dir": fresh})
            require_extras(settings)
            log_file = None if args.log_file is None else Path(args.log_file)
            return run_demo(settings, duration=args.duration, view=not args.no_summary, verbose=args.verbose,
                            log_file=log_file, stop_request=stop)
        finally:
            _remove_state_dir(Path(fresh))


# A job abandoned at the shutdown (a serving probe pinning its canaries) may still write into the
# demo's state directory while it is removed; within the shutdown watchdog's grace (2 s) after the stop
DEMO_STATE_REMOVAL_SECONDS = 1.5


def _remove_state_dir(path: Path) -> None:
    """Remove the demo's temporary state directory, retrying while a late writer adds to it; never raises."""
    import shutil
    import time

    deadline = time.monotonic() + DEMO_STATE_REMOVAL_SECONDS
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        if time.monotonic() >= deadline:
            logger.warning("could not remove the demo's state directory %s: something still writes into it", path)
            return
        time.sleep(0.05)


def cmd_inspect(args: argparse.Namespace) -> int:
    from monitor.cli.inspect import run_inspect

    return run_inspect(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedding-monitor",
        description="Watch the quality of production embeddings and export it to Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon")
    add_settings_flags(run)
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="the daemon on a synthetic stream with scripted incidents")
    add_settings_flags(demo)
    demo.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    demo.add_argument("--no-summary", action="store_true", help="do not show the live view")
    demo.add_argument("--verbose", action="store_true", help="log to stderr instead of a file")
    demo.add_argument("--log-file", metavar="FILE", help="where the log goes (default: a new temporary file)")
    demo.set_defaults(func=cmd_demo)

    inspect = sub.add_parser("inspect", help="intrinsic metrics of an .npy (n, d) matrix or a JSONL file of events")
    inspect.add_argument("path", metavar="FILE")
    inspect.add_argument("--json", action="store_true", help="print JSON (one object per model/stream)")
    inspect.add_argument("--model", help="only this model")
    inspect.add_argument("--config", metavar="FILE", help="settings file (quality thresholds, limits)")
    inspect.set_defaults(func=cmd_inspect)

    for register in _optional_subcommands():
        register(sub)
    return parser


def _optional_subcommands() -> list[Any]:
    """Subcommands contributed by feature packages."""
    registrars = []
    from monitor.retrieval.evaluate import add_evaluate_parser

    registrars.append(add_evaluate_parser)
    from monitor.artifacts.command import add_artifacts_parser

    registrars.append(add_artifacts_parser)
    from monitor.drift.baseline_cli import add_baseline_parser

    registrars.append(add_baseline_parser)
    from monitor.canary.cli import add_canary_parser

    registrars.append(add_canary_parser)
    from monitor.drift.cli import add_drift_parser

    registrars.append(add_drift_parser)
    return registrars


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"embedding-monitor: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"embedding-monitor: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, the state directory is not writable, ...
        print(f"embedding-monitor: cannot start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
