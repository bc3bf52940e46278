"""Export a vectors directory to CIFF, the Common Index File Format (Lin et al., 2020; github.com/osirrc/ciff), which
PISA (ciff2pisa), Terrier, JASS and others import: every engine that reads it gets the same integer impacts.

A CIFF file is a sequence of length-delimited protobuf messages: one Header, one PostingsList per term (terms in
UTF-8 byte order, as Lucene's exporter writes them), one DocRecord per document. A posting's `tf` is the document's
impact for the term and its `docid` the gap from the previous posting of the list (the first one absolute);
document k is the k-th of the shards in manifest order, and its DocRecord carries its id and its length as the sum
of its impacts (what a fake-word index counts). The protobuf wire format is written here directly (varints and
length prefixes, vectorized with numpy): no protobuf package is needed.

The shards are inverted in memory: in one reading when `memory` holds about 20 bytes per posting, else in a reading
for the vocabulary and one per range of terms that fits.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lsr_index.engines.seismic.reader import Terms, read_blocks
from lsr_index.errors import LsrIndexError
from lsr_index.runtime.durable import create_new, write_error
from lsr_index.runtime.progress import bar
from lsr_index.vectors.manifest import Manifest

INT32_MAX = 2**31 - 1
_BYTES_PER_POSTING = 20


def export_ciff(vectors: Path, out: Path, *, memory: int = 4 << 30, description: str | None = None,
                progress: bool = False) -> dict:
    """Write `vectors` (an encode output, complete) as the CIFF file `out`, published whole or not at all; what
    was written (counts, passes over the shards, bytes)."""
    manifest = Manifest.load(vectors)
    if not manifest.complete:
        raise LsrIndexError(f"{vectors}: the encoding is incomplete; rerun `lsr-index encode` to finish it")
    if manifest.docs > INT32_MAX:
        raise LsrIndexError(f"{vectors}: {manifest.docs:,} documents; CIFF numbers them in 32 bits")
    paths = [vectors / shard.file for shard in manifest.shards]
    passes = max(1, -(-manifest.nonzeros * _BYTES_PER_POSTING // max(memory, 1)))
    terms, docs = Terms(), _Documents()
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with bar(progress, total=(passes + (passes > 1)) * manifest.docs, unit=" doc",
                 desc=f"export CIFF ({passes} term range{'s' if passes > 1 else ''})") as shown:
            # the first reading: the vocabulary and the documents (and, in one range, every posting)
            whole = _read(paths, terms, shown, docs=docs, keep=passes == 1)
            passes = min(passes, max(1, len(terms)))
            ranks = _ranks(terms)
            tmp.unlink(missing_ok=True)  # left by a killed export
            with open(create_new(tmp), "wb") as f:
                f.write(_header(len(terms), docs.count, docs.total, description or
                                f"lsr-index vectors ({manifest.model.name}, impacts at scale "
                                f"{manifest.quantization.scale}): tf = impact, doclength = sum of impacts"))
                for p in range(passes):
                    if passes > 1:
                        low, high = p * len(ranks) // passes, (p + 1) * len(ranks) // passes
                        whole = _read(paths, terms, shown, ranks=ranks, low=low, high=high)
                    _write_lists(f, terms, ranks, *whole)
                for chunk in docs.records():
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(out, exc, "write the CIFF file") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"file": str(out), "documents": docs.count, "postings_lists": len(terms), "postings": manifest.nonzeros,
            "passes": passes, "bytes": out.stat().st_size}


def _read(paths: list[Path], terms: Terms, shown, docs: _Documents | None = None, keep: bool = True,
          ranks: np.ndarray | None = None, low: int = 0, high: int = 0) -> tuple[np.ndarray, ...]:
    """One reading of the shards: (term numbers, documents, impacts) of the postings kept, in document order."""
    kept: list[tuple[np.ndarray, ...]] = []
    start = 0
    for path in paths:
        for block in read_blocks(path, terms, max_impact=INT32_MAX):
            if docs is not None:
                docs.add(block)
            if keep:
                rows = np.repeat(np.arange(start, start + len(block.ids), dtype=np.int64), np.diff(block.indptr))
                numbers, impacts = block.components, block.impacts
                if ranks is not None:
                    inside = (ranks[numbers] >= low) & (ranks[numbers] < high)
                    numbers, rows, impacts = numbers[inside], rows[inside], impacts[inside]
                kept.append((numbers, rows, impacts))
            start += len(block.ids)
            shown.update(len(block.ids))
    if not kept:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return tuple(np.concatenate(column) for column in zip(*kept))


def _ranks(terms: Terms) -> np.ndarray:
    """Each term number's position in UTF-8 byte order."""
    order = sorted(range(len(terms)), key=lambda n: terms.names[n].encode("utf-8", "surrogatepass"))
    ranks = np.empty(len(order), np.int64)
    ranks[order] = np.arange(len(order))
    return ranks


class _Documents:
    """DocRecords: each document's id and length, in shard order."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.lengths: list[np.ndarray] = []
        self.total = 0

    def add(self, block) -> None:
        self.ids.extend(block.ids)
        running = np.zeros(len(block.impacts) + 1, np.int64)
        np.cumsum(block.impacts, out=running[1:])
        sums = running[block.indptr[1:]] - running[block.indptr[:-1]]
        self.lengths.append(sums)
        self.total += int(sums.sum())

    @property
    def count(self) -> int:
        return len(self.ids)

    def records(self) -> Iterator[bytes]:
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        if len(lengths) and lengths.max() > INT32_MAX:
            raise LsrIndexError("a document's length (sum of its impacts) exceeds CIFF's 32 bits")
        for lo in range(0, len(self.ids), 65536):
            parts = []
            for k in range(lo, min(lo + 65536, len(self.ids))):
                body = (_field_varint(1, k) + _field_bytes(2, self.ids[k].encode("utf-8", "surrogatepass"))
                        + _field_varint(3, int(lengths[k])))
                parts.append(_varint(len(body)) + body)
            yield b"".join(parts)


def _write_lists(f, terms: Terms, ranks: np.ndarray, numbers: np.ndarray, docs: np.ndarray,
                 impacts: np.ndarray) -> None:
    """The PostingsLists of the terms given, in rank order."""
    if not len(numbers):
        return
    if impacts.max() > INT32_MAX:
        raise LsrIndexError("an impact exceeds CIFF's 32-bit tf")
    order = np.argsort(ranks[numbers], kind="stable")  # stable: documents stay ascending within a term
    numbers, docs, impacts = numbers[order], docs[order], impacts[order].astype(np.int64)
    starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])
    ends = np.r_[starts[1:], len(numbers)]
    gaps = docs.copy()
    gaps[1:] -= docs[:-1]
    gaps[starts] = docs[starts]
    postings = _postings(gaps, impacts)  # every posting's bytes, and where each one ends
    blob, bounds = postings
    for s, e in zip(starts.tolist(), ends.tolist()):
        term = terms.names[int(numbers[s])].encode("utf-8", "surrogatepass")
        cf = int(impacts[s:e].sum())
        head = _field_bytes(1, term) + _field_varint(2, e - s) + _field_varint(3, cf)
        body = blob[bounds[s]:bounds[e]]
        f.write(_varint(len(head) + len(body)) + head + body)


def _postings(gaps: np.ndarray, tfs: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Each posting as field 4 of its PostingsList: 0x22, length, [0x08 gap varint] (omitted when 0, as proto3
    writes it), 0x10 tf varint. The bytes of all of them, and the offset where posting i starts (n + 1)."""
    gap_len = _varint_lengths(gaps)
    tf_len = _varint_lengths(tfs)
    has_gap = gaps != 0
    inner = np.where(has_gap, 1 + gap_len, 0) + 1 + tf_len  # < 128: one length byte
    sizes = 2 + inner
    bounds = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=bounds[1:])
    out = np.zeros(int(bounds[-1]), np.uint8)
    at = bounds[:-1].copy()
    out[at] = 0x22
    out[at + 1] = inner
    at += 2
    out[at[has_gap]] = 0x08
    at[has_gap] += 1
    _put_varints(out, at[has_gap], gaps[has_gap], gap_len[has_gap])
    at[has_gap] += gap_len[has_gap]
    out[at] = 0x10
    _put_varints(out, at + 1, tfs, tf_len)
    return out.tobytes(), bounds


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.uint64)
    length = np.ones(len(values), np.int64)
    for k in range(1, 10):
        length += values >= np.uint64(1 << (7 * k))
    return length


def _put_varints(out: np.ndarray, at: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    values = values.astype(np.uint64)
    for k in range(int(lengths.max()) if len(lengths) else 0):
        live = lengths > k
        byte = (values[live] >> np.uint64(7 * k)) & np.uint64(0x7F)
        byte |= np.where(lengths[live] > k + 1, np.uint64(0x80), np.uint64(0))
        out[at[live] + k] = byte.astype(np.uint8)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value if value else b""


def _header(lists: int, docs: int, total: int, description: str) -> bytes:
    body = (_field_varint(1, 1) + _field_varint(2, lists) + _field_varint(3, docs) + _field_varint(4, lists)
            + _field_varint(5, docs) + _field_varint(6, total)
            + (_varint(7 << 3 | 1) + struct.pack("<d", total / docs) if docs and total else b"")
            + _field_bytes(8, description.encode()))
    return _varint(len(body)) + body
