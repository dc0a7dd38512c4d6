"""Bytes from a source to validated records (binary and JSON), or a counted reason why not."""
