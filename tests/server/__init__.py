"""The HTTP port: security and resource limits."""
