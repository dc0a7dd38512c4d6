"""Deployment artifacts and the generated rules against a real Prometheus (deploy/, Dockerfile)."""
