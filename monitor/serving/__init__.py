"""The serving probe: call the embedding endpoint itself, pin canary texts, check conformance (docs/canaries.md)."""
