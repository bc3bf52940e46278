"""Vector shards on disk: Anserini JsonVectorCollection (.jsonl / .jsonl.gz) or Parquet (id, terms, weights).

A shard is written under a temporary name and renamed only once complete and fsynced, so a crash
never leaves a file that looks finished; its checksum then goes into the manifest.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import LsrIndexError
from .manifest import Manifest, Shard
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


class ShardWriter:
    """One shard open for appending; `finish` publishes it, `abort` removes the partial file."""

    def __init__(self, path: Path, fmt: str, vocab: np.ndarray):
        if fmt not in FORMATS:
            raise LsrIndexError(f"unknown output format {fmt!r}: choose one of {', '.join(FORMATS)}")
        self.path, self.fmt, self.vocab = path, fmt, vocab
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.docs = self.nonzeros = 0
        if fmt == "parquet":
            self._arrow_vocab = pa.array(vocab.tolist(), pa.string())
            self._sink = pq.ParquetWriter(self.tmp, PARQUET_SCHEMA, compression="zstd")
        else:  # gzip level 1: most of gzip's size saving for the least CPU on the hot path
            self._raw = open(self.tmp, "wb")  # noqa: SIM115 (lives until finish/abort, not a block)
            self._sink = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=1, mtime=0) \
                if fmt == "jsonl.gz" else self._raw

    def add(self, ids: Sequence[str], vectors: SparseVectors) -> None:
        if self.fmt == "parquet":
            offsets = pa.array(vectors.indptr.astype(np.int32))
            terms = pa.ListArray.from_arrays(offsets, self._arrow_vocab.take(pa.array(vectors.terms)))
            weights = pa.ListArray.from_arrays(offsets, pa.array(vectors.weights, pa.int32()))
            self._sink.write_batch(pa.record_batch([pa.array(ids, pa.string()), terms, weights],
                                                   schema=PARQUET_SCHEMA))
        else:
            words = self.vocab[vectors.terms].tolist()
            weights = vectors.weights.tolist()
            bounds = vectors.indptr.tolist()
            self._sink.write(b"".join(
                orjson.dumps({"id": doc_id, "contents": "",
                              "vector": dict(zip(words[lo:hi], weights[lo:hi]))}) + b"\n"
                for doc_id, lo, hi in zip(ids, bounds[:-1], bounds[1:])))
        self.docs += len(ids)
        self.nonzeros += vectors.nnz

    def _close(self) -> None:
        self._sink.close()
        if self.fmt != "parquet":
            self._raw.close()

    def finish(self, start: int, root: Path) -> Shard:
        """Publish the shard; `root` is the manifest's directory, which shard paths are relative to."""
        self._close()
        with open(self.tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(self.tmp, self.path)
        return Shard(file=self.path.relative_to(root).as_posix(), start=start, docs=self.docs, nonzeros=self.nonzeros,
                     sha256=sha256_file(self.path))

    def abort(self) -> None:
        try:
            self._close()
        finally:
            self.tmp.unlink(missing_ok=True)


def verify_shards(directory: Path, manifest: Manifest) -> None:
    """Refuse to use a vectors directory whose shards are missing, truncated or altered."""
    for shard in manifest.shards:
        path = directory / shard.file
        if not path.is_file():
            raise LsrIndexError(f"{path}: shard listed in the manifest is missing")
        if sha256_file(path) != shard.sha256:
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
