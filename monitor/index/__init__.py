"""Index probes: recall of the vector store that serves the queries, and its census (docs/index.md)."""
