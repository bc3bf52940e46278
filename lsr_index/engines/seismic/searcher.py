"""Search a Seismic index: approximate top-k by dot product, each hit scored exactly.

Seismic scores a document in float32 from its half-float impacts: exact integers for every score below 2²⁴ when
every query impact is at most 2²⁴ (document impacts are integers up to 2048, so every partial sum is an integer
that float32 holds). A hit whose score is outside that range is rescored from the index's own vectors in Python
integers. Results are ordered as the Lucene searcher orders them: score descending, then docid ascending.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from lsr_index.engines.index import IndexGeneration
from lsr_index.engines.seismic.layout import (
    INDEX_FILE,
    check_files,
    check_version,
    read_ids,
    read_record,
    read_terms,
)
from lsr_index.engines.seismic.options import SeismicSearch
from lsr_index.errors import LsrIndexError

_FLOAT_EXACT = 1 << 24  # float32 holds every integer up to here
_BATCH = 256  # queries per call of Seismic's parallel batch search (Ctrl-C and progress between calls)


class Searcher:
    """A Seismic index opened for searching: checked against its record in full before Seismic loads it."""

    def __init__(self, index: Path | IndexGeneration, options: SeismicSearch | None = None):
        """`index`: a directory, or one generation of a published index (its files read through the directory
        opened, whatever is published meanwhile)."""
        options = SeismicSearch() if options is None else options
        if not isinstance(options, SeismicSearch):
            raise LsrIndexError(f"seismic search options must be SeismicSearch, got {type(options).__name__}")
        directory, files = (index.index, index.files) if isinstance(index, IndexGeneration) else (index, index)
        self.directory, self.options = directory, options
        if not files.is_dir():
            raise LsrIndexError(f"{directory}: no index here; build one with `lsr-index build --engine seismic`")
        with _named(files, directory):
            record = read_record(files)
            check_version(files, record)
            check_files(files, record)
            self._blob, self._offsets, self._empty = read_ids(files, record)
            names = read_terms(files, record)
        self.documents, self.record = record["documents"], record
        self._terms = {term: number for number, term in enumerate(names)}
        self._index = None
        if record["held"]:
            import seismic

            self._strings = np.array([str(n) for n in range(len(names))], dtype=seismic.get_seismic_string())
            index_class = seismic.SeismicIndexLV if record["components"] == "u32" else seismic.SeismicIndex
            try:
                with _quiet():
                    self._index = index_class.load(str(files / INDEX_FILE))
            except BaseException as exc:  # an IOError, or a panic (a BaseException): one line, never a traceback
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                raise LsrIndexError(f"{directory}: Seismic cannot load the index: {type(exc).__name__}: "
                                    f"{' '.join(str(exc).split()).replace(str(files), str(directory))}"[:400]
                                    ) from None
            found = (self._index.len, self._index.dim, self._index.nnz)
            if found != (record["held"], record["terms"], record["nonzeros"]):
                self._index = None
                raise LsrIndexError(f"{directory}: the Seismic index holds {found[0]} documents, {found[1]} terms and "
                                    f"{found[2]} postings, its record {record['held']}, {record['terms']} and "
                                    f"{record['nonzeros']}: it is damaged; rebuild it with `lsr-index build --engine "
                                    "seismic --overwrite`")

    def search(self, queries: Sequence[tuple[str, dict[str, int]]], hits: int = 1000, threads: int = 1,
               progress: Callable[[int], None] | None = None) -> dict[str, list[tuple[str, float]]]:
        """Ranked (docid, score) per query id: score descending, ties by docid ascending; at most `hits` (and never
        more than there are documents), only documents sharing a term with the query. Terms absent from the index
        are ignored. One thread searches query after query in this thread; more use Seismic's parallel batch
        search (its own thread pool: every core, or RAYON_NUM_THREADS). `progress` gets the queries done."""
        if self._index is None and self.record["held"]:
            raise LsrIndexError(f"{self.directory}: the Seismic searcher is closed")
        k = max(1, min(int(hits), self.documents))
        prepared = [(qid, *self._query(vector)) for qid, vector in queries]
        ranked: dict[str, list[tuple[str, float]]] = {}
        if self._index is None:
            ranked = {qid: [] for qid, *_ in prepared}
            if progress:
                progress(len(prepared))
        elif threads <= 1:
            self._one_by_one(prepared, k, ranked, progress)
        else:
            self._batched(prepared, k, threads, ranked, progress)
        return {qid: ranked.get(qid, []) for qid, _ in queries}

    def _query(self, vector: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """The query's known terms with a positive weight, as component numbers (ascending) and integer weights."""
        numbers, weights = [], []
        for term, weight in vector.items():
            number = self._terms.get(term)
            if number is not None and weight > 0:
                numbers.append(number)
                weights.append(int(weight))
        order = np.argsort(numbers, kind="stable")
        return np.array(numbers, np.int64)[order], np.array(weights, np.int64)[order]

    def _one_by_one(self, prepared, k: int, ranked: dict, progress) -> None:
        o, index, done = self.options, self._index, 0
        for qid, numbers, weights in prepared:
            if len(numbers):
                found = index.search("q", self._strings[numbers], weights.astype(np.float32), k=k,
                                     query_cut=o.query_cut, heap_factor=o.heap_factor, sorted=o.first_sorted)
                ranked[qid] = self._ranked(found, numbers, weights)
            else:
                ranked[qid] = []
            done += 1
            if progress and done % 64 == 0:
                progress(64)
        if progress and done % 64:
            progress(done % 64)

    def _batched(self, prepared, k: int, threads: int, ranked: dict, progress) -> None:
        o, index = self.options, self._index
        for start in range(0, len(prepared), _BATCH):
            chunk = prepared[start:start + _BATCH]
            asked = [n for n, (_, numbers, _) in enumerate(chunk) if len(numbers)]
            if asked:  # results come back in any order, each tagged with its query's position in the chunk
                with _quiet():  # its progress bar
                    results = index.batch_search(
                        np.array([str(n) for n in asked], dtype=self._strings.dtype),
                        [self._strings[chunk[n][1]] for n in asked],
                        [chunk[n][2].astype(np.float32) for n in asked], k=k, query_cut=o.query_cut,
                        heap_factor=o.heap_factor, sorted=o.first_sorted, num_threads=threads)
                for found in results:
                    if found:
                        qid, numbers, weights = chunk[int(found[0][0])]
                        ranked[qid] = self._ranked(found, numbers, weights)
            for qid, *_ in chunk:
                ranked.setdefault(qid, [])
            if progress:
                progress(len(chunk))

    def _ranked(self, found: list[tuple[str, float, str]], numbers: np.ndarray, weights: np.ndarray
                ) -> list[tuple[str, float]]:
        exact = int(weights.max()) <= _FLOAT_EXACT
        scored = []
        for _, score, position in found:
            at = int(position)
            value = int(score) if exact and score < _FLOAT_EXACT else self._rescore(at, numbers, weights)
            scored.append((self._docid(at), float(value)))
        scored.sort(key=lambda hit: (-hit[1], hit[0]))
        return scored

    def _rescore(self, position: int, numbers: np.ndarray, weights: np.ndarray) -> int:
        """The exact dot product of document `position` (Seismic's own copy of it) with the query."""
        internal = position - int(np.searchsorted(self._empty, position))
        components, values = self._index.get(internal)
        query = dict(zip(numbers.tolist(), weights.tolist()))
        return sum(query.get(c, 0) * int(v) for c, v in zip(components, values))

    def _docid(self, position: int) -> str:
        return self._blob[self._offsets[position]:self._offsets[position + 1]].decode("utf-8", "surrogatepass")

    def close(self) -> None:
        """Release the index's memory."""
        self._index = None


@contextlib.contextmanager
def _named(files: Path, directory: Path) -> Iterator[None]:
    """A refusal names the index as the user gave it, not the path its files were read through."""
    try:
        yield
    except LsrIndexError as exc:
        if files == directory:
            raise
        raise LsrIndexError(str(exc).replace(str(files), str(directory))) from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Seismic's own progress bars and notes (stdout, stderr) kept off the terminal during one call."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
