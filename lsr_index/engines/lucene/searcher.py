"""Impact search over a Lucene index with Anserini's SimpleImpactSearcher: score = Σ query impact × document impact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import orjson

from lsr_index.engines.index import IndexGeneration
from lsr_index.engines.lucene.checks import FULL_CHECK_BYTES, verify_checksums
from lsr_index.engines.lucene.jvm import java_failure, jvm
from lsr_index.errors import LsrIndexError


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
            verify_checksums(reader, self._generation.size() <= FULL_CHECK_BYTES)
        except JavaException as exc:
            self.close()
            raise self._failure(exc, "the Lucene index is damaged") from None
        self._index_searcher = autoclass("org.apache.lucene.search.IndexSearcher")
        self._hashmap, self._int, self._list = (autoclass("java.util.HashMap"), autoclass("java.lang.Integer"),
                                                autoclass("java.util.ArrayList"))
        self._json = _hits_as_json(autoclass)

    def _failure(self, exc: Exception, what: str) -> LsrIndexError:
        return java_failure(exc, self.index, what, self._lucene_dir)

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
                # the batch's hits cross from the JVM in one piece (a hit at a time, through JNI, took longer than
                # the search itself at 1,000 hits)
                for qid, found in orjson.loads(self._json.writeValueAsBytes(results).tostring()).items():
                    ranked[qid] = _ranked(found)
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


def _hits_as_json(autoclass):
    """Jackson (in Anserini's jar) writing a batch's {qid: ScoredDoc[]} as JSON: each hit's docid and score (and its
    Lucene number), never its stored Document."""
    mapper = autoclass("com.fasterxml.jackson.databind.ObjectMapper")()
    document = autoclass("java.lang.Class").forName("org.apache.lucene.document.Document")
    # a Boolean object made in Java: jnius passes Python's True as an Integer
    mapper.configOverride(document).setIsIgnoredType(autoclass("java.lang.Boolean")("true"))
    return mapper


def _ranked(found: list[dict]) -> list[tuple[str, float]]:
    """A query's hits in Lucene's order, each score the float32 that Lucene computed (JSON holds its shortest
    decimal, which rounds back to the same float32), as the Python float that float(hit.score) gives."""
    scores = np.array([hit["score"] for hit in found], dtype=np.float64).astype(np.float32).tolist()
    return [(hit["docid"], score) for hit, score in zip(found, scores)]


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
