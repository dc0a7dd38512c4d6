"""Canary records and pins (monitor/canary)."""
