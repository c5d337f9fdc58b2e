"""Re-export of the /metrics content type, which exporter.exposition.text now owns."""

from exporter.exposition.text import CONTENT_TYPE

__all__ = ["CONTENT_TYPE"]
