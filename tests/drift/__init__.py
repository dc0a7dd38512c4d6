"""Drift tests, references and the drift component (monitor/drift, monitor/baseline.py)."""
