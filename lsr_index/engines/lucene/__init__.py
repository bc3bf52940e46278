"""Lucene impact indexes through Pyserini's bundled Anserini: built by writer processes that index impacts as term
frequencies (or by Anserini's own fake-word indexer), searched with Anserini's impact searcher."""
