"""Decoding binary and JSON input, fuzzed, and the JSON worker processes."""
