"""Vector shards on disk: Anserini JsonVectorCollection (.jsonl / .jsonl.gz) or Parquet (id, terms, weights).

This module alone knows the shard format and its file names: shard k is `shards/part-NNNNN.<fmt>`; while it
is being encoded, its checkpoints are hidden chunk files `shards/.part-NNNNN.<start>.<fmt>.chunk`, concatenated
into the shard when it ends (the same bytes as one uninterrupted write). On a cluster, each dispatch of shard k
writes into its own directory `shards/.attempt-NNNNN-<token>/` first. Every file is written under a hidden
temporary name, created new (never through a link, never over another file), and renamed only once complete
and fsynced, so a crash never leaves a file that looks finished; its checksum then goes into the manifest.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from itertools import islice
from pathlib import Path
from typing import NoReturn

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import create_new, fsync_directory, os_cause, sha256_file
from lsr_index.settings import FORMATS
from lsr_index.vectors.manifest import MANIFEST, EncoderSettings, InputRecord, Manifest, ModelRecord, Shard
from lsr_index.vectors.quantize import Quantization, SparseVectors

SHARDS = "shards"
_ATTEMPT = ".attempt-"
_SHARD_NAME = re.compile(r"part-\d{5,}\.(jsonl|jsonl\.gz|parquet)")


def shard_file(index: int, fmt: str) -> str:
    """Shard `index`'s path relative to the output directory (what the manifest records)."""
    return f"{SHARDS}/part-{index:05d}.{fmt}"


def chunk_file(index: int, start: int, fmt: str) -> str:
    """The checkpoint of shard `index` that begins at document `start`: hidden until concatenated."""
    return f"{SHARDS}/.part-{index:05d}.{start:012d}.{fmt}.chunk"


def attempt_dir(index: int, token: str) -> str:
    """One cluster dispatch of shard `index`: a private output directory (relative to the output directory) that
    holds the shard under its own relative name (attempt_dir/shard_file) until the driver moves it into place."""
    return f"{SHARDS}/{_ATTEMPT}{index:05d}-{token}"


def is_attempt(name: str) -> bool:
    """A directory in the shards directory that only a cluster dispatch makes (or its doomed rename)."""
    return name.startswith(_ATTEMPT)


def is_ours(name: str) -> bool:
    """A name in the shards directory that only a shard writer makes: a shard, a chunk, or a temporary."""
    return bool(_SHARD_NAME.fullmatch(name)) or (name.startswith(".part-") and name.endswith((".tmp", ".chunk")))


def is_temporary(name: str) -> bool:
    """Left by a writer that never finished (a kill): never listed, safe to delete on the next run."""
    return name.startswith(".part-") and name.endswith(".tmp")
PARQUET_SCHEMA = pa.schema([("id", pa.string()), ("terms", pa.list_(pa.string())),
                            ("weights", pa.list_(pa.int32()))])


# Lucene cannot index a term longer than this many UTF-8 bytes (IndexWriter.MAX_TERM_LENGTH), nor index an empty one
# through an analyzer; every other string is a term, whitespace and control characters included.
MAX_TERM_BYTES = 32766


def term_problem(term: str) -> str | None:
    """Why Lucene cannot hold `term` as one term (quoting it), or None when it can."""
    if not term:
        return "the empty term"
    if len(term) * 3 > MAX_TERM_BYTES and (size := len(term.encode("utf-8", "surrogatepass"))) > MAX_TERM_BYTES:
        return f"the term {shown(term)} of {size:,} UTF-8 bytes, over Lucene's limit of {MAX_TERM_BYTES:,}"
    return None


def shown(term: str) -> str:
    """A term as a message quotes it: repr (whitespace and controls visible), cut after 40 characters."""
    return repr(term) if len(term) <= 40 else repr(term[:40]) + f"… ({len(term):,} characters)"


def check_vocab(vocab: Sequence[str]) -> None:
    """Refuse a vocabulary with a term Lucene cannot index (empty, or too long), naming it: every vector holding it
    would be refused at build. Whitespace is no problem: the builder indexes a term exactly as written."""
    if "" not in vocab and max(map(len, vocab), default=0) * 3 <= MAX_TERM_BYTES:  # one pass in C
        return
    for term in vocab:
        if problem := term_problem(term):
            raise LsrIndexError(f"the model's vocabulary holds {problem}, which Lucene cannot index as a term "
                                "(the model's tokenizer is damaged or not a SPLADE tokenizer)")


def json_vector_line(doc_id: str, vector: dict[str, int]) -> bytes:
    """One Anserini JsonVectorCollection record (the format of jsonl shards and of what `build` indexes)."""
    return orjson.dumps({"id": doc_id, "contents": "", "vector": vector}) + b"\n"


# documents per serialized block (one gzip member in .jsonl.gz): a piece's blocks go to the serializer processes side by
# side, so the last piece of a run is serialized in a fraction of the time one process takes (a whole piece in one
# process would be the tail of every GPU run: docs/performance/encode.md, "Changes kept"); fixed, so the bytes of a
# shard do not depend on the machine or on how many processes serialized it
SERIALIZE_DOCS = 1024


def blocks(ids: Sequence[str], vectors: SparseVectors) -> Iterator[tuple[Sequence[str], SparseVectors]]:
    """The documents in blocks of SERIALIZE_DOCS, each serialized on its own (no documents: one empty block, so an
    empty .jsonl.gz is still a gzip member)."""
    for lo in range(0, max(len(ids), 1), SERIALIZE_DOCS):
        hi = min(lo + SERIALIZE_DOCS, len(ids))
        yield ids[lo:hi], vectors.rows(lo, hi)


def serialize(ids: Sequence[str], vectors: SparseVectors, vocab: np.ndarray, fmt: str) -> bytes:
    """JsonVectorCollection lines for a chunk of documents; gzipped as one member for .jsonl.gz.

    Pure and picklable, so that on a GPU run a pool of processes can do it: this per-document Python work
    (dict building, JSON, deflate) would otherwise hold the encoder's GIL.
    """
    words = vocab[vectors.terms].tolist()
    weights = vectors.weights.tolist()
    bounds = vectors.indptr.tolist()
    data = b"".join(json_vector_line(doc_id, dict(zip(words[lo:hi], weights[lo:hi])))
                    for doc_id, lo, hi in zip(ids, bounds[:-1], bounds[1:]))
    return gzip.compress(data, compresslevel=1, mtime=0) if fmt == "jsonl.gz" else data


class ShardWriter:
    """One shard open for appending; `finish` publishes it, `abort` removes the partial file.

    Any OSError (disk full, quota, file too large, I/O error) becomes an LsrIndexError naming the shard and
    the cause, and the partial file is removed at once: nothing half-written is ever left under a final name.
    """

    def __init__(self, path: Path, fmt: str, vocab: np.ndarray):
        if fmt not in FORMATS:
            raise LsrIndexError(f"unknown output format {fmt!r}: choose one of {', '.join(FORMATS)}")
        self.path, self.fmt, self.vocab = path, fmt, vocab
        self.tmp = _temporary(path)
        self.docs = self.nonzeros = 0
        self._raw = self._sink = None
        self._open = True
        try:  # JSON lines; .gz as a run of independent gzip members (one per chunk) — a valid gzip file
            self._raw = open(create_new(self.tmp), "wb")  # noqa: SIM115 (lives until finish/abort, not a block)
            if fmt == "parquet":
                self._arrow_vocab = pa.array(vocab.tolist(), pa.string())
                self._sink = pq.ParquetWriter(self._raw, PARQUET_SCHEMA, compression="zstd")
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> NoReturn:
        if isinstance(exc, FileExistsError):  # another writer's file, or a planted link: never written through
            self._open = False
            raise LsrIndexError(f"{self.tmp}: exists already (another writer, or not lsr-index's); "
                                "nothing was overwritten") from exc
        self.abort()
        raise LsrIndexError(f"{self.path}: cannot write the shard: {os_cause(exc)}; the partial shard was removed "
                            "and is not in the manifest (free some space if the disk is full, then rerun the same "
                            "command to continue after the last complete shard)") from exc

    def add(self, ids: Sequence[str], vectors: SparseVectors) -> None:
        if self.fmt == "parquet":
            self._write(len(ids), vectors.nnz, lambda: self._sink.write_batch(self._record_batch(ids, vectors)))
        else:
            for block_ids, block in blocks(ids, vectors):
                self.add_serialized(serialize(block_ids, block, self.vocab, self.fmt), len(block_ids), block.nnz)

    def add_serialized(self, data: bytes, docs: int, nonzeros: int) -> None:
        """Append bytes made by `serialize` (possibly in another process) for `docs` documents."""
        self._write(docs, nonzeros, lambda: self._raw.write(data))

    def _write(self, docs: int, nonzeros: int, action) -> None:
        if not self._open:
            raise LsrIndexError(f"{self.path}: the shard writer is closed")
        try:
            action()
        except OSError as exc:
            self._fail(exc)
        self.docs += docs
        self.nonzeros += nonzeros

    def _record_batch(self, ids: Sequence[str], vectors: SparseVectors) -> pa.RecordBatch:
        offsets = pa.array(vectors.indptr.astype(np.int32))
        terms = pa.ListArray.from_arrays(offsets, self._arrow_vocab.take(pa.array(vectors.terms)))
        weights = pa.ListArray.from_arrays(offsets, pa.array(vectors.weights, pa.int32()))
        return pa.record_batch([pa.array(ids, pa.string()), terms, weights], schema=PARQUET_SCHEMA)

    def _close(self) -> None:
        self._open = False
        try:
            if self._sink is not None:
                self._sink.close()
        finally:
            if self._raw is not None:
                self._raw.close()

    def finish(self, path: Path | None = None) -> str:
        """Publish the file under its own name, or as `path` (a checkpoint of the shard); its sha256."""
        if not self._open:
            raise LsrIndexError(f"{self.path}: the shard writer is closed")
        try:
            self._close()  # flushes: a full disk can show up only here
            return _publish(self.tmp, path or self.path)
        except OSError as exc:
            self._fail(exc)

    def abort(self) -> None:
        """Drop the partial shard; safe to call twice, and never raises over the error that led here."""
        try:
            with contextlib.suppress(Exception):  # a stream that failed may fail again on close
                self._close()
        finally:
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name.lstrip('.')}.tmp")


def _publish(tmp: Path, path: Path) -> str:
    """fsync `tmp`, rename it to `path`, fsync the directory: the file is whole under its name or absent."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    sha = sha256_file(tmp)
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return sha


def concatenate(chunks: Sequence[Path], path: Path, fmt: str) -> str:
    """Publish the shard made of `chunks` in order (the files are left for their owner to delete); its sha256.

    JSON lines and gzip members concatenate as bytes; Parquet row groups are copied one by one, as written.
    """
    tmp = _temporary(path)
    try:
        with open(create_new(tmp), "wb") as out:
            if fmt == "parquet":
                with pq.ParquetWriter(out, PARQUET_SCHEMA, compression="zstd") as writer:
                    for chunk in chunks:
                        source = pq.ParquetFile(chunk)
                        for group in range(source.num_row_groups):
                            writer.write_table(source.read_row_group(group))
            else:
                for chunk in chunks:
                    with open(chunk, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
        return _publish(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, FileExistsError):
            raise LsrIndexError(f"{tmp}: exists already (another writer, or not lsr-index's); nothing was "
                                "overwritten") from exc
        raise LsrIndexError(f"{path}: cannot write the shard: {os_cause(exc)} (free some space if the disk is "
                            "full, then rerun the same command to continue after the last checkpoint)") from exc


def verify_shards(directory: Path, manifest: Manifest, checked: Callable[[int], object] = lambda n: None) -> None:
    """Refuse to use a vectors directory whose shards are missing, truncated, altered or do not tile; `checked(1)`
    after each shard (reading them all takes a while on a large corpus)."""
    expected = 0
    for shard in sorted(manifest.shards, key=lambda s: s.start):
        if shard.start != expected:
            raise LsrIndexError(f"{directory / MANIFEST}: the shards do not cover documents "
                                f"{expected}..{shard.start - 1}; rerun `lsr-index encode` to finish the encoding")
        expected += shard.docs
    for shard in manifest.shards:
        path = directory / shard.file
        if not path.is_file():
            raise LsrIndexError(f"{path}: shard listed in the manifest is missing (re-encode: rerun "
                                "`lsr-index encode` with --overwrite)")
        try:
            digest = sha256_file(path)
        except OSError as exc:
            raise LsrIndexError(f"{path}: cannot read the shard: {os_cause(exc)}") from None
        if digest != shard.sha256:
            raise LsrIndexError(f"{path}: checksum mismatch against {directory / MANIFEST} "
                                "(the shard is corrupted or truncated; re-encode it)")
        checked(1)


def read_shard(path: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """Read back (id, {term: impact}) from any shard format; for conversion, checks and tests. A record naming one
    term twice is refused (ShardError), as by every reader of shards."""
    if path.name.endswith(".parquet"):
        number = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for doc_id, terms, weights in zip(*(batch.column(i).to_pylist() for i in range(3))):
                number += 1
                vector = dict(zip(terms, weights))
                if len(vector) != len(terms):
                    raise ShardError(_repeated(record_place(str(path), number), doc_id, _twice(terms)))
                yield doc_id, vector
        return
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
        for number, line in enumerate(f, 1):
            yield parse_record(line, f"{path}:{number}")


def write_vectors(out: Path, vocab: Sequence[str], shards: Iterable[Iterable[tuple[Sequence[str], SparseVectors]]],
                  fmt: str = "jsonl", model: dict | None = None, encoder: dict | None = None,
                  scale: float = 100.0) -> Manifest:
    """A complete vectors directory from vectors made elsewhere (tests, benchmarks, an import): the shard files,
    names, checksums and manifest that `encode` writes, one shard per item of `shards` (its (ids, vectors)
    batches in order). `encoder` overrides the recorded settings; the model is recorded as given, unchecked."""
    terms = np.array(vocab, dtype=object)
    settings = {"doc_max_length": 256, "query_max_length": 64, "dtype": "float32", "backend": "auto", **(encoder or {})}
    manifest = Manifest(model=ModelRecord(**(model or {"name": "synthetic", "sha256": "0" * 64})),
                        encoder=EncoderSettings(**settings), quantization=Quantization(scale=scale),
                        input=InputRecord(), output_format=fmt)
    (out / SHARDS).mkdir(parents=True, exist_ok=True)
    start = 0
    for k, batches in enumerate(shards):
        name = shard_file(k, fmt)
        writer = ShardWriter(out / name, fmt, terms)
        ids_seen = blake2b(digest_size=16)
        for ids, vectors in batches:
            writer.add(ids, vectors)
            ids_seen.update("\0".join(ids).encode() + b"\0")
        sha = writer.finish()
        manifest.shards.append(Shard(file=name, start=start, docs=writer.docs, nonzeros=writer.nonzeros, sha256=sha,
                                     input=ids_seen.hexdigest()))
        start += writer.docs
    manifest.shard_docs = max([s.docs for s in manifest.shards], default=1)
    manifest.complete = True
    manifest.save(out)
    return manifest


# --- reading a range of a shard as (id, joined text, form) ----------------------------------------------------
# The joined form of a document is its terms and impacts as one string, `term<DELIMITER>impact` pairs separated by
# SEPARATOR: what the Lucene writer's analyzer splits at the separator (and nowhere else: a term may hold any other
# character, whitespace included) and cuts at the delimiter. A document one of whose terms holds either character
# gets a pair that none of its terms holds; its form (separator + delimiter) travels with its text. For lines as
# `json_vector_line` writes them the text is cut straight out of the line (no JSON parse).

SEPARATOR = " "
DELIMITER = "\x01"  # never in a BERT or sentencepiece vocabulary
FORM = SEPARATOR + DELIMITER  # almost every document's
_SPARE = "\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10|^~"


def _candidates() -> Iterator[str]:
    """Characters a document's form may use instead: the spares, the private-use area, then the rest of the BMP."""
    yield from _SPARE
    yield from map(chr, range(0xE000, 0xF900))
    yield from (chr(c) for c in range(0x21, 0xE000) if not 0xD800 <= c < 0xE000)


def free_form(terms: Iterable[str]) -> str:
    """A separator and a delimiter that no term of `terms` holds: the usual ones where they are free."""
    used = set().union(*map(set, terms))
    free = (c for c in _candidates() if c not in used)
    separator = SEPARATOR if SEPARATOR not in used else next(free)
    delimiter = DELIMITER if DELIMITER not in used else next(free)
    return separator + delimiter


@dataclass(frozen=True)
class ShardRange:
    """Documents [skip, skip + take) of the shard at `path`, which holds `total` documents."""

    path: str
    skip: int
    take: int
    total: int


def split_ranges(vectors: Path, shards: Sequence[Shard], writers: int) -> list[list[ShardRange]]:
    """Cut the manifest's documents (in order) into `writers` contiguous, near-equal ranges of shard parts."""
    total = sum(s.docs for s in shards)
    bounds = [total * k // writers for k in range(writers + 1)]
    plans: list[list[ShardRange]] = [[] for _ in range(writers)]
    for shard in sorted(shards, key=lambda s: s.start):
        for k in range(writers):
            lo, hi = max(bounds[k], shard.start), min(bounds[k + 1], shard.start + shard.docs)
            if lo < hi:
                plans[k].append(ShardRange(str(vectors / shard.file), lo - shard.start, hi - lo, shard.docs))
    return [plan for plan in plans if plan]


Doc = tuple[str, str, str, int]  # id, joined text, form (separator + delimiter), terms with an impact > 0


def record_place(path: str, number: int) -> str:
    """Where record `number` (1-based) of a shard is, as messages name it: file:line, or the Parquet row."""
    return f"{path}: row {number}" if path.endswith(".parquet") else f"{path}:{number}"


def _joined(vector: dict, form: str = FORM) -> tuple[str, int]:
    """`term␁w term␁w …` in `form` and its term count (Anserini indexes a weight ≤ 0 as no token at all)."""
    separator, delimiter = form
    pairs = [f"{t}{delimiter}{w}" for t, w in vector.items() if w > 0]
    return separator.join(pairs), len(pairs)


def _twice(terms: Iterable[str]) -> str:
    seen: set[str] = set()
    return next(t for t in terms if t in seen or seen.add(t))


def _repeated(where: str, doc_id: object, name: str, vector: bool = True) -> str:
    return (f"{where}: record {doc_id!r} names {'the term ' if vector else ''}{shown(name)} twice: which impact is "
            "meant cannot be told (JSON readers keep the last, Lucene would add them up); write each term once")


def parse_record(line: bytes, where: str) -> tuple[str, dict]:
    """(id, vector) of a JsonVector line; `where` (file:line) names it in a ShardError. A name given twice, in the
    vector or in the record, is refused: JSON parsers keep the last without a word, Anserini's too."""
    try:
        record = orjson.loads(line)
        doc_id, vector = record["id"], record["vector"]
        if not isinstance(vector, dict):
            raise TypeError(f"its vector is a JSON {type(vector).__name__}, not an object")
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ShardError(f"{where}: not a JsonVector record ({type(exc).__name__}: {exc})") from None
    # each name, nested ones too, is followed by a ':': with no more of them than names, no name is repeated
    if line.count(b":") > len(record) + len(vector) and (twice := _repeated_name(line)) is not None:
        raise ShardError(_repeated(where, doc_id, twice[0], twice[1]))
    return doc_id, vector


def _repeated_name(line: bytes) -> tuple[str, bool] | None:
    """The first name that an object of `line` gives twice, and whether that object is a nested one (the vector)
    rather than the record itself; None if none is."""
    import json

    repeats: list[str | None] = []  # per object, inner ones first: the record's own is the last

    def pairs(items: list[tuple[str, object]]) -> dict:
        names = [name for name, _ in items]
        repeats.append(_twice(names) if len(set(names)) != len(names) else None)
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # nesting that orjson takes but Python's parser does not: no verdict
        return None
    inner = next((name for name in repeats[:-1] if name is not None), None)
    if inner is not None:
        return inner, True
    return (repeats[-1], False) if repeats and repeats[-1] is not None else None


def _checked(vector: dict, where: str, doc_id: str, line_bytes: int) -> dict:
    """`vector` if Lucene can hold each of its terms, else a ShardError naming the term. A line of no more than
    MAX_TERM_BYTES holds no longer term (JSON never encodes a term in fewer bytes than UTF-8)."""
    if "" in vector or line_bytes > MAX_TERM_BYTES:
        for term in vector:
            if problem := term_problem(term):
                raise ShardError(f"{where}: record {doc_id!r} holds {problem}, which Lucene cannot index")
    return vector


def _general_doc(vector: dict, doc_id: str) -> Doc:
    text, count = _joined(vector)
    if text.count(DELIMITER) == count and text.count(SEPARATOR) == max(count - 1, 0):
        return doc_id, text, FORM, count
    form = free_form(vector)  # a term holds the separator or the delimiter
    return doc_id, _joined(vector, form)[0], form, count


_HEAD, _VECTOR = b'{"id":"', b'","contents":"","vector":{'
_DELIMITER_BYTES = DELIMITER.encode()
_TO_TEXT = bytes.maketrans(b":,", _DELIMITER_BYTES + SEPARATOR.encode())


def _fast_doc(line: bytes) -> tuple[str, str, int] | None:
    """(id, delimited text, term count) cut straight out of a line as `shards.json_vector_line` writes it, or None.

    Such a line is `{"id":"…","contents":"","vector":{"t":w,"t":w…}}`. Without a backslash no term holds a
    quote (JSON escapes it), so the vector's quotes are the terms' own: 2k - 1 after the first for k terms.
    When it also holds exactly k colons and k - 1 commas, those are the structure's and no term holds one:
    deleting the quotes and mapping `:` to the delimiter and `,` to the separator is then the text, in one pass.
    Anything else (such terms, a term with the separator or the delimiter, an empty or too long term, an impact
    ≤ 0, JSON spaced otherwise) takes the general path, which reads it exactly or refuses it. A term given twice
    is not looked for here (a set of the terms would cost a third of the pass): the builder compares the index's
    postings with the sum of the term counts, and looks for the record only when they differ.
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
            or b" " in body or b"\t" in body or b"\r" in body  # JSON spaced otherwise than the writer does
            or body.startswith(b'":') or b',"":' in body  # an empty term
            or (end > MAX_TERM_BYTES and max(map(len, body.split(b'"')[::2])) > MAX_TERM_BYTES)):
        return None
    return line[len(_HEAD):at].decode(), body.translate(_TO_TEXT, b'"').decode(), terms


def _jsonl_docs(part: ShardRange) -> Iterator[Doc]:
    path = part.path
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        for number, line in enumerate(islice(f, part.skip, part.skip + part.take), part.skip + 1):
            fast = _fast_doc(line)
            if fast is not None:
                yield fast[0], fast[1], FORM, fast[2]
                continue
            where = f"{path}:{number}"
            doc_id, vector = parse_record(line, where)
            try:
                yield _general_doc(_checked(vector, where, doc_id, len(line)), doc_id)
            except (TypeError, AttributeError) as exc:
                raise ShardError(f"{where}: not a JsonVector record ({type(exc).__name__}: {exc})") from None
        if part.skip + part.take == part.total and next(f, None) is not None:
            raise ShardError(_miscounted(part, f"more than {part.total:,}"))


def _parquet_docs(part: ShardRange) -> Iterator[Doc]:
    import pyarrow.compute as pc

    seen = 0
    shard = pq.ParquetFile(part.path)
    if shard.metadata.num_rows != part.total:
        raise ShardError(_miscounted(part, f"{shard.metadata.num_rows:,}"))
    for batch in shard.iter_batches(batch_size=4096, columns=["id", "terms", "weights"]):
        lo, hi = max(part.skip - seen, 0), min(part.skip + part.take - seen, batch.num_rows)
        first = seen + lo + 1  # the record number of the slice's first row
        seen += batch.num_rows
        if lo >= hi:
            if seen >= part.skip + part.take:
                return
            continue
        batch = batch.slice(lo, hi - lo)
        ids, terms, weights = (batch.column(i) for i in range(3))
        owner = pc.list_parent_indices(terms).to_numpy()
        flat_t, flat_w = pc.list_flatten(terms), pc.list_flatten(weights)
        odd = _odd_rows(flat_t, owner)  # rows the vectorised text cannot hold, read one by one
        keep = pc.greater(flat_w, 0)
        if not pc.all(keep).as_py():  # Anserini indexes a weight ≤ 0 as no token at all
            flat_t, flat_w, owner = flat_t.filter(keep), flat_w.filter(keep), owner[keep.to_numpy(False)]
        counts = np.bincount(owner, minlength=len(batch))
        offsets = np.zeros(len(batch) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        pairs = pc.binary_join_element_wise(flat_t, pc.cast(flat_w, pa.string()), DELIMITER)
        texts = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), pairs), SEPARATOR).to_pylist()
        for i, doc_id in enumerate(ids.to_pylist()):
            if i in odd:
                row_terms = terms[i].as_py()
                where = record_place(part.path, first + i)
                vector = dict(zip(row_terms, weights[i].as_py()))
                if len(vector) != len(row_terms):
                    raise ShardError(_repeated(where, doc_id, _twice(row_terms)))
                yield _general_doc(_checked(vector, where, doc_id, MAX_TERM_BYTES + 1), doc_id)
            else:
                yield doc_id, texts[i], FORM, int(counts[i])


def _odd_rows(flat_terms: pa.Array, owner: np.ndarray) -> set[int]:
    """The rows of a batch with a term that holds the separator or the delimiter, or is empty or too long: each is
    read on its own (and refused, but for the first kind). A term given twice is found as the jsonl one is."""
    import pyarrow.compute as pc

    if not len(flat_terms):
        return set()
    lengths = pc.binary_length(flat_terms)
    bad = pc.or_(pc.or_(pc.equal(lengths, 0), pc.greater(lengths, MAX_TERM_BYTES)),
                 pc.or_(pc.greater(pc.count_substring(flat_terms, SEPARATOR), 0),
                        pc.greater(pc.count_substring(flat_terms, DELIMITER), 0)))
    return set(owner[bad.to_numpy(False)].tolist()) if pc.any(bad).as_py() else set()


def read_joined(part: ShardRange) -> Iterator[Doc]:
    """The part's documents. A shard holding other than the manifest's count of records is refused: that count
    decides which records are indexed, so a wrong one would drop or repeat documents without a word (the checksum
    proves the file is the one encode wrote, not that the manifest's count is)."""
    n = 0
    for doc in _parquet_docs(part) if part.path.endswith(".parquet") else _jsonl_docs(part):
        n += 1
        yield doc
    if n != part.take:
        raise ShardError(_miscounted(part, f"{part.skip + n:,}"))


def _miscounted(part: ShardRange, held: str) -> str:
    return (f"{part.path}: holds {held} records where its manifest lists {part.total:,}: the manifest was edited "
            "or belongs to another encode; rerun `lsr-index encode --overwrite`")


class ShardError(Exception):
    """A record the writer cannot index; its message names the file and line."""
