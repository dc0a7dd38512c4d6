"""The error a bad configuration raises, in a module light enough for the CLI to catch it unloaded."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""
