"""Streaming state: sufficient statistics, reservoirs, sliding windows (monitor/state)."""
