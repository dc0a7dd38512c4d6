"""The repository's root, for tests that read docs, deploy/ or generated artifacts: one place, so
a test module's depth under tests/ does not matter."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "kubernetes"
