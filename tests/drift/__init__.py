"""Drift tests, references and the drift component (monitor/drift, monitor/drift/baseline_cli.py)."""
