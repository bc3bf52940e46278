"""Vector shards on disk: Anserini JsonVectorCollection (.jsonl / .jsonl.gz) or Parquet (id, terms, weights).

A shard is written under a temporary name and renamed only once complete and fsynced, so a crash
never leaves a file that looks finished; its checksum then goes into the manifest.
"""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import LsrIndexError
from .manifest import Manifest, Shard, fsync_directory, os_cause
from .models import sha256_file
from .quantize import SparseVectors

FORMATS = ("jsonl", "jsonl.gz", "parquet")
PARQUET_SCHEMA = pa.schema([("id", pa.string()), ("terms", pa.list_(pa.string())),
                            ("weights", pa.list_(pa.int32()))])


def check_vocab(vocab: Sequence[str]) -> None:
    """Lucene's pretokenized analyzer splits on whitespace, so such a term would index as several."""
    bad = [t for t in vocab if not t or any(c.isspace() for c in t)]
    if bad:
        raise LsrIndexError(f"the model's vocabulary has {len(bad)} empty or whitespace-containing terms "
                            f"(e.g. {bad[0]!r}) that Lucene cannot index as one term")


def json_vector_line(doc_id: str, vector: dict[str, int]) -> bytes:
    """One Anserini JsonVectorCollection record (the format of jsonl shards and of what `build` indexes)."""
    return orjson.dumps({"id": doc_id, "contents": "", "vector": vector}) + b"\n"


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


_worker_vocab: np.ndarray | None = None


def serializer_init(vocab: list[str]) -> None:
    """Process-pool initializer: the vocabulary is sent once per worker, not with every chunk."""
    global _worker_vocab
    _worker_vocab = np.array(vocab, dtype=object)


def serialize_in_worker(ids: Sequence[str], vectors: SparseVectors, fmt: str) -> bytes:
    return serialize(ids, vectors, _worker_vocab, fmt)


class ShardWriter:
    """One shard open for appending; `finish` publishes it, `abort` removes the partial file.

    Any OSError (disk full, quota, file too large, I/O error) becomes an LsrIndexError naming the shard and
    the cause, and the partial file is removed at once: nothing half-written is ever left under a final name.
    """

    def __init__(self, path: Path, fmt: str, vocab: np.ndarray):
        if fmt not in FORMATS:
            raise LsrIndexError(f"unknown output format {fmt!r}: choose one of {', '.join(FORMATS)}")
        self.path, self.fmt, self.vocab = path, fmt, vocab
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.docs = self.nonzeros = 0
        self._raw = self._sink = None
        self._open = True
        try:
            if fmt == "parquet":
                self._arrow_vocab = pa.array(vocab.tolist(), pa.string())
                self._sink = pq.ParquetWriter(self.tmp, PARQUET_SCHEMA, compression="zstd")
            else:  # JSON lines; .gz as a run of independent gzip members (one per chunk) — a valid gzip file
                self._raw = open(self.tmp, "wb")  # noqa: SIM115 (lives until finish/abort, not a block)
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> NoReturn:
        self.abort()
        raise LsrIndexError(f"{self.path}: cannot write the shard: {os_cause(exc)}; the partial shard was removed "
                            "and is not in the manifest (free some space if the disk is full, then rerun the same "
                            "command to continue after the last complete shard)") from exc

    def add(self, ids: Sequence[str], vectors: SparseVectors) -> None:
        if self.fmt == "parquet":
            self._write(len(ids), vectors.nnz, lambda: self._sink.write_batch(self._record_batch(ids, vectors)))
        else:
            self.add_serialized(serialize(ids, vectors, self.vocab, self.fmt), len(ids), vectors.nnz)

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

    def finish(self, start: int, root: Path) -> Shard:
        """Publish the shard; `root` is the manifest's directory, which shard paths are relative to."""
        if not self._open:
            raise LsrIndexError(f"{self.path}: the shard writer is closed")
        try:
            self._close()  # flushes: a full disk can show up only here
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
            sha = sha256_file(self.tmp)
            os.replace(self.tmp, self.path)
            fsync_directory(self.path.parent)
        except OSError as exc:
            self._fail(exc)
        return Shard(file=self.path.relative_to(root).as_posix(), start=start, docs=self.docs,
                     nonzeros=self.nonzeros, sha256=sha)

    def abort(self) -> None:
        """Drop the partial shard; safe to call twice, and never raises over the error that led here."""
        try:
            with contextlib.suppress(Exception):  # a stream that failed may fail again on close
                self._close()
        finally:
            with contextlib.suppress(OSError):
                self.tmp.unlink(missing_ok=True)


def verify_shards(directory: Path, manifest: Manifest) -> None:
    """Refuse to use a vectors directory whose shards are missing, truncated, altered or do not tile."""
    expected = 0
    for shard in sorted(manifest.shards, key=lambda s: s.start):
        if shard.start != expected:
            raise LsrIndexError(f"{directory / 'manifest.json'}: the shards do not cover documents "
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
            raise LsrIndexError(f"{path}: checksum mismatch against {directory / 'manifest.json'} "
                                "(the shard is corrupted or truncated; re-encode it)")


def read_shard(path: Path) -> Iterator[tuple[str, dict[str, int]]]:
    """Read back (id, {term: impact}) from any shard format; for conversion, checks and tests."""
    if path.name.endswith(".parquet"):
        for batch in pq.ParquetFile(path).iter_batches():
            for doc_id, terms, weights in zip(*(batch.column(i).to_pylist() for i in range(3))):
                yield doc_id, dict(zip(terms, weights))
        return
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
        for line in f:
            record = orjson.loads(line)
            yield record["id"], record["vector"]
