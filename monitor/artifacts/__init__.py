"""Alert rules, promtool tests, Grafana alerts and dashboards, Kubernetes objects: one source.

``python -m monitor.artifacts --out .`` (or ``embedding-monitor artifacts``) regenerates every
committed artifact; ``--check`` diffs instead of writing; ``--thresholds FILE`` overrides alert
thresholds (see ``alerts/thresholds.defaults.yaml``). Importing this package is light: the
generator loads when the command runs (:mod:`monitor.artifacts.command`).
"""

from monitor.artifacts.command import add_artifacts_parser

__all__ = ["add_artifacts_parser"]
