"""Drift against a reference: two-sample tests, references, online change detectors, attribution."""
