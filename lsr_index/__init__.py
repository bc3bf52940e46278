"""lsr-index: offline indexing for learned sparse retrieval (SPLADE vectors → Lucene impact indexes).

The stages as Python functions are in `lsr_index.api` (encode, encode_texts, build, search, evaluate,
read_queries, read_qrels); `import lsr_index` itself stays light.
"""

__version__ = "0.1.0"
