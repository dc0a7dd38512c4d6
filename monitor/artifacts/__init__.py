"""Alert rules, promtool tests, Grafana alerts and dashboards, Kubernetes objects: one source.

``python -m monitor.artifacts --out .`` (or ``embedding-monitor artifacts``) regenerates every
committed artifact; ``--check`` diffs instead of writing; ``--thresholds FILE`` overrides alert
thresholds (see ``alerts/thresholds.defaults.yaml``).
"""

from monitor.artifacts.generate import add_artifacts_parser, render
from monitor.artifacts.rules import build_rules
from monitor.artifacts.thresholds import Thresholds, load_thresholds

__all__ = ["Thresholds", "add_artifacts_parser", "build_rules", "load_thresholds", "render"]
