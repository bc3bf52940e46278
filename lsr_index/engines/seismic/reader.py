"""Shards read in blocks of documents as arrays (ids, CSR rows of term numbers and impacts), not one dict per
document: Parquet through Arrow's dictionary encoding, JSON lines through orjson with one dictionary lookup per
term. Every impact is checked to be an integer Seismic holds exactly."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from lsr_index.engines.seismic.layout import MAX_IMPACT
from lsr_index.errors import LsrIndexError

BLOCK_DOCS = 4096


class Terms:
    """Term strings → component numbers, numbered in order of first appearance (a shard read twice, or the next
    shard, keeps the numbers already given)."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}
        self.names: list[str] = []

    def __len__(self) -> int:
        return len(self.names)

    def lookup(self, keys: list[str]) -> np.ndarray:
        get = self.numbers.get
        out = np.fromiter((get(k, -1) for k in keys), np.int64, len(keys))
        for i in np.flatnonzero(out < 0).tolist():
            key = keys[i]
            number = self.numbers.get(key)
            if number is None:
                if not isinstance(key, str):
                    raise TypeError(f"term {key!r} is not a string")
                number = self.numbers[key] = len(self.names)
                self.names.append(key)
            out[i] = number
        return out


@dataclass
class Block:
    """Documents in shard order: row i is components[indptr[i]:indptr[i+1]] (ascending) with its impacts."""

    ids: list[str]
    indptr: np.ndarray  # int64 [n + 1]
    components: np.ndarray  # int64 [nnz]
    impacts: np.ndarray  # float32 [nnz] (int64 past Seismic's range), integers in 1..max_impact


def read_blocks(path: Path, terms: Terms, block_docs: int = BLOCK_DOCS, max_impact: int = MAX_IMPACT
                ) -> Iterator[Block]:
    """The shard's documents in blocks; an unreadable record or an impact outside 1..max_impact (by default, what
    Seismic holds exactly) is one line naming the shard and the document."""
    source = _parquet(path, terms, block_docs, max_impact) if path.name.endswith(".parquet") else \
        _jsonl(path, terms, block_docs, max_impact)
    try:
        yield from source
    except OSError as exc:
        raise LsrIndexError(f"{path}: cannot read the shard: {exc}") from None


def _parquet(path: Path, terms: Terms, block_docs: int, max_impact: int) -> Iterator[Block]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(path)
        batches = source.iter_batches(batch_size=block_docs, columns=["id", "terms", "weights"])
        for batch in batches:
            ids, words, weights = (batch.column(i) for i in range(3))
            if ids.null_count or words.null_count or weights.null_count or not pa.types.is_string(ids.type):
                raise LsrIndexError(f"{path}: a record has no id, terms or weights; not a shard lsr-index wrote")
            lengths = pc.list_value_length(words).to_numpy(zero_copy_only=False).astype(np.int64)
            if not np.array_equal(lengths, pc.list_value_length(weights).to_numpy(zero_copy_only=False)):
                raise LsrIndexError(f"{path}: a record holds a different number of terms and weights")
            flat = words.flatten()
            if flat.null_count:
                raise LsrIndexError(f"{path}: a record holds a null term")
            encoded = flat.dictionary_encode()
            numbers = terms.lookup(encoded.dictionary.to_pylist())
            components = numbers[encoded.indices.to_numpy(zero_copy_only=False)]
            values = weights.flatten().to_numpy(zero_copy_only=False)
            yield _block(path, ids.to_pylist(), lengths, components, values, terms, max_impact)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise LsrIndexError(f"{path}: cannot read the shard: {type(exc).__name__}: {exc}"[:400]) from None


def _jsonl(path: Path, terms: Terms, block_docs: int, max_impact: int) -> Iterator[Block]:
    opened = gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # noqa: SIM115
    with opened as f:
        line_number = 0
        while True:
            lines = [line for _, line in zip(range(block_docs), f)]
            if not lines:
                return
            try:
                records = [orjson.loads(line) for line in lines]
                ids = [r["id"] for r in records]
                vectors = [r["vector"] for r in records]
                keys = [k for v in vectors for k in v]
                values = np.array([w for v in vectors for w in v.values()], dtype=np.float64)
                lengths = np.fromiter((len(v) for v in vectors), np.int64, len(vectors))
                if not all(isinstance(v, dict) for v in vectors):
                    raise TypeError("'vector' is not an object")
                components = terms.lookup(keys)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                where = _first_bad_line(lines) if isinstance(exc, orjson.JSONDecodeError) else None
                at = f":{line_number + where + 1}" if where is not None else \
                    f" (lines {line_number + 1}..{line_number + len(lines)})"
                raise LsrIndexError(f"{path}{at}: not a JsonVectorCollection record with an 'id' and a 'vector' of "
                                    f"term: impact ({type(exc).__name__}: {exc})"[:400]) from None
            line_number += len(lines)
            yield _block(path, ids, lengths, components, values, terms, max_impact)


def _first_bad_line(lines: list[bytes]) -> int | None:
    for i, line in enumerate(lines):
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            return i
    return None


def _block(path: Path, ids: list, lengths: np.ndarray, components: np.ndarray, values: np.ndarray,
           terms: Terms, max_impact: int) -> Block:
    """Rows sorted by component, every impact and id checked."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    bad = np.flatnonzero((values != np.rint(values)) | (values < 1) | (values > max_impact))
    if len(bad):
        at = int(bad[0])
        where = f"{path}: document {ids[rows[at]]!r} has impact {values[at]:g} for term {terms.names[components[at]]!r}"
        if max_impact == MAX_IMPACT:
            raise LsrIndexError(f"{where}: Seismic holds integer impacts from 1 to {MAX_IMPACT} exactly "
                                "(half-precision floats); encode with a lower --scale, or build the Lucene index")
        raise LsrIndexError(f"{where}: impacts are integers from 1 to {max_impact:,}")
    for doc_id in ids:
        if not isinstance(doc_id, str):
            raise LsrIndexError(f"{path}: document id {doc_id!r} is not a string")
    order = np.lexsort((components, rows))
    components, values = components[order], values[order]
    repeated = np.flatnonzero((np.diff(components) == 0) & (np.diff(rows) == 0))
    if len(repeated):
        at = int(repeated[0])
        raise LsrIndexError(f"{path}: document {ids[rows[at]]!r} lists term {terms.names[components[at]]!r} twice")
    indptr = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return Block(ids, indptr, components, values.astype(np.float32 if max_impact <= MAX_IMPACT else np.int64))
