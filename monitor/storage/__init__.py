"""Bytes on disk: crash-safe writes in the state directory, checkpoint files and untrusted archives."""
