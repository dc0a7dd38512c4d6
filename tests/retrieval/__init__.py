"""Retrieval metrics, statistics, TREC files and the evaluate command (monitor/retrieval)."""
