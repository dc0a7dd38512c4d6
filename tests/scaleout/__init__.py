"""Replicas, partials and the reducer (monitor/scaleout)."""
