"""Alert rules, promtool tests, Grafana alerts and dashboards, Kubernetes objects: one source.

``python -m monitor.artifacts --out .`` (or ``embedding-monitor artifacts``) regenerates every
committed artifact; ``--check`` diffs instead of writing; ``--thresholds FILE`` overrides alert
thresholds (see ``alerts/thresholds.defaults.yaml``). The sub-command is registered from
:mod:`monitor.artifacts.command` (standard library only; the generator loads when it runs). The
package itself imports nothing, so its modules can import each other through it without a circle.
"""
