"""Canaries: fixed items whose embeddings must not change unless the model did (docs/canaries.md)."""
