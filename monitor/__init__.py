"""embedding-monitor: watch the quality of production embeddings."""

__version__ = "0.1.0"
