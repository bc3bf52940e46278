"""lsr-index: offline indexing for learned sparse retrieval (SPLADE vectors → Lucene impact indexes)."""

__version__ = "0.1.0"
