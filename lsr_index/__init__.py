"""lsr-index: offline indexing for learned sparse retrieval (SPLADE vectors → Lucene impact indexes).

The stages as functions (lsr_index.api), imported on first use so that `import lsr_index` stays light:
encode, encode_texts, build, search, evaluate, read_queries, read_qrels.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"
__all__ = ["build", "encode", "encode_texts", "evaluate", "read_qrels", "read_queries", "search"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("lsr_index.api"), name)
    raise AttributeError(f"module 'lsr_index' has no attribute {name!r}")
