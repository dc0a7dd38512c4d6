"""Engine connectors: pgvector, LanceDB and Chroma (verified on real engines), a Qdrant-shaped HTTP template."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monitor.index.connectors.base import Connector
    from monitor.index.settings import IndexProbeSpec


def build_connector(spec: IndexProbeSpec) -> Connector:
    """The connector of ``spec.engine`` (its client library imported only when a probe uses it)."""
    if spec.engine == "pgvector":
        from monitor.index.connectors.pgvector import PgvectorConnector

        assert spec.pgvector is not None
        return PgvectorConnector(spec.pgvector)
    if spec.engine == "lancedb":
        from monitor.index.connectors.lancedb import LanceDbConnector

        assert spec.lancedb is not None
        return LanceDbConnector(spec.lancedb)
    if spec.engine == "chroma":
        from monitor.index.connectors.chroma import ChromaConnector

        assert spec.chroma is not None
        return ChromaConnector(spec.chroma)
    from monitor.index.connectors.qdrant import QdrantConnector

    assert spec.qdrant is not None
    return QdrantConnector(spec.qdrant)
