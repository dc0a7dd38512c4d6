"""The running daemon: wiring, threads, offsets, checkpoints, scheduled jobs and shutdown.

Data flow (docs/architecture.md): sources -> decoding -> state -> metric families -> snapshot -> HTTP.
This package is the middle of it: :mod:`monitor.daemon.service` wires the steps together."""
