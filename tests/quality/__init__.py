"""Intrinsic quality metrics (monitor/quality)."""
