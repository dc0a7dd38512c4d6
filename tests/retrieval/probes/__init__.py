"""Retrieval probes: golden sets, k-NN, ANN recall, clicks, agreement (monitor/retrieval/probes)."""
