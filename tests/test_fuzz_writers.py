"""Property tests for the output side: whatever goes into a shard comes back out exactly, in every format,
and the quantizer agrees with a plain NumPy reference on any non-negative weight matrix."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lsr_index.errors import LsrIndexError
from lsr_index.vectors.quantize import Quantization, SparseVectors, quantize
from lsr_index.vectors.shards import FORMATS, ShardWriter, _fast_doc, _joined, json_vector_line, read_shard

# FUZZ_EXAMPLES=2000 for a long local run; CI keeps it short
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 60)), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
INT32_MAX = 2**31 - 1

# --- shards: write, read back ------------------------------------------------------------------------

doc_ids = st.text(min_size=1, max_size=24).filter(lambda s: "\n" not in s and "\r" not in s)
# Terms as Lucene can index them: non-empty (check_vocab enforces it); whitespace and controls are terms' own.
terms = st.text(min_size=1, max_size=8)
vocabs = st.lists(terms, min_size=1, max_size=40, unique=True)


@st.composite
def shard_contents(draw):
    """A vocabulary and batches of (id, {term id: impact}) records, as the encoder hands them over."""
    vocab = draw(vocabs)
    vector = st.dictionaries(st.integers(0, len(vocab) - 1), st.integers(1, INT32_MAX), max_size=len(vocab))
    batches = draw(st.lists(st.lists(st.tuples(doc_ids, vector), max_size=12), min_size=1, max_size=4))
    return vocab, batches


def _csr(records: list[tuple[str, dict[int, int]]]) -> SparseVectors:
    indptr = np.zeros(len(records) + 1, np.int64)
    np.cumsum([len(v) for _, v in records], out=indptr[1:])
    rows = [sorted(v.items()) for _, v in records]  # terms ascend within a row, as the quantizer gives them
    return SparseVectors(indptr, np.array([t for r in rows for t, _ in r], np.int32),
                         np.array([w for r in rows for _, w in r], np.int32))


@FUZZ
@given(contents=shard_contents(), fmt=st.sampled_from(FORMATS))
def test_a_shard_reads_back_exactly_what_was_written(contents, fmt):
    vocab, batches = contents
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        writer = ShardWriter(root / f"part-00000.{fmt}", fmt, np.array(vocab, dtype=object))
        for batch in batches:
            writer.add([doc for doc, _ in batch], _csr(batch))
        writer.finish()
        expected = [(doc, {vocab[t]: w for t, w in sorted(v.items())}) for batch in batches for doc, v in batch]
        got = list(read_shard(root / f"part-00000.{fmt}"))
        assert got == expected
        assert [list(v) for _, v in got] == [list(v) for _, v in expected]  # term order too
        assert writer.docs == len(expected) and writer.nonzeros == sum(len(v) for _, v in expected)
        assert sorted(p.name for p in root.iterdir()) == [f"part-00000.{fmt}"]  # no temporary file left


@FUZZ
@given(contents=shard_contents())
def test_parquet_needs_nothing_but_pyarrow(contents):
    """Plain pyarrow sees id: string, terms: list<string>, weights: list<int32>, and the same records."""
    vocab, batches = contents
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "part-00000.parquet"
        writer = ShardWriter(path, "parquet", np.array(vocab, dtype=object))
        for batch in batches:
            writer.add([doc for doc, _ in batch], _csr(batch))
        writer.finish()
        table = pq.read_table(path)
        assert table.schema.names == ["id", "terms", "weights"]
        assert table.schema.field("id").type == pa.string()
        assert table.schema.field("terms").type == pa.list_(pa.string())
        assert table.schema.field("weights").type == pa.list_(pa.int32())
        records = [(doc, sorted(v.items())) for batch in batches for doc, v in batch]
        assert table.column("id").to_pylist() == [doc for doc, _ in records]
        assert table.column("terms").to_pylist() == [[vocab[t] for t, _ in r] for _, r in records]
        assert table.column("weights").to_pylist() == [[w for _, w in r] for _, r in records]


def test_parquet_reads_in_a_process_without_lsr_index(tmp_path):
    path = tmp_path / "part-00000.parquet"
    writer = ShardWriter(path, "parquet", np.array(["a", "b##", "ü"], dtype=object))
    writer.add(["d1", "d 2"], SparseVectors(np.array([0, 2, 3]), np.array([0, 2, 1], np.int32),
                                             np.array([7, INT32_MAX, 1], np.int32)))
    writer.finish()
    script = ("import sys, pyarrow.parquet as pq; t = pq.read_table(sys.argv[1]); "
              "assert 'lsr_index' not in sys.modules; print(t.schema.to_string(show_schema_metadata=False)); "
              "print(t.to_pylist())")
    done = subprocess.run([sys.executable, "-I", "-c", script, str(path)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "id: string" in done.stdout and "weights: list<element: int32>" in done.stdout.replace("item", "element")
    assert done.stdout.splitlines()[-1] == str([{"id": "d1", "terms": ["a", "ü"], "weights": [7, INT32_MAX]},
                                                {"id": "d 2", "terms": ["b##"], "weights": [1]}])


# --- quantizer against NumPy -------------------------------------------------------------------------

# Non-negative float32 weights whose impacts fit int32 (see test_impacts_beyond_int32_are_not_wrapped).
SCALES = st.sampled_from([1.0, 51.2, 100.0, 256.0, 1000.0])
matrices = st.integers(1, 6).flatmap(lambda n: st.integers(1, 40).flatmap(lambda v: arrays(
    np.float32, (n, v), elements=st.one_of(
        st.just(0.0), st.floats(0, 0.0625, width=32), st.floats(0, 20, width=32), st.sampled_from([0.005, 0.5, 1.5]),
        st.floats(0, 2e6, width=32)))))


def _reference(w: np.ndarray, q: Quantization) -> list[dict[int, int]]:
    """round(w · scale) in float32 with zeros dropped; top-k ties are settled by `_check_topk`."""
    w = np.where(w >= np.float32(q.min_weight), w, np.float32(0))
    impacts = np.round(w * np.float32(q.scale))
    return [{int(i): int(row[i]) for i in np.flatnonzero(row)} for row in impacts]


def _check_topk(w: np.ndarray, q: Quantization, got: list[dict[int, int]]) -> None:
    """Keep the k largest: everything above the k-th value, none below, and as many of the tied as fit."""
    full = _reference(w, Quantization(scale=q.scale, min_weight=q.min_weight))
    for row, kept, everything in zip(np.where(w >= np.float32(q.min_weight), w, np.float32(0)), got, full):
        k = min(q.top_k, len(row))
        kth = np.sort(row)[::-1][k - 1]
        above = {i: v for i, v in everything.items() if row[i] > kth}
        tied = {i: v for i, v in everything.items() if row[i] == kth}
        assert {i: v for i, v in kept.items() if row[i] > kth} == above
        assert all(row[i] >= kth for i in kept)
        tied_kept = {i: v for i, v in kept.items() if row[i] == kth}
        assert tied_kept.items() <= tied.items()
        if tied:  # impacts of tied weights are equal and nonzero, so exactly the free slots are used
            assert len(tied_kept) == min(len(tied), k - int((row > kth).sum()))


@FUZZ
@given(w=matrices, scale=SCALES, top_k=st.one_of(st.none(), st.integers(1, 45)),
       min_weight=st.sampled_from([0.0, 0.0, 0.01, 0.5, 1.0]))
def test_quantize_equals_numpy(w, scale, top_k, min_weight):
    w = np.minimum(w, np.float32(INT32_MAX / 2 / scale))  # keep impacts inside int32 (see below)
    q = Quantization(scale=scale, top_k=top_k, min_weight=min_weight)
    v = quantize(torch.from_numpy(w.copy()), q)
    got = [dict(zip(*(a.tolist() for a in v.row(i)))) for i in range(len(v))]
    assert v.indptr.dtype == np.int64 and v.terms.dtype == np.int32 and v.weights.dtype == np.int32
    assert len(v) == w.shape[0] and (v.weights > 0).all()
    assert all(np.all(np.diff(v.row(i)[0]) > 0) for i in range(len(v)))  # terms ascend within a row
    if top_k is None or top_k >= w.shape[1]:
        assert got == _reference(w, q)
    else:
        assert all(len(row) <= top_k for row in got)
        _check_topk(w, q, got)


def test_impacts_beyond_int32_or_non_finite_are_refused_not_wrapped():
    for weights in ([[3e7, 1.0]], [[float("nan"), 1.0]], [[float("inf"), 0.0]]):
        with pytest.raises(LsrIndexError, match="overflow int32"):
            quantize(torch.tensor(weights), Quantization(scale=100.0))


# --- the direct builder's fast path: the text it cuts out of a line equals the parsed line's ----------------

_TERM_CHARS = st.sampled_from(list(':,"\\\x01-0 }{[]ab\u00e9\U0001F600\t\n'))
_TERMS = st.text(alphabet=_TERM_CHARS, max_size=6) | st.text(max_size=4)
_WEIGHTS = st.integers(min_value=-3, max_value=2**63 - 1) | st.sampled_from([0, 1, 10, -1])


def _parsed(line: bytes) -> tuple[str, str, int]:
    record = orjson.loads(line)
    return record["id"], *_joined(record["vector"])


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=_TERM_CHARS, max_size=6), st.dictionaries(_TERMS, _WEIGHTS, max_size=6),
       st.sampled_from(["", " ", "\r\n", "\t"]), st.sampled_from([",", ", ", " ,", ",\t", "\r,"]),
       st.sampled_from([":", ": ", " :", ":\t"]))
def test_the_fast_path_cuts_the_text_the_parser_reads_or_declines(doc_id, vector, tail, comma, colon):
    """As `json_vector_line` writes a line, and spaced otherwise: the fast path returns the general path's
    (id, text, term count) or None, never another text (terms with quotes, colons, commas, the separator, the
    delimiter, an empty term; impacts ≤ 0)."""
    line = json_vector_line(doc_id, vector)
    for candidate in (line, _respaced(line, tail, comma, colon)):
        fast = _fast_doc(candidate)
        assert fast is None or fast == _parsed(candidate), (candidate, fast)
    # declined only for an escape (a quote, backslash or control character), a term holding ':', ',', a space or
    # the delimiter, an empty term, an impact ≤ 0, or an empty vector
    assert _fast_doc(line) is not None or b"\\" in line or not vector or "" in vector or any(
        c in t for t in vector for c in ':, \x01') or min(vector.values()) <= 0, line


def _respaced(line: bytes, tail: str, comma: str, colon: str) -> bytes:
    head, _, body = line.rstrip(b"\n").partition(b'"vector":{')
    body = body.replace(b'":', b'"' + colon.encode()).replace(b',"', comma.encode() + b'"')
    return head + b'"vector":{' + body + tail.encode()


def test_an_empty_gzip_shard_is_still_a_gzip_file(tmp_path):
    """Serialized in blocks: no documents must still make one (empty) gzip member, not a zero-byte .gz."""
    import gzip

    import numpy as np

    from lsr_index.vectors.quantize import SparseVectors
    from lsr_index.vectors.shards import ShardWriter

    writer = ShardWriter(tmp_path / "part-00000.jsonl.gz", "jsonl.gz", np.array(["a"], dtype=object))
    writer.add([], SparseVectors(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)))
    writer.finish()
    data = (tmp_path / "part-00000.jsonl.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data) == b""
