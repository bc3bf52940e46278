"""Inputs a reader could take for something else without a word: each is read as written, or refused with its file
and line."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os

import orjson
import pytest

from lsr_index.errors import InputError
from lsr_index.inputs.corpus import CorpusReader, Fields, FieldsError
from lsr_index.inputs.topics import read_qrels, read_queries
from tests.cli_runner import run_cli

BOM = b"\xef\xbb\xbf"


def read(reader: CorpusReader) -> list[tuple[str, str]]:
    return [pair for batch in reader for pair in zip(*batch.to_pydict().values(), strict=True)]


@pytest.mark.parametrize("line, field", [
    (b'{"id": "d1", "id": "d2", "text": "a"}', "id"),
    (b'{"_id": "d1", "text": "a", "text": "b"}', "text"),
    (b'{"id": "d1", "title": "t", "text": "a", "title": "u"}', "title"),
])
def test_a_record_naming_its_id_or_text_field_twice_is_refused(tmp_path, line, field):
    """A JSON parser keeps the last value: {"id": "d1", "id": "d2"} would silently be document d2."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "d0", "text": "ok"}\n\n' + line + b"\n")
    with pytest.raises(InputError, match=f"c.jsonl:3: field '{field}' appears more than once"):
        read(CorpusReader(path))
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("d0", "ok")]
    reason = f"field '{field}' appears more than once in the object"
    assert [(s.where, s.doc_id, s.reason) for s in reader.skipped] == [(3, None, reason)]


def test_repeated_names_elsewhere_are_not_a_problem(tmp_path):
    """Only the fields read count: a nested object, another field, or the name inside a text are fine."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "d1", "text": "id", "meta": {"id": 1, "id": 2}, "x": 1, "x": 2}\n'
                     b'{"id": "d2", "text": "say \\"id\\": no", "title": "text"}\n')
    assert read(CorpusReader(path)) == [("d1", "id"), ("d2", 'text say "id": no')]


def test_a_repeated_configured_field_is_refused_and_listed_by_encode(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"docno": "a", "body": "one"}\n{"docno": "b", "body": "two", "body": "three"}\n'
                      '{"docno": "c", "body": "four"}\n')
    out = tmp_path / "v"
    result = run_cli("encode", str(corpus), "-o", str(out), "--doc-max-length", "16", "--id-field", "docno",
                     "--text-field", "body", "--on-error", "skip", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert "skipped 1 bad record(s)" in result.stderr
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert skipped == [{"file": str(corpus), "line": 2, "id": None,
                        "reason": "field 'body' appears more than once in the object"}]
    assert json.loads((out / "manifest.json").read_text())["skipped"] == 1


def test_a_text_field_named_twice_is_refused():
    """--text-field body --text-field body would double every document's text."""
    with pytest.raises(FieldsError, match="named twice"):
        Fields(text=("body", "body"))


def test_a_line_over_the_limit_is_refused_even_when_its_start_is_valid_json(tmp_path):
    """The first 64 MiB (an object, then spaces) parse on their own: cut there, the rest would be read as the next
    line."""
    limit = 64 << 20
    head = b'{"id": "a", "text": "x"}'
    path = tmp_path / "c.jsonl"
    with path.open("wb") as f:
        f.write(head + b" " * (limit - len(head) + 10) + b'{"id": "b", "text": "y"}\n{"id": "c", "text": "z"}\n')
    with pytest.raises(InputError, match=f"c.jsonl:1: line longer than {limit} bytes"):
        read(CorpusReader(path))
    reader = CorpusReader(path, on_error="skip")
    assert read(reader) == [("c", "z")]
    assert [s.where for s in reader.skipped] == [1]


def test_a_hard_link_to_a_listed_file_is_refused_as_listed_twice(tmp_path):
    """Read twice, every record of the second copy would be a duplicate id (all of them listed as skipped)."""
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "x"}\n')
    os.link(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    with pytest.raises(InputError, match=r"b.jsonl: this file is listed twice \(also as .*a.jsonl\)"):
        CorpusReader(tmp_path)


@pytest.mark.parametrize("name, content", [
    ("q.tsv", b"q1\tone\n" + BOM + b"q2\ttwo\n"),
    ("q.tsv.gz", gzip.compress(BOM + b"q1\tone\n", mtime=0) + gzip.compress(BOM + b"q2\ttwo\n", mtime=0)),
])
def test_a_byte_order_mark_inside_a_queries_file_is_refused(tmp_path, name, content):
    """Two files joined (cat a.tsv b.tsv): the query id would be '\\ufeffq2', matching no judgment, silently."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError, match=f"{name}:2: a byte-order mark"):
        read_queries(path)


def test_a_byte_order_mark_inside_a_qrels_file_is_refused(tmp_path):
    path = tmp_path / "qrels.txt"
    path.write_bytes(BOM + b"q1 0 d1 1\n" + BOM + b"q2 0 d2 1\n")
    with pytest.raises(InputError, match=r"qrels\.txt:2: a byte-order mark"):
        read_qrels(path)


def test_a_query_record_naming_its_id_twice_is_refused(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"_id": "q1", "text": "one"}\n{"_id": "q2", "_id": "q3", "text": "two"}\n')
    with pytest.raises(InputError, match=r"q\.jsonl:2: field '_id' appears more than once"):
        read_queries(path)


@pytest.mark.parametrize("line, reason", [
    (b"q\x011 0 d1 1", r"query id 'q\\x011' contains a control character"),
    (b"q1 0 d\x001 1", r"document id 'd\\x001' contains a control character"),
    (b"q1 0 " + b"x" * 40000 + b" 1", "document id 'x+…' is 40,000 UTF-8 bytes"),
])
def test_a_qrels_id_no_query_or_document_can_have_is_refused(tmp_path, line, reason):
    """Judged but never retrievable: the query (or its relevant document) would score 0 without a word."""
    path = tmp_path / "qrels.txt"
    path.write_bytes(b"q0 0 d0 1\n" + line + b"\n")
    with pytest.raises(InputError, match=f"qrels.txt:2: {reason}"):
        read_qrels(path)


def zstd(data: bytes) -> bytes:
    return pytest.importorskip("zstandard").ZstdCompressor().compress(data)


@pytest.mark.parametrize("suffix, compress", [(".bz2", bz2.compress), (".xz", lzma.compress), (".zst", zstd)])
def test_queries_and_qrels_compressed_as_the_corpus_may_be_are_read(tmp_path, suffix, compress):
    """Decompressed by their suffix: read as plain text they would fail ('invalid UTF-8 at byte 12'), and
    queries.jsonl.bz2 would be taken for a TSV."""
    tsv, jsonl, qrels = (tmp_path / f"{name}{suffix}" for name in ("q.tsv", "q.jsonl", "qrels.txt"))
    tsv.write_bytes(compress(b"q1\tone\nq2\ttwo\n"))
    jsonl.write_bytes(compress(orjson.dumps({"_id": "q1", "text": "one"}) + b"\n"))
    qrels.write_bytes(compress(b"q1 0 d1 1\n"))
    assert read_queries(tsv) == [("q1", "one"), ("q2", "two")]
    assert read_queries(jsonl) == [("q1", "one")]
    assert read_qrels(qrels) == {"q1": {"d1": 1}}


def test_bytes_after_a_compressed_queries_stream_are_refused(tmp_path):
    path = tmp_path / "q.tsv.bz2"
    path.write_bytes(bz2.compress(b"q1\tone\n") + b"garbage")
    with pytest.raises(InputError, match="cannot read: compressed data is truncated or corrupt after line 1"):
        read_queries(path)
