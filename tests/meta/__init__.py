"""The repository itself (docs that name every module) and the helpers in tests/support."""
